// Reading a trace v1 for nl-run (full builds: HDF5): the per-layer masks of a trace whose shape must equal the
// image's (layers, neurons per layer). Shared by `nl-run replay` and `nl-run generate --select trace:T.h5`.
#pragma once
#ifdef NL_FULL_BUILD
#include <string>
#include <vector>

#include "formats/core/bitmask.h"
#include "formats/core/image.h"
#include "formats/trace.h"

namespace nl::cli {

// Every layer's mask; InputError naming the trace (one line) when its shape differs from the image's.
std::vector<LayerMask> read_trace_masks(const std::string& path, const ImageManifest& m, TraceInfo* info);

// True when the trace's activation rule marks it synthetic (nl-profile synth).
inline bool trace_is_synthetic(const TraceInfo& ti) { return ti.activation.rfind("synthetic", 0) == 0; }

}  // namespace nl::cli
#endif
