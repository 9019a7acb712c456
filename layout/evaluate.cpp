#include "layout/evaluate.h"

#include <algorithm>
#include <exception>
#include <memory>
#include <mutex>
#include <numeric>

#include "formats/core/error.h"
#include "formats/core/huge_pages.h"
#include "formats/core/progress.h"
#include "formats/layout.h"
#include "formats/trace.h"
#include "layout/cost_model.h"
#include "runtime/plan/replica_cover.h"

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

TokenMajorMask::TokenMajorMask(const LayerMask& m, uint64_t b, uint64_t e)
    : n_neurons(m.n_neurons),
      begin(std::min(b, m.n_tokens)),
      end(std::min(e, m.n_tokens)),
      words(words_for_tokens(m.n_neurons)) {
  if (end < begin) end = begin;
  assign_huge(bits, size_t(end - begin) * words, uint64_t(0));
  // 512 tokens (8 words of every row) at a time: rows are read in order (prefetchable) and the 512 token rows
  // written stay in cache.
  constexpr uint64_t kBlockWords = 8;
  for (uint64_t w0 = begin / 64; w0 * 64 < end; w0 += kBlockWords) {
    const uint64_t w1 = std::min<uint64_t>(w0 + kBlockWords, words_for_tokens(end));
    for (uint32_t v = 0; v < n_neurons; ++v) {
      const uint64_t* r = m.row(v);
      const uint64_t vw = v >> 6, vb = uint64_t(1) << (v & 63);
      for (uint64_t w = w0; w < w1; ++w) {
        uint64_t x = r[w];
        while (x) {
          const uint64_t t = w * 64 + uint64_t(__builtin_ctzll(x));
          x &= x - 1;
          if (t >= begin && t < end) bits[size_t(t - begin) * words + vw] |= vb;
        }
      }
    }
  }
}

void TokenMajorMask::append_slots(uint64_t t, const std::vector<uint32_t>& slot_of, std::vector<uint64_t>& slot_bits,
                                  std::vector<uint32_t>& out) const {
  for_each_active(t, [&](uint32_t v) {
    const uint32_t s = slot_of[v];
    slot_bits[s >> 6] |= uint64_t(1) << (s & 63);
  });
  for (uint64_t w = 0; w < slot_bits.size(); ++w) {
    for (uint64_t x = slot_bits[w]; x; x &= x - 1) out.push_back(uint32_t(w * 64 + uint64_t(__builtin_ctzll(x))));
    slot_bits[w] = 0;
  }
}

namespace {

// The cache a layer's policy gives under cfg (nullptr: cfg.cache as is), as nl-run applies the manifest's
// cache_policy.
CacheConfig policy_cache_config(const EvalConfig& cfg, uint32_t n, uint32_t layer_index, const LayerCachePolicy* policy,
                                const ReplicaMap& rmap) {
  CacheConfig cc = cfg.cache;
  cc.capacity = cache_capacity_for_ratio(cfg.cache_ratio, n);
  cc.seed = cache_seed_for_layer(cfg.cache.seed, layer_index);
  if (policy) {
    auto slots_of = [&](const std::vector<uint32_t>& neurons, const char* what) {  // a neuron's first copy
      std::vector<uint32_t> slots;
      slots.reserve(neurons.size());
      for (uint32_t v : neurons) {
        if (v >= n) throw InternalError(std::string("evaluate: ") + what + " neuron out of range");
        slots.push_back(rmap.first[v]);
      }
      return slots;
    };
    const std::vector<uint32_t> pinned_slots = slots_of(policy->pinned, "pinned"),
                                hot_slots = slots_of(policy->hot, "hot");
    cache_apply_policy(cc, policy->admission, pinned_slots, policy->small_fraction, hot_slots);
  }
  cc.alias = rmap.cache_alias();
  return cc;
}

bool caches_anything(const CacheConfig& cc) { return cc.capacity > 0 || cc.window_tokens > 0; }

// One token's plan added to a layer's sums.
void add_plan(LayerEval& ev, const TokenPlan& plan, const EvalConfig& cfg) {
  ++ev.tokens;
  ev.active += plan.active;
  ev.reads += plan.ops;  // device reads: a read longer than the runtime's staging counts as its pieces
  ev.bundles_read += plan.bundles_read;
  for (const ReadOp& r : plan.reads) ev.max_read_bundles = std::max<uint64_t>(ev.max_read_bundles, r.bundles());
  ev.bytes_read += plan.bytes_read;
  ev.bytes_needed += uint64_t(plan.needed) * cfg.bundle_bytes;
  ev.hits += plan.hits.size();
  ev.io_seconds += plan.io_seconds(cfg.device.cost);
}

// One order under several cache policies: the token's active slots are listed once and planned once per policy
// (each with its own cache). misses / read_lengths belong to the first policy.
std::vector<LayerEval> evaluate_policies(const LayerMask& m, const std::vector<uint32_t>& order, const EvalConfig& cfg,
                                         uint32_t layer_index, const std::vector<const LayerCachePolicy*>& policies,
                                         LayerMask* misses, std::vector<uint64_t>* read_lengths,
                                         const TokenMajorMask* tm, const TokenPlanFn* on_plan = nullptr) {
  const uint32_t n = m.n_neurons;
  // An order longer than the layer holds replicas (a neuron twice): the cover picks a copy per token.
  const bool replicated = order.size() != n;
  if (order.size() < n) throw InternalError("evaluate: order length does not match the layer");
  const ReplicaMap rmap = ReplicaMap::from_order(order, n);
  PlannerConfig pc = planner_config(cfg, n);
  pc.n_slots = rmap.n_slots();
  ReadPlanner planner(pc);
  std::unique_ptr<ReplicaCover> cover;
  if (replicated) cover = std::make_unique<ReplicaCover>(rmap, pc);
  const std::vector<uint32_t>& slot_of = rmap.first;
  const size_t np = policies.size();
  std::vector<SlotCache> caches;
  std::vector<uint8_t> use_cache(np);
  caches.reserve(np);
  for (size_t k = 0; k < np; ++k) {
    const CacheConfig cc = policy_cache_config(cfg, n, layer_index, policies[k], rmap);
    use_cache[k] = caches_anything(cc);
    caches.emplace_back(rmap.n_slots(), cc);
  }
  std::vector<LayerEval> evs(np);
  uint64_t t0 = std::min(cfg.token_begin, m.n_tokens), t1 = std::min(cfg.token_end, m.n_tokens);
  if (misses) *misses = LayerMask(n, t1 > t0 ? t1 - t0 : 0);
  // Per token, its active slots ascending (what the planner takes), from the token-major rows (the caller's view
  // when it covers the range, else one built here).
  std::unique_ptr<TokenMajorMask> own;
  if (!(tm && tm->n_neurons == n && tm->begin <= t0 && tm->end >= t1)) {
    own = std::make_unique<TokenMajorMask>(m, t0, t1);
    tm = own.get();
  }
  std::vector<uint64_t> slot_bits(words_for_tokens(n));
  std::vector<uint32_t> a, active_neurons;
  TokenPlan plan;
  // One token's plan under policy k of the n slots at s, added to its figures. on_plan sees them as `a`, which
  // holds them already (replicas) or gets a copy.
  auto account = [&](size_t k, uint64_t t, const uint32_t* s, size_t n_s) {
    SlotCache& cache = caches[k];
    LayerEval& ev = evs[k];
    if (k == 0 && misses)
      for (size_t i = 0; i < n_s; ++i)
        if (!(use_cache[k] && cache.resident(s[i]))) misses->set(order[s[i]], t - t0);
    planner.plan(s, n_s, use_cache[k] ? &cache : nullptr, plan);
    if (k == 0 && on_plan) {
      if (s != a.data()) a.assign(s, s + n_s);
      (*on_plan)(t, a, plan);
    }
    add_plan(ev, plan, cfg);
    if (k == 0 && read_lengths)
      for (const ReadOp& r : plan.reads) {
        if (read_lengths->size() <= r.bundles()) read_lengths->resize(r.bundles() + 1, 0);
        ++(*read_lengths)[r.bundles()];
      }
  };
  if (replicated) {  // the cover chooses each policy's copies from its own cache
    for (uint64_t t = t0; t < t1; ++t) {
      active_neurons.clear();
      tm->for_each_active(t, [&](uint32_t v) { active_neurons.push_back(v); });
      for (size_t k = 0; k < np; ++k) {
        cover->choose(active_neurons.data(), active_neurons.size(), use_cache[k] ? &caches[k] : nullptr, a);
        account(k, t, a.data(), a.size());
      }
    }
    return evs;
  }
  // A block of tokens' slot lists at a time, then each policy over the block: one cache's state stays in the CPU's
  // cache for a whole block instead of every policy's state passing through it on every token. Each policy still
  // sees the tokens in order, so every figure is what a token-by-token pass gives.
  constexpr uint64_t kBlockTokens = 64;
  std::vector<uint32_t> block_slots;  // the block's tokens' slots, token after token
  std::vector<size_t> block_ends;     // where each token's slots end in block_slots
  for (uint64_t b0 = t0; b0 < t1; b0 += kBlockTokens) {
    const uint64_t b1 = std::min(t1, b0 + kBlockTokens);
    block_slots.clear();
    block_ends.clear();
    for (uint64_t t = b0; t < b1; ++t) {
      tm->append_slots(t, slot_of, slot_bits, block_slots);
      block_ends.push_back(block_slots.size());
    }
    for (size_t k = 0; k < np; ++k) {
      size_t from = 0;
      for (uint64_t t = b0; t < b1; ++t) {
        const size_t to = block_ends[size_t(t - b0)];
        account(k, t, block_slots.data() + from, to - from);
        from = to;
      }
    }
  }
  return evs;
}

}  // namespace

LayerEval evaluate_layer(const LayerMask& m, const std::vector<uint32_t>& order, const EvalConfig& cfg,
                         uint32_t layer_index, const LayerCachePolicy* policy, LayerMask* misses,
                         std::vector<uint64_t>* read_lengths, const TokenMajorMask* tm) {
  return evaluate_policies(m, order, cfg, layer_index, {policy}, misses, read_lengths, tm)[0];
}

std::vector<LayerEval> evaluate_layer_policies(const LayerMask& m, const std::vector<uint32_t>& order,
                                               const EvalConfig& cfg, uint32_t layer_index,
                                               const std::vector<const LayerCachePolicy*>& policies,
                                               const TokenMajorMask* tm) {
  return evaluate_policies(m, order, cfg, layer_index, policies, nullptr, nullptr, tm);
}

LayerEval evaluate_layer_plans(const LayerMask& m, const std::vector<uint32_t>& order, const EvalConfig& cfg,
                               uint32_t layer_index, const LayerCachePolicy* policy, const TokenMajorMask* tm,
                               const TokenPlanFn& on_plan) {
  return evaluate_policies(m, order, cfg, layer_index, {policy}, nullptr, nullptr, tm, &on_plan)[0];
}

OrderPass::OrderPass(const LayerMask& m, const std::vector<uint32_t>& order, const EvalConfig& cfg,
                     uint32_t layer_index, const TokenMajorMask* tm)
    : n_(m.n_neurons), cfg_(cfg), layer_(layer_index) {
  const uint32_t n = m.n_neurons;
  if (order.size() != n) throw InternalError("evaluate: an order pass takes an order of the layer without replicas");
  rmap_ = ReplicaMap::from_order(order, n);
  const uint64_t t0 = std::min(cfg.token_begin, m.n_tokens), t1 = std::min(cfg.token_end, m.n_tokens);
  std::unique_ptr<TokenMajorMask> own;
  if (!(tm && tm->n_neurons == n && tm->begin <= t0 && tm->end >= t1)) {
    own = std::make_unique<TokenMajorMask>(m, t0, t1);
    tm = own.get();
  }
  std::vector<uint64_t> slot_bits(words_for_tokens(n));
  ends_.reserve(t1 > t0 ? t1 - t0 : 0);
  size_t total = 0;  // sized once: growing tens of MB by doubling cost as much as listing them
  for (uint64_t t = t0; t < t1; ++t)
    for (uint64_t w = 0; w < tm->words; ++w) total += size_t(__builtin_popcountll(tm->row(t)[w]));
  slots_.reserve(total);
  for (uint64_t t = t0; t < t1; ++t) {
    tm->append_slots(t, rmap_.first, slot_bits, slots_);
    ends_.push_back(slots_.size());
  }
}

LayerEval OrderPass::run(const LayerCachePolicy* policy, double stop_at, bool* stopped) const {
  PlannerConfig pc = planner_config(cfg_, n_);
  pc.n_slots = rmap_.n_slots();
  const ReadPlanner planner(pc);
  const CacheConfig cc = policy_cache_config(cfg_, n_, layer_, policy, rmap_);
  SlotCache cache(rmap_.n_slots(), cc);
  SlotCache* use = caches_anything(cc) ? &cache : nullptr;
  LayerEval ev;
  TokenPlan plan;
  if (stopped) *stopped = false;
  size_t from = 0;
  for (size_t i = 0; i < ends_.size(); ++i) {
    const size_t to = ends_[i];
    planner.plan(slots_.data() + from, to - from, use, plan);
    add_plan(ev, plan, cfg_);
    from = to;
    // io_seconds only grows (every token adds a non-negative time), so the full pass would end at or above it.
    if (ev.io_seconds >= stop_at && i + 1 < ends_.size()) {
      if (stopped) *stopped = true;
      break;
    }
  }
  return ev;
}

double io_lower_bound_seconds(const TokenMajorMask& tm, const EvalConfig& cfg) {
  if (cfg.cache.window_tokens > 0) return -1.0;
  const CostModel c = cost_model(cfg, tm.n_neurons);
  const uint32_t k = c.cache_capacity;
  const double a = c.read_us * 1e-6, per_bundle = c.bundle_us() * 1e-6;
  double s = 0;
  for (uint64_t t = tm.begin; t < tm.end; ++t) {
    const uint64_t* r = tm.row(t);
    uint64_t n = 0;
    for (uint64_t w = 0; w < tm.words; ++w) n += uint64_t(__builtin_popcountll(r[w]));
    if (n > k) s += a + double(n - k) * per_bundle;
  }
  return s;
}

TraceEval evaluate_trace(const TraceReader& trace, const std::vector<Layout>& layouts, const EvalConfig& cfg,
                         const std::vector<uint32_t>& hist_layers, Progress* progress, bool layout_cache) {
  const TraceInfo& ti = trace.info();
  TraceEval out;
  out.layers.assign(layouts.size(), std::vector<LayerEval>(ti.n_layers));
  out.total.assign(layouts.size(), LayerEval{});
  out.read_lengths.assign(layouts.size(), std::vector<std::vector<uint64_t>>(hist_layers.size()));
  out.bound_seconds.assign(ti.n_layers, 0.0);
  std::mutex mu;
  std::exception_ptr err;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t l = 0; l < int64_t(ti.n_layers); ++l) {
    try {
      LayerMask m;
      {
        std::lock_guard<std::mutex> lk(mu);  // HDF5 is serialised
        if (err) continue;
        m = trace.read_layer(uint32_t(l));
      }
      EvalConfig e = cfg;
      if (e.bundle_bytes == 0) e.bundle_bytes = default_bundle_bytes(m.n_neurons);
      const TokenMajorMask tm(m, e.token_begin, e.token_end);  // one transposition for every layout
      out.bound_seconds[size_t(l)] = io_lower_bound_seconds(tm, e);
      auto h = std::find(hist_layers.begin(), hist_layers.end(), uint32_t(l));
      for (size_t k = 0; k < layouts.size(); ++k) {
        std::vector<uint64_t>* hist =
            h == hist_layers.end() ? nullptr : &out.read_lengths[k][size_t(h - hist_layers.begin())];
        const LayoutLayer& L = layouts[k].layers[size_t(l)];
        LayerCachePolicy pol{L.admission, L.pinned, L.small_fraction, L.hot};
        out.layers[k][size_t(l)] =
            evaluate_layer(m, L.order, e, uint32_t(l), layout_cache ? &pol : nullptr, nullptr, hist, &tm);
      }
      if (progress) progress->add(1);
    } catch (...) {
      std::lock_guard<std::mutex> lk(mu);
      if (!err) err = std::current_exception();
    }
  }
  if (err) std::rethrow_exception(err);
  if (progress) progress->finish();
  for (size_t k = 0; k < layouts.size(); ++k)
    for (const auto& le : out.layers[k]) out.total[k].add(le);
  for (double b : out.bound_seconds) out.bound_total = (b < 0 || out.bound_total < 0) ? -1.0 : out.bound_total + b;
  return out;
}

}  // namespace nl
