// Trace masks for nl-run (cli/run_trace.h).
#ifdef NL_FULL_BUILD
#include "cli/run_trace.h"

#include "formats/core/error.h"

namespace nl::cli {

std::vector<LayerMask> read_trace_masks(const std::string& path, const ImageManifest& m, TraceInfo* info) {
  TraceReader tr(path);
  const TraceInfo& ti = tr.info();
  if (ti.n_layers != uint32_t(m.config.n_layers))
    throw InputError(
        path, "has " + std::to_string(ti.n_layers) + " layers, the image has " + std::to_string(m.config.n_layers));
  std::vector<LayerMask> masks;
  for (uint32_t l = 0; l < ti.n_layers; ++l) {
    if (ti.n_neurons[l] != uint32_t(m.config.hidden_dim))
      throw InputError(path, "layer " + std::to_string(l) + " has " + std::to_string(ti.n_neurons[l]) +
                                 " neurons, the image has " + std::to_string(m.config.hidden_dim));
    masks.push_back(tr.read_layer(l));
  }
  if (info) *info = ti;
  return masks;
}

}  // namespace nl::cli
#endif
