// Layout-free trace statistics (active share, persistence, identity read length, top-2 co-firing) and the
// order-gain predictor fitted on the synthetic structure sweep.
#include "layout/trace_stats.h"

#include <algorithm>
#include <cmath>

#include "formats/core/bitmask.h"
#include "formats/core/error.h"
#include "formats/trace.h"

namespace nl {

void TraceStructureSums::add(const TraceStructureSums& o) {
  slots += o.slots;
  active += o.active;
  runs += o.runs;
  persist_pairs += o.persist_pairs;
  persist_base += o.persist_base;
  cofire_sum += o.cofire_sum;
  excess_sum += o.excess_sum;
  cofire_samples += o.cofire_samples;
  cofire_tokens = o.cofire_tokens;
}

TraceStructureStats trace_structure_stats(const TraceStructureSums& s) {
  TraceStructureStats r;
  r.active_share = s.slots ? double(s.active) / double(s.slots) : 0.0;
  r.persistence = s.persist_base ? double(s.persist_pairs) / double(s.persist_base) : 0.0;
  r.identity_run = s.runs ? double(s.active) / double(s.runs) : 0.0;
  r.cofire = s.cofire_samples ? s.cofire_sum / double(s.cofire_samples) : 0.0;
  r.excess = s.cofire_samples ? s.excess_sum / double(s.cofire_samples) : 0.0;
  r.headroom = r.identity_run > 0 ? 1.0 / (1.0 - std::min(r.cofire, kCofireCap)) / r.identity_run : 0.0;
  r.cofire_tokens = s.cofire_tokens;
  return r;
}

namespace {

// Per word of the trace: bit t%64 set iff token t has a successor in its sequence (t + 1 < n_tokens and t + 1
// does not start a sequence).
std::vector<uint64_t> successor_mask(uint64_t n_tokens, const std::vector<int64_t>& sequences) {
  std::vector<uint64_t> m(words_for_tokens(n_tokens), 0);
  for (uint64_t t = 0; t + 1 < n_tokens; ++t) m[t >> 6] |= uint64_t(1) << (t & 63);
  for (int64_t s : sequences)
    if (s > 0 && uint64_t(s) <= n_tokens) m[(s - 1) >> 6] &= ~(uint64_t(1) << ((s - 1) & 63));
  return m;
}

// Active, runs and persistence over words [0, count) of a chunk of neuron-major rows of `stride` words whose first
// word is the trace's word w0; word `count` (when < stride) is the next chunk's first word, for the carry.
NL_POPCNT_CLONES
void add_chunk(const uint64_t* rows, uint32_t n, uint64_t stride, uint64_t count, uint64_t w0,
               const std::vector<uint64_t>& succ, TraceStructureSums& s) {
  for (uint32_t v = 0; v < n; ++v) {
    const uint64_t* r = rows + size_t(v) * stride;
    const uint64_t* p = v ? rows + size_t(v - 1) * stride : nullptr;
    for (uint64_t w = 0; w < count; ++w) {
      const uint64_t x = r[w];
      if (!x) continue;
      s.active += uint64_t(__builtin_popcountll(x));
      s.runs += uint64_t(__builtin_popcountll(p ? x & ~p[w] : x));  // a run starts where v−1 is silent
      const uint64_t next = (x >> 1) | (w + 1 < stride ? r[w + 1] << 63 : 0);
      const uint64_t base = x & succ[w0 + w];
      s.persist_base += uint64_t(__builtin_popcountll(base));
      s.persist_pairs += uint64_t(__builtin_popcountll(base & next));
    }
  }
}

// κ's sum over kCofireSamples neurons drawn systematically in proportion to their counts in the given rows.
NL_POPCNT_CLONES
void add_cofire(const uint64_t* rows, uint32_t n, uint64_t words, uint64_t tokens, TraceStructureSums& s) {
  std::vector<uint64_t> count(n, 0);
  uint64_t total = 0;
  for (uint32_t v = 0; v < n; ++v) {
    const uint64_t* r = rows + size_t(v) * words;
    for (uint64_t w = 0; w < words; ++w) count[v] += uint64_t(__builtin_popcountll(r[w]));
    total += count[v];
  }
  if (!total || n < 2) return;
  uint32_t v = 0;
  uint64_t cum = count[0];
  for (uint32_t i = 0; i < kCofireSamples; ++i) {
    // Systematic sampling: the (i + ½)/M quantile of the activation mass (deterministic, low variance).
    const double target = (double(i) + 0.5) * double(total) / double(kCofireSamples);
    while (double(cum) <= target && v + 1 < n) cum += count[++v];
    const uint64_t* a = rows + size_t(v) * words;
    uint64_t best1 = 0, best2 = 0;
    double ex1 = -1, ex2 = -1;  // top-2 excess P(u | v) − P(u)
    for (uint32_t u = 0; u < n; ++u) {
      if (u == v) continue;
      const uint64_t* b = rows + size_t(u) * words;
      uint64_t c = 0;
      for (uint64_t w = 0; w < words; ++w) c += uint64_t(__builtin_popcountll(a[w] & b[w]));
      if (c > best1) {
        best2 = best1;
        best1 = c;
      } else if (c > best2) {
        best2 = c;
      }
      const double e = double(c) / double(count[v]) - double(count[u]) / double(tokens);
      if (e > ex1) {
        ex2 = ex1;
        ex1 = e;
      } else if (e > ex2) {
        ex2 = e;
      }
    }
    s.cofire_sum += double(best1 + best2) / (2.0 * double(count[v]));
    s.excess_sum += (ex1 + ex2) / 2.0;
    ++s.cofire_samples;
  }
}

}  // namespace

TraceStructureSums layer_structure_sums(const uint64_t* rows, uint32_t n_neurons, uint64_t n_tokens, uint64_t words,
                                        const std::vector<int64_t>& sequences) {
  if (words != words_for_tokens(n_tokens)) throw InternalError("layer_structure_sums: words do not match tokens");
  TraceStructureSums s;
  s.slots = uint64_t(n_neurons) * n_tokens;
  add_chunk(rows, n_neurons, words, words, 0, successor_mask(n_tokens, sequences), s);
  // κ on the first kCofireTokens tokens: copy that prefix of every row.
  const uint64_t kw = std::min(words, words_for_tokens(kCofireTokens));
  std::vector<uint64_t> prefix(size_t(n_neurons) * kw);
  for (uint32_t v = 0; v < n_neurons; ++v)
    std::copy(rows + size_t(v) * words, rows + size_t(v) * words + kw, prefix.begin() + ptrdiff_t(size_t(v) * kw));
  add_cofire(prefix.data(), n_neurons, kw, std::min(n_tokens, kCofireTokens), s);
  s.cofire_tokens = std::min(n_tokens, kCofireTokens);
  return s;
}

TraceStructureStats trace_structure_stats(const TraceReader& tr) {
  const TraceInfo& ti = tr.info();
  const uint64_t words = words_for_tokens(ti.n_tokens);
  const std::vector<uint64_t> succ = successor_mask(ti.n_tokens, ti.sequences);
  constexpr uint64_t kChunkWords = 64;  // 4,096 tokens per chunk, plus one word of carry
  TraceStructureSums all;
  for (uint32_t l = 0; l < ti.n_layers; ++l) {
    const uint32_t n = ti.n_neurons[l];
    TraceStructureSums s;
    s.slots = uint64_t(n) * ti.n_tokens;
    for (uint64_t w0 = 0; w0 < words; w0 += kChunkWords) {
      const uint64_t count = std::min(kChunkWords, words - w0);
      const uint64_t stride = std::min(count + 1, words - w0);
      std::vector<uint64_t> rows = tr.read_layer_words(l, w0, stride);
      add_chunk(rows.data(), n, stride, count, w0, succ, s);
    }
    const uint64_t kw = std::min(words, words_for_tokens(kCofireTokens));
    std::vector<uint64_t> prefix = tr.read_layer_words(l, 0, kw);
    add_cofire(prefix.data(), n, kw, std::min(ti.n_tokens, kCofireTokens), s);
    s.cofire_tokens = std::min(ti.n_tokens, kCofireTokens);
    all.add(s);
  }
  return trace_structure_stats(all);
}

double read_cost_bundles(double read_latency_us, double bandwidth_MBps, uint64_t bundle_bytes) {
  return bundle_bytes ? read_latency_us * 1e-6 * bandwidth_MBps * 1e6 / double(bundle_bytes) : 0.0;
}

double modelled_gain(const TraceStructureStats& s, double read_latency_us, double bandwidth_MBps,
                     uint64_t bundle_bytes) {
  if (!(s.identity_run > 0) || !bundle_bytes) return 0.0;
  const double r = read_cost_bundles(read_latency_us, bandwidth_MBps, bundle_bytes);
  return (r / s.identity_run + 1.0) / (r * (1.0 - std::min(s.cofire, kCofireCap)) + 1.0);
}

GainPrediction predict_order_gain(double modelled_gain, const std::string& method) {
  // log(gain) = c0 + c1·log(M), gain = identity's held-out I/O ms/token with the best of three caches ÷ the
  // method's; [loo_min, loo_max] = the extreme leave-one-out log residuals. Fitted by bench/structure_sweep.py on
  // its synthetic points (docs/benchmarks.md "When does the order matter"); regenerate with
  // `bench/structure_sweep.py --json sweep.json` and copy the printed fit lines here.
  struct Fit {
    double c0, c1, loo_min, loo_max;
  };
  // 25 synthetic points, 2026-12-02 (leave-one-out rms of the log: greedy 0.225, ours 0.112).
  static constexpr Fit kGreedy{-0.150307, 0.380226, -0.383089, 0.354910},
      kOurs{0.011277, 0.458653, -0.158873, 0.229161};
  if (method != "greedy" && method != "greedy+ls") throw InternalError("predict_order_gain: unknown method " + method);
  if (!(modelled_gain > 0)) return {};
  const Fit& f = method == "greedy" ? kGreedy : kOurs;
  const double mid = std::exp(f.c0 + f.c1 * std::log(modelled_gain));
  return {mid * std::exp(f.loo_min), mid, mid * std::exp(f.loo_max)};
}

}  // namespace nl
