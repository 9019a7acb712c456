// Layout JSON, version 1: one neuron order per FFN layer (slot -> original neuron index), the trace it was
// learned from (sha256), the method and its parameters, and per layer the solver's objective, the upper bound
// and the gap between them. Schema in docs/formats.md "Layout". Written byte-identically for equal inputs.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "formats/core/image.h"

namespace nl {

struct TraceInfo;

inline constexpr const char* kLayoutFormat = "neuralink-layout";
inline constexpr int64_t kLayoutVersion = 1;

struct LayoutLayer {
  // slot -> original neuron index: a permutation of 0..n-1, or with flash replication n + replicas slots where
  // `replicas` neurons appear twice (the runtime reads one copy per token: runtime/plan/replica_cover.h)
  std::vector<uint32_t> order;
  uint32_t replicas = 0;
  // The cache policy the layout was designed for (eval and the runtime use it at the same capacity):
  CacheAdmission admission = CacheAdmission::kUnset;  // kUnset = not specified (the evaluator's setting)
  std::vector<uint32_t> pinned;  // neurons pinned in DRAM (hottest first), part of the capacity; empty = none
  double small_fraction = 0;     // S3-FIFO's small-queue share of the unpinned capacity; 0 = not specified (0.10)
  std::vector<uint32_t> hot;     // admission "value": neurons hottest first (its order within a class); empty = none
  double objective = 0;          // path weight: sum of co-activation counts of adjacent slots (profile trace)
  double upper_bound = 0;        // 1/2 sum over neurons of their two heaviest co-activation counts
  double gap() const { return upper_bound > 0 ? (upper_bound - objective) / upper_bound : 0.0; }
};

struct Layout {
  std::string method;                                    // one of layout_methods()
  nlohmann::json parameters = nlohmann::json::object();  // method parameters (seed, top_k, ...)
  std::string trace_sha256;                              // of the profile trace file
  std::string trace_model;
  uint64_t trace_tokens = 0;
  std::vector<LayoutLayer> layers;
};

// Methods a layout file may name.
const std::vector<std::string>& layout_methods();

std::string layout_to_json(const Layout& l);
void layout_write(const std::string& path, const Layout& l);  // atomic
// Parses and validates; when `trace` is given, layer and neuron counts must match it. InputError naming `path`.
Layout layout_parse(const std::string& text, const std::string& path, const TraceInfo* trace = nullptr);
Layout layout_load(const std::string& path, const TraceInfo* trace = nullptr);

// The layers' cache policies as a flash image records them (pinned neurons -> their slots in the layer's order,
// hottest first kept); empty when no layer has one. What pack writes into the manifest.
std::vector<ImageCachePolicy> layout_cache_policy_slots(const Layout& l);

}  // namespace nl
