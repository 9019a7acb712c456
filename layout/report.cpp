#include "layout/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "formats/core/error.h"
#include "formats/core/progress.h"
#include "formats/layout.h"
#include "formats/trace.h"
#include "runtime/plan/replica_cover.h"

// stb's PNG writer, compiled into this file only (header-only use: no run-time dependency on libstb).
#define STB_IMAGE_WRITE_IMPLEMENTATION
#define STB_IMAGE_WRITE_STATIC
#include <stb/stb_image_write.h>

namespace nl {

std::vector<double> coactivation_blocks(const LayerMask& m, const std::vector<uint32_t>& order, uint32_t pixels) {
  const uint32_t n = m.n_neurons;
  if (order.size() != n) throw InternalError("report: order length does not match the layer");
  if (pixels == 0 || pixels > n) throw InternalError("report: heatmap size out of range");
  std::vector<uint32_t> block_of_slot(n);
  for (uint32_t s = 0; s < n; ++s) block_of_slot[s] = uint32_t(uint64_t(s) * pixels / n);
  std::vector<double> h(size_t(pixels) * pixels, 0.0);
  std::vector<std::vector<uint32_t>> act(64);
  std::vector<uint32_t> count(pixels, 0), nz;
  for (uint64_t w = 0; w < m.words; ++w) {
    for (auto& a : act) a.clear();
    for (uint32_t s = 0; s < n; ++s) {
      uint64_t x = m.row(order[s])[w];
      while (x) {
        act[__builtin_ctzll(x)].push_back(block_of_slot[s]);
        x &= x - 1;
      }
    }
    // Per token, pairs of blocks get count(I) * count(J) co-activations; the diagonal drops i == j.
    for (const auto& blocks : act) {
      nz.clear();
      for (uint32_t b : blocks)
        if (count[b]++ == 0) nz.push_back(b);
      for (uint32_t I : nz) {
        double* row = h.data() + size_t(I) * pixels;
        double cI = count[I];
        for (uint32_t J : nz) row[J] += cI * count[J];
        row[I] -= cI;
      }
      for (uint32_t b : nz) count[b] = 0;
    }
  }
  return h;
}

namespace {

// viridis at nine evenly spaced points
const uint8_t kViridis[9][3] = {{68, 1, 84},    {71, 44, 122}, {59, 81, 139},  {44, 113, 142}, {33, 144, 141},
                                {39, 173, 129}, {92, 200, 99}, {170, 220, 50}, {253, 231, 37}};

void colour(double v, uint8_t* rgb) {
  v = std::clamp(v, 0.0, 1.0) * 8.0;
  int i = std::min(7, int(v));
  double f = v - i;
  for (int c = 0; c < 3; ++c) rgb[c] = uint8_t(std::lround(kViridis[i][c] * (1 - f) + kViridis[i + 1][c] * f));
}

void png_append(void* ctx, void* data, int size) {
  static_cast<std::string*>(ctx)->append(static_cast<const char*>(data), size_t(size));
}

std::string html_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&':
        o += "&amp;";
        break;
      case '<':
        o += "&lt;";
        break;
      case '>':
        o += "&gt;";
        break;
      case '"':
        o += "&quot;";
        break;
      default:
        o += c;
    }
  }
  return o;
}

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

// Read-length bins: 1, 2, 3-4, 5-8, ... bundles.
std::string bin_label(size_t b) {
  if (b == 0) return "1";
  if (b == 1) return "2";
  uint64_t lo = (uint64_t(1) << (b - 1)) + 1, hi = uint64_t(1) << b;
  return std::to_string(lo) + "-" + std::to_string(hi);
}
size_t bin_of(uint64_t len) {
  size_t b = 0;
  while ((uint64_t(1) << b) < len) ++b;
  return b;
}

const char* kSeriesColours[] = {"#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#9c755f"};

// Grouped bars: share of reads per length bin, one colour per layout.
std::string histogram_svg(const std::vector<std::string>& names, const std::vector<std::vector<uint64_t>>& hists) {
  size_t bins = 1;
  std::vector<std::vector<double>> share(hists.size());
  for (size_t k = 0; k < hists.size(); ++k) {
    uint64_t total = 0;
    for (uint64_t c : hists[k]) total += c;
    for (size_t len = 1; len < hists[k].size(); ++len) {
      if (!hists[k][len]) continue;
      size_t b = bin_of(len);
      if (share[k].size() <= b) share[k].resize(b + 1, 0.0);
      share[k][b] += double(hists[k][len]) / double(std::max<uint64_t>(total, 1));
    }
    bins = std::max(bins, share[k].size());
  }
  double ymax = 0;
  for (const auto& s : share)
    for (double v : s) ymax = std::max(ymax, v);
  if (ymax <= 0) ymax = 1;
  const int W = 760, H = 260, left = 50, bottom = 40, top = 10;
  double plot_w = W - left - 10, plot_h = H - bottom - top;
  double group_w = plot_w / double(bins), bar_w = group_w * 0.8 / double(std::max<size_t>(hists.size(), 1));
  std::string o = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + std::to_string(W) + "\" height=\"" +
                  std::to_string(H) + "\" font-family=\"sans-serif\" font-size=\"11\">";
  for (int t = 0; t <= 4; ++t) {
    double y = top + plot_h * (1 - t / 4.0);
    o += "<line x1=\"" + std::to_string(left) + "\" x2=\"" + std::to_string(W - 10) + "\" y1=\"" + fmt("%.1f", y) +
         "\" y2=\"" + fmt("%.1f", y) + "\" stroke=\"#ddd\"/>";
    o += "<text x=\"" + std::to_string(left - 4) + "\" y=\"" + fmt("%.1f", y + 4) + "\" text-anchor=\"end\">" +
         fmt("%.0f%%", 100 * ymax * t / 4.0) + "</text>";
  }
  for (size_t b = 0; b < bins; ++b) {
    double gx = left + group_w * double(b) + group_w * 0.1;
    for (size_t k = 0; k < share.size(); ++k) {
      double v = b < share[k].size() ? share[k][b] : 0.0;
      double h = plot_h * v / ymax;
      o += "<rect x=\"" + fmt("%.1f", gx + bar_w * double(k)) + "\" y=\"" + fmt("%.1f", top + plot_h - h) +
           "\" width=\"" + fmt("%.1f", bar_w) + "\" height=\"" + fmt("%.1f", h) + "\" fill=\"" + kSeriesColours[k % 8] +
           "\"><title>" + html_escape(names[k]) + ", " + bin_label(b) + " bundles: " + fmt("%.2f%%", 100 * v) +
           " of reads</title></rect>";
    }
    o += "<text x=\"" + fmt("%.1f", left + group_w * (double(b) + 0.5)) + "\" y=\"" + std::to_string(H - bottom + 14) +
         "\" text-anchor=\"middle\">" + bin_label(b) + "</text>";
  }
  o += "<text x=\"" + std::to_string(left + int(plot_w / 2)) + "\" y=\"" + std::to_string(H - 8) +
       "\" text-anchor=\"middle\">read length (bundles)</text></svg>";
  std::string legend = "<div class=\"legend\">";
  for (size_t k = 0; k < names.size(); ++k)
    legend += "<span><i style=\"background:" + std::string(kSeriesColours[k % 8]) + "\"></i>" + html_escape(names[k]) +
              "</span>";
  return o + legend + "</div>";
}

std::string eval_table(const std::vector<std::string>& names, const std::vector<const LayerEval*>& rows) {
  const LayerEval* ident = nullptr;
  const LayerEval* greedy = nullptr;
  for (size_t k = 0; k < names.size(); ++k) {
    if (names[k] == "identity") ident = rows[k];
    if (names[k] == "greedy") greedy = rows[k];
  }
  auto ratio = [](double x, double y) { return y > 0 ? fmt("%.3f", x / y) : std::string("-"); };
  // The ratio columns against identity / greedy only when that layout is in the report (else they are all "-").
  std::string o =
      "<table><tr><th>layout</th><th>reads/tok</th><th>avg_len</th><th>max_len</th><th>KiB_rd/tok</th>"
      "<th>rd/need</th><th>hit%</th><th>io_ms/tok</th>";
  if (ident) o += "<th>rd/idn</th><th>io/idn</th>";
  if (greedy) o += "<th>rd/grd</th><th>io/grd</th>";
  o += "</tr>";
  for (size_t k = 0; k < names.size(); ++k) {
    const LayerEval& t = *rows[k];
    o += "<tr><td>" + html_escape(names[k]) + "</td><td>" + fmt("%.2f", t.reads_per_token()) + "</td><td>" +
         fmt("%.2f", t.avg_read_bundles()) + "</td><td>" + std::to_string(t.max_read_bundles) + "</td><td>" +
         fmt("%.1f", double(t.bytes_read) / 1024.0 / double(std::max<uint64_t>(1, t.tokens))) + "</td><td>" +
         ratio(double(t.bytes_read), double(t.bytes_needed)) + "</td><td>" + fmt("%.2f", 100.0 * t.hit_rate()) +
         "</td><td>" + fmt("%.4f", t.io_ms_per_token()) + "</td>";
    if (ident)
      o += "<td>" + ratio(double(t.reads), double(ident->reads)) + "</td><td>" +
           ratio(t.io_seconds, ident->io_seconds) + "</td>";
    if (greedy)
      o += "<td>" + ratio(double(t.reads), double(greedy->reads)) + "</td><td>" +
           ratio(t.io_seconds, greedy->io_seconds) + "</td>";
    o += "</tr>";
  }
  return o + "</table>";
}

}  // namespace

std::string heatmap_png(const std::vector<double>& blocks, uint32_t pixels, double max) {
  if (blocks.size() != size_t(pixels) * pixels) throw InternalError("heatmap: size mismatch");
  double mx = max;
  if (mx <= 0)
    for (double v : blocks) mx = std::max(mx, v);
  double lmax = std::log1p(mx);
  std::vector<uint8_t> rgb(blocks.size() * 3, 255);
  for (size_t i = 0; i < blocks.size(); ++i)
    if (blocks[i] > 0) colour(lmax > 0 ? std::log1p(blocks[i]) / lmax : 1.0, &rgb[3 * i]);
  std::string png;
  if (!stbi_write_png_to_func(png_append, &png, int(pixels), int(pixels), 3, rgb.data(), int(pixels) * 3))
    throw InternalError("heatmap: PNG encoding failed");
  return png;
}

std::string heatmap_scale_svg(double max, const std::string& id) {
  const int W = 520, H = 46, x0 = 60, bar_w = 380, top = 4, bar_h = 14;
  char b[512];
  std::string o = "<svg class=\"colour-scale\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" + std::to_string(W) +
                  "\" height=\"" + std::to_string(H) +
                  "\" font-family=\"sans-serif\" font-size=\"11\"><defs><linearGradient id=\"" + html_escape(id) +
                  "\">";
  for (int i = 0; i < 9; ++i) {
    std::snprintf(b, sizeof b, "<stop offset=\"%.3f\" stop-color=\"rgb(%d,%d,%d)\"/>", i / 8.0, kViridis[i][0],
                  kViridis[i][1], kViridis[i][2]);
    o += b;
  }
  // 0 is white (no co-activation); the bar spans log1p(count) / log1p(max) from 0 to 1, as heatmap_png colours.
  std::snprintf(b, sizeof b,
                "</linearGradient></defs><rect x=\"30\" y=\"%d\" width=\"14\" height=\"%d\" fill=\"#fff\" "
                "stroke=\"#999\"/><text x=\"37\" y=\"%d\" text-anchor=\"middle\">0</text><rect x=\"%d\" "
                "y=\"%d\" width=\"%d\" height=\"%d\" fill=\"url(#%s)\" stroke=\"#999\"/>",
                top, bar_h, top + bar_h + 13, x0, top, bar_w, bar_h, html_escape(id).c_str());
  o += b;
  const double lmax = std::log1p(std::max(max, 0.0));
  auto tick = [&](double v, const std::string& label) {
    double x = x0 + (lmax > 0 ? bar_w * std::log1p(v) / lmax : double(bar_w));
    std::snprintf(b, sizeof b,
                  "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%d\" y2=\"%d\" stroke=\"#333\"/><text x=\"%.1f\" "
                  "y=\"%d\" text-anchor=\"middle\">%s</text>",
                  x, x, top + bar_h, top + bar_h + 3, x, top + bar_h + 13, label.c_str());
    o += b;
  };
  // Powers of ten that keep clear of the maximum's label (at least 15 % of the bar away).
  for (double v = 1; v < max; v *= 10)
    if (lmax <= 0 || std::log1p(v) / lmax < 0.85) tick(v, v < 1e4 ? fmt("%.0f", v) : fmt("1e%.0f", std::log10(v)));
  tick(std::max(max, 0.0), fmt("%.0f", std::max(max, 0.0)));
  std::snprintf(b, sizeof b,
                "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">co-activations per block pair (log scale; max "
                "%.0f)</text></svg>",
                x0 + bar_w / 2, H - 2, std::max(max, 0.0));
  return o + b;
}

std::string base64_encode(const std::string& in) {
  static const char* t = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string o;
  o.reserve((in.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    uint32_t v = (uint32_t(uint8_t(in[i])) << 16) | (uint32_t(uint8_t(in[i + 1])) << 8) | uint8_t(in[i + 2]);
    o += t[v >> 18];
    o += t[(v >> 12) & 63];
    o += t[(v >> 6) & 63];
    o += t[v & 63];
  }
  if (i < in.size()) {
    uint32_t v = uint32_t(uint8_t(in[i])) << 16;
    if (i + 1 < in.size()) v |= uint32_t(uint8_t(in[i + 1])) << 8;
    o += t[v >> 18];
    o += t[(v >> 12) & 63];
    o += i + 1 < in.size() ? t[(v >> 6) & 63] : '=';
    o += '=';
  }
  return o;
}

std::string report_html(const ReportOptions& o, Progress* progress) {
  TraceReader tr(o.trace);
  const TraceInfo& ti = tr.info();
  for (uint32_t l : o.layers)
    if (l >= ti.n_layers)
      throw UsageError("--layers: layer " + std::to_string(l) + " out of range (trace has " +
                       std::to_string(ti.n_layers) + " layers)");
  std::vector<Layout> lays;
  std::vector<std::string> names;
  std::map<std::string, int> seen;
  for (const auto& f : o.layouts) {
    lays.push_back(layout_load(f, &ti));
    std::string name = lays.back().method;
    if (seen[name]++) name += "#" + std::to_string(seen[name]);
    names.push_back(name);
  }
  TraceEval te = evaluate_trace(tr, lays, o.eval, o.layers);
  if (progress) progress->add(1);

  std::string h =
      "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>Layout report: " + html_escape(o.trace) +
      "</title>\n<style>body{font-family:sans-serif;margin:20px;color:#222}table{border-collapse:collapse;margin:8px 0}"
      "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}td:first-child,th:first-child{text-align:left}"
      ".maps{display:flex;flex-wrap:wrap;gap:12px}.maps figure{margin:0}.maps img{width:360px;height:360px;"
      "image-rendering:pixelated;border:1px solid #999}figcaption{font-size:13px}.legend span{margin-right:14px;"
      "font-size:13px}.legend i{display:inline-block;width:12px;height:12px;margin-right:4px}</style></head><body>\n";
  uint64_t bb =
      o.eval.bundle_bytes ? o.eval.bundle_bytes : default_bundle_bytes(ti.n_neurons.empty() ? 0 : ti.n_neurons[0]);
  h += "<h1>Layout report</h1>\n<p>Trace <code>" + html_escape(o.trace) + "</code>: model " + html_escape(ti.model) +
       ", activation <code>" + html_escape(ti.activation) + "</code>, " + std::to_string(ti.n_layers) + " layers, " +
       std::to_string(ti.n_tokens) + " tokens. Device " + html_escape(o.eval.device.name) + ", gap " +
       html_escape(o.eval.gap.to_string()) + ", cache " + fmt("%.3g", o.eval.cache_ratio) + " of FFN bytes, bundle " +
       std::to_string(bb) + " B.</p>\n<ul>";
  for (size_t k = 0; k < names.size(); ++k)
    h += "<li><b>" + html_escape(names[k]) + "</b>: <code>" + html_escape(o.layouts[k]) + "</code></li>";
  h += "</ul>\n<h2>Held-out evaluation, all layers</h2>\n";
  std::vector<const LayerEval*> rows;
  for (const auto& t : te.total) rows.push_back(&t);
  h += eval_table(names, rows) + "\n";

  for (size_t i = 0; i < o.layers.size(); ++i) {
    uint32_t l = o.layers[i];
    LayerMask m = tr.read_layer(l);
    uint32_t px = std::min(o.pixels, m.n_neurons);
    std::vector<std::vector<uint32_t>> orders;
    std::vector<std::string> captions;
    std::vector<uint32_t> ident(m.n_neurons);
    for (uint32_t n = 0; n < m.n_neurons; ++n) ident[n] = n;
    orders.push_back(ident);
    captions.push_back("original order");
    for (size_t k = 0; k < lays.size(); ++k) {
      if (lays[k].layers[l].order == ident) {  // the same picture as the original order: name it there
        captions[0] += " = " + names[k];
        continue;
      }
      orders.push_back(primary_order(lays[k].layers[l].order, m.n_neurons));  // a replica's first copy
      captions.push_back(names[k] + " order");
    }
    std::vector<std::vector<double>> blocks(orders.size());
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t k = 0; k < int64_t(orders.size()); ++k)
      blocks[size_t(k)] = coactivation_blocks(m, orders[size_t(k)], px);
    double scale_max = 0;  // one colour scale for the layer's heatmaps, so that their colours compare
    for (const auto& bl : blocks)
      for (double v : bl) scale_max = std::max(scale_max, v);
    std::vector<std::string> pngs(orders.size());
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t k = 0; k < int64_t(orders.size()); ++k)
      pngs[size_t(k)] = heatmap_png(blocks[size_t(k)], px, scale_max);
    h += "<h2>Layer " + std::to_string(l) + "</h2>\n<p>" + std::to_string(m.n_neurons) +
         " neurons. Co-activation counts of neuron pairs (both active at a token; a neuron with itself left out), "
         "slots in " +
         std::to_string(px) + " blocks of " + fmt("%.4g", double(m.n_neurons) / px) +
         " each, summed per block pair; log colour scale from white (none) through purple to yellow (most), the same "
         "for every map of the layer:</p>\n" +
         heatmap_scale_svg(scale_max, "viridis-layer" + std::to_string(l)) + "\n<div class=\"maps\">";
    for (size_t k = 0; k < pngs.size(); ++k)
      h += "<figure><img alt=\"" + html_escape(captions[k]) + "\" src=\"data:image/png;base64," +
           base64_encode(pngs[k]) + "\"><figcaption>" + html_escape(captions[k]) + "</figcaption></figure>";
    h += "</div>\n<h3>Read lengths</h3>\n";
    std::vector<std::vector<uint64_t>> hists;
    for (size_t k = 0; k < lays.size(); ++k) hists.push_back(te.read_lengths[k][i]);
    h += histogram_svg(names, hists) + "\n<h3>Evaluation, layer " + std::to_string(l) + "</h3>\n";
    std::vector<const LayerEval*> lrows;
    for (size_t k = 0; k < lays.size(); ++k) lrows.push_back(&te.layers[k][l]);
    h += eval_table(names, lrows) + "\n";
    if (progress) progress->add(1);
  }
  if (progress) progress->finish();
  h += "</body></html>\n";
  return h;
}

}  // namespace nl
