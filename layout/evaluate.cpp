#include "layout/evaluate.h"

#include <algorithm>
#include <numeric>

#include "formats/core/error.h"

namespace nl {

void LayerEval::add(const LayerEval& o) {
  tokens = std::max(tokens, o.tokens);  // layers of one model see the same tokens
  active += o.active;
  reads += o.reads;
  bundles_read += o.bundles_read;
  max_read_bundles = std::max(max_read_bundles, o.max_read_bundles);
  bytes_read += o.bytes_read;
  bytes_needed += o.bytes_needed;
  hits += o.hits;
  io_seconds += o.io_seconds;
}

uint64_t default_bundle_bytes(uint32_t n_neurons) {
  if (n_neurons == 11008 || n_neurons == 14336) return 24576;  // Llama-2-7B / Mistral-7B: 3 x 4096 x f16
  return std::max<uint64_t>(n_neurons, 64);                    // 2 x (n/4) x 2 bytes
}

LayerEval evaluate_layer(const LayerMask& m, const std::vector<uint32_t>& order, const EvalConfig& cfg,
                         uint32_t layer_index, const std::vector<uint64_t>* freq) {
  const uint32_t n = m.n_neurons;
  if (order.size() != n) throw InternalError("evaluate: order length does not match the layer");
  PlannerConfig pc;
  pc.n_slots = n;
  pc.bundle_bytes = cfg.bundle_bytes;
  pc.block_bytes = cfg.device.block_bytes;
  pc.gap = cfg.gap;
  pc.cost = cfg.device.cost;
  ReadPlanner planner(pc);
  CacheConfig cc = cfg.cache;
  cc.capacity = cache_capacity_for_ratio(cfg.cache_ratio, n);
  cc.seed = cfg.cache.seed * 1000003ull + layer_index;
  if (cfg.pin_hot && freq) {
    std::vector<uint32_t> slot_of(n);
    for (uint32_t s = 0; s < n; ++s) slot_of[order[s]] = s;
    std::vector<uint32_t> byf(n);
    std::iota(byf.begin(), byf.end(), 0u);
    std::stable_sort(byf.begin(), byf.end(), [&](uint32_t a, uint32_t b) { return (*freq)[a] > (*freq)[b]; });
    for (uint32_t i = 0; i < std::min(cfg.pin_hot, n); ++i) cc.pinned.push_back(slot_of[byf[i]]);
  }
  bool use_cache = cc.capacity > 0 || cc.window_tokens > 0;
  SlotCache cache(n, cc);
  LayerEval ev;
  uint64_t t0 = std::min(cfg.token_begin, m.n_tokens), t1 = std::min(cfg.token_end, m.n_tokens);
  std::vector<std::vector<uint32_t>> act(64);
  TokenPlan plan;
  for (uint64_t w = t0 / 64; w * 64 < t1; ++w) {
    for (auto& a : act) a.clear();
    // Iterating slots in order makes every token's list ascending.
    for (uint32_t s = 0; s < n; ++s) {
      uint64_t x = m.row(order[s])[w];
      while (x) {
        act[__builtin_ctzll(x)].push_back(s);
        x &= x - 1;
      }
    }
    for (uint32_t b = 0; b < 64; ++b) {
      uint64_t t = w * 64 + b;
      if (t < t0 || t >= t1) continue;
      planner.plan(act[b], use_cache ? &cache : nullptr, plan);
      ++ev.tokens;
      ev.active += plan.active;
      ev.reads += plan.reads.size();
      ev.bundles_read += plan.bundles_read;
      for (const ReadOp& r : plan.reads) ev.max_read_bundles = std::max<uint64_t>(ev.max_read_bundles, r.bundles());
      ev.bytes_read += plan.bytes_read;
      ev.bytes_needed += uint64_t(plan.needed) * cfg.bundle_bytes;
      ev.hits += plan.hits.size();
      ev.io_seconds += plan.io_seconds(cfg.device.cost);
    }
  }
  return ev;
}

}  // namespace nl

namespace nl {
DeviceModel default_device() {
  DeviceModel d;
  d.name = "ufs40";
  d.description = "built-in copy of configs/devices/ufs40.json";
  d.queue_depth = 32;
  d.block_bytes = 4096;
  d.cost.read_latency_us = 8.14;
  d.cost.bandwidth_MBps = 4267;
  return d;
}
}  // namespace nl
