// Held-out evaluation of a layout on a trace, through the runtime's read planner and cache (runtime/plan):
// the figures nl-layout eval prints and the local search's guard compares. Same code as nl-run's reads.
#pragma once
#include <cstdint>
#include <vector>

#include "formats/core/bitmask.h"
#include "runtime/device.h"
#include "runtime/plan/read_plan.h"
#include "runtime/plan/slot_cache.h"

namespace nl {

struct EvalConfig {
  GapPolicy gap;                 // default auto
  double cache_ratio = 0.0;      // fraction of the layer's FFN bytes held by the cache
  CacheConfig cache;             // admission parameters, window, seed (capacity is set from cache_ratio)
  uint32_t pin_hot = 0;          // pin this many most-frequent neurons (by the profile counts given) — 0 = none
  DeviceModel device;
  uint64_t bundle_bytes = 16384;
  uint64_t token_begin = 0, token_end = UINT64_MAX;  // evaluate tokens [begin, end)
};

// Sums over the evaluated tokens of one layer.
struct LayerEval {
  uint64_t tokens = 0;
  uint64_t active = 0;           // active neurons
  uint64_t reads = 0;
  uint64_t bundles_read = 0;     // slots spanned by reads
  uint64_t max_read_bundles = 0;
  uint64_t bytes_read = 0;       // aligned
  uint64_t bytes_needed = 0;     // active neurons read from flash (cache misses) x bundle bytes
  uint64_t hits = 0;             // active neurons served from the cache
  double io_seconds = 0;         // sum over tokens of reads * a + bytes / B

  void add(const LayerEval& o);
  double reads_per_token() const { return tokens ? double(reads) / double(tokens) : 0; }
  double avg_read_bundles() const { return reads ? double(bundles_read) / double(reads) : 0; }
  double hit_rate() const { return active ? double(hits) / double(active) : 0; }
  double io_ms_per_token() const { return tokens ? 1e3 * io_seconds / double(tokens) : 0; }
};

// order: slot -> neuron. freq (optional, per neuron) chooses the pinned hot set when cfg.pin_hot > 0.
LayerEval evaluate_layer(const LayerMask& m, const std::vector<uint32_t>& order, const EvalConfig& cfg,
                         uint32_t layer_index, const std::vector<uint64_t>* freq = nullptr);

// Bundle bytes guessed from a layer's FFN width: OPT-style ReLU FFN with d_model = width / 4 in f16 (so 16,384
// neurons -> 16 KiB, the paper's OPT-6.7B bundles), and the paper's 24 KiB for Llama-2-7B's 11,008.
uint64_t default_bundle_bytes(uint32_t n_neurons);

}  // namespace nl

namespace nl {
// The bundled UFS 4.0 profile (configs/devices/ufs40.json), for when no --device is given.
DeviceModel default_device();
}  // namespace nl
