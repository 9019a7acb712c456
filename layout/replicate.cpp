#include "layout/replicate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "formats/core/error.h"
#include "runtime/plan/replica_cover.h"

namespace nl {

uint32_t replica_budget(double share, uint32_t n_neurons) {
  if (!(share >= 0 && share <= 1)) throw UsageError("replicate budget must be in [0, 100] %");
  return uint32_t(std::floor(share * double(n_neurons) + 1e-9));
}

std::vector<ReplicaCandidate> replica_candidates(const LayerMask& m, const TokenMajorMask& tm, const Order& order,
                                                 const CostModel& cost, uint32_t layer_index,
                                                 const LayerCachePolicy* policy, uint32_t max_count,
                                                 uint64_t max_tokens) {
  const uint32_t n = m.n_neurons;
  if (order.size() != n) throw InternalError("replicate: the order must be a permutation of the layer");
  if (max_count == 0 || tm.end <= tm.begin) return {};
  EvalConfig e = cost.exact;
  e.token_begin = tm.begin;
  e.token_end = std::min<uint64_t>(tm.end, tm.begin + max_tokens);
  std::vector<uint32_t> slot_of(n);
  for (uint32_t s = 0; s < n; ++s) slot_of[order[s]] = s;

  // Per token, from the runtime's reads: the slots read alone (a read holding one active slot) and the anchors (the
  // first and last active slot of every read, 2q for "before q", 2q + 1 for "after q"); adj[q]: tokens where slots q
  // and q + 1 were both active and read (a copy between them would put a bundle into that read).
  std::vector<uint32_t> lone, anchors;
  std::vector<uint64_t> lone_at = {0}, anchors_at = {0};
  std::vector<uint32_t> lone_count(n, 0), adj(n, 0);
  evaluate_layer_plans(m, order, e, layer_index, policy, &tm,
                       [&](uint64_t, const std::vector<uint32_t>& a, const TokenPlan& plan) {
                         size_t i = 0;
                         for (const ReadOp& r : plan.reads) {
                           while (i < a.size() && a[i] < r.slot_begin) ++i;
                           size_t j = i;
                           while (j < a.size() && a[j] < r.slot_end) ++j;
                           if (j == i) continue;
                           if (j - i == 1) {
                             lone.push_back(a[i]);
                             ++lone_count[order[a[i]]];
                           }
                           anchors.push_back(2 * a[i]);
                           anchors.push_back(2 * a[j - 1] + 1);
                           for (size_t k = i + 1; k < j; ++k)
                             if (a[k] == a[k - 1] + 1) ++adj[a[k - 1]];
                           i = j;
                         }
                         lone_at.push_back(lone.size());
                         anchors_at.push_back(anchors.size());
                       });
  const size_t n_tok = lone_at.size() - 1;

  // Neurons read alone at least twice, most often first: at most 2 x max_count of them are placed.
  std::vector<uint32_t> cand;
  for (uint32_t v = 0; v < n; ++v)
    if (lone_count[v] >= 2) cand.push_back(v);
  std::stable_sort(cand.begin(), cand.end(), [&](uint32_t x, uint32_t y) { return lone_count[x] > lone_count[y]; });
  if (cand.size() > 2 * size_t(max_count)) cand.resize(2 * size_t(max_count));
  std::vector<int32_t> cand_of(n, -1);

  const double a_us = cost.read_us, b_us = cost.bundle_us();
  const uint32_t far = cost.merge_gap + 1;  // a copy within the merge gap of its own slot gains nothing
  std::vector<ReplicaCandidate> out;
  constexpr size_t kChunk = 256;  // candidates counted at once: kChunk x 2n counters
  std::vector<uint16_t> cnt;
  for (size_t c0 = 0; c0 < cand.size(); c0 += kChunk) {
    const size_t c1 = std::min(cand.size(), c0 + kChunk);
    for (size_t c = c0; c < c1; ++c) cand_of[cand[c]] = int32_t(c - c0);
    cnt.assign((c1 - c0) * 2 * size_t(n), 0);
    for (size_t t = 0; t < n_tok; ++t) {
      for (uint64_t li = lone_at[t]; li < lone_at[t + 1]; ++li) {
        const uint32_t p = lone[li];
        const int32_t ci = cand_of[order[p]];
        if (ci < 0) continue;
        uint16_t* row = cnt.data() + size_t(ci) * 2 * n;
        for (uint64_t ai = anchors_at[t]; ai < anchors_at[t + 1]; ++ai) {
          const uint32_t q = anchors[ai] / 2;
          if ((q > p ? q - p : p - q) <= far) continue;
          if (row[anchors[ai]] < UINT16_MAX) ++row[anchors[ai]];
        }
      }
    }
    for (size_t c = c0; c < c1; ++c) {
      const uint16_t* row = cnt.data() + (c - c0) * 2 * n;
      ReplicaCandidate best;
      best.neuron = cand[c];
      for (uint32_t x = 0; x < 2 * n; ++x) {
        if (row[x] < 2) continue;
        const uint32_t q = x / 2;
        const bool after = x & 1;
        // the pair the copy would sit between: (q, q + 1) after, (q - 1, q) before
        const uint32_t pen = after ? (q + 1 < n ? adj[q] : 0) : (q > 0 ? adj[q - 1] : 0);
        const double s = double(row[x]) * a_us - double(pen) * b_us;
        if (s > best.saving_us) best.anchor = q, best.after = after, best.tokens = row[x], best.saving_us = s;
      }
      if (best.saving_us > 0) out.push_back(best);
      cand_of[cand[c]] = -1;
    }
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const ReplicaCandidate& x, const ReplicaCandidate& y) { return x.saving_us > y.saving_us; });
  if (out.size() > max_count) out.resize(max_count);
  return out;
}

Order insert_replicas(const Order& order, const std::vector<ReplicaCandidate>& candidates, size_t count) {
  count = std::min(count, candidates.size());
  const size_t n = order.size();
  // Per anchor slot, the copies before it and after it, the better-ranked nearest to the anchor.
  std::vector<std::vector<uint32_t>> before(n), after(n);
  for (size_t k = 0; k < count; ++k) {
    const ReplicaCandidate& c = candidates[k];
    if (c.anchor >= n || c.neuron >= n) throw InternalError("replicate: candidate out of range");
    (c.after ? after : before)[c.anchor].push_back(c.neuron);
  }
  Order out;
  out.reserve(n + count);
  for (size_t s = 0; s < n; ++s) {
    for (auto it = before[s].rbegin(); it != before[s].rend(); ++it) out.push_back(*it);
    out.push_back(order[s]);
    for (uint32_t v : after[s]) out.push_back(v);
  }
  return out;
}

ReplicateResult replicate_layer(const LayerMask& m_build, const TokenMajorMask& tm_build, const LayerMask& m_val,
                                const TokenMajorMask& tm_val, const Order& order, const LayerCachePolicy& policy,
                                const CostModel& cost, uint32_t layer_index, double share) {
  ReplicateResult r;
  r.order = order;
  const uint32_t n = m_build.n_neurons;
  const uint32_t budget = replica_budget(share, n);
  EvalConfig ev = cost.exact;
  ev.token_begin = tm_val.begin;
  ev.token_end = tm_val.end;
  const LayerEval base = evaluate_layer(m_val, order, ev, layer_index, &policy, nullptr, nullptr, &tm_val);
  r.base_ms = r.chosen_ms = base.io_ms_per_token();
  char buf[64];
  std::snprintf(buf, sizeof buf, "0 %.4f", r.base_ms);
  r.summary = buf;
  if (budget == 0) return r;
  const std::vector<ReplicaCandidate> cands =
      replica_candidates(m_build, tm_build, order, cost, layer_index, &policy, budget);
  double best = base.io_seconds;
  size_t last = 0;
  for (uint32_t div : {4u, 2u, 1u}) {
    const size_t k = std::min<size_t>(cands.size(), budget / div);
    if (k == 0 || k == last) continue;
    last = k;
    Order o = insert_replicas(order, cands, k);
    const LayerEval e = evaluate_layer(m_val, o, ev, layer_index, &policy, nullptr, nullptr, &tm_val);
    std::snprintf(buf, sizeof buf, ", %zu %.4f", k, e.io_ms_per_token());
    r.summary += buf;
    if (e.io_seconds < best) {
      best = e.io_seconds;
      r.order = std::move(o);
      r.replicas = uint32_t(k);
      r.chosen_ms = e.io_ms_per_token();
    }
  }
  std::snprintf(buf, sizeof buf, "; kept %u", r.replicas);
  r.summary += buf;
  return r;
}

}  // namespace nl
