// nl-layout report: one self-contained HTML page (images inlined as base64 PNG) showing, per chosen layer,
// co-activation heatmaps of the neurons in original order and in each layout's order, a histogram of read
// lengths per layout, and the held-out eval table (layout/evaluate.h: the figures nl-layout eval prints).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "formats/core/bitmask.h"
#include "layout/evaluate.h"

namespace nl {

class Progress;

struct ReportOptions {
  std::string trace;                 // held-out trace (trace v1)
  std::vector<std::string> layouts;  // layout JSON files
  std::vector<uint32_t> layers;      // layers drawn (the eval table covers every layer)
  EvalConfig eval;                   // bundle_bytes 0 = from each layer's width
  uint32_t pixels = 512;             // heatmap side (capped at the layer width)
};

// Co-activation counts summed over blocks: with the neurons laid out in `order` (slot -> neuron) and slots
// split into `pixels` equal blocks, out[I * pixels + J] counts (token, neuron i, neuron j != i) with i in
// block I and j in block J, both active at the token. Symmetric. pixels must be 1..n_neurons.
std::vector<double> coactivation_blocks(const LayerMask& m, const std::vector<uint32_t>& order, uint32_t pixels);

// RGB PNG of a pixels x pixels block matrix on a log colour scale: 0 = white, then viridis by log1p(v) / log1p(max)
// up to `max` (values above it are drawn as `max`); max <= 0 takes the matrix's own maximum. The report draws a
// layer's heatmaps on one scale (the largest block of any of them) so that their colours compare.
std::string heatmap_png(const std::vector<double>& blocks, uint32_t pixels, double max = 0);

// The colour scale (legend) of heatmap_png(..., max) as an inline SVG: a white swatch for 0, the viridis bar with
// tick labels at powers of ten and at `max`, log-spaced as the colours are. `id` names its gradient (unique per page).
std::string heatmap_scale_svg(double max, const std::string& id = "viridis");

std::string base64_encode(const std::string& bytes);

// Builds the page. Deterministic: same inputs -> identical bytes.
std::string report_html(const ReportOptions& o, Progress* progress = nullptr);

}  // namespace nl
