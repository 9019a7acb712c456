#include "layout/solve.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>

#include "formats/core/error.h"
#include "formats/sha256.h"
#include "formats/trace.h"
#include "layout/pins.h"
#include "layout/replicate.h"
#include "layout/span.h"
#include "runtime/plan/replica_cover.h"

namespace nl {

TokenSplit validation_split(const std::vector<int64_t>& sequence_starts, uint64_t n_tokens, double share) {
  if (!(share >= 0 && share < 1)) throw UsageError("validation share must be in [0, 1)");
  TokenSplit s;
  s.n_tokens = s.build_end = n_tokens;
  if (share == 0 || n_tokens < 2) return s;
  std::vector<uint64_t> starts = {0};  // the sequences that hold tokens, ascending
  for (int64_t x : sequence_starts)
    if (x > 0 && uint64_t(x) < n_tokens && uint64_t(x) > starts.back()) starts.push_back(uint64_t(x));
  const uint64_t n_seq = starts.size();
  if (n_seq >= 2) {
    const uint64_t k = std::clamp<uint64_t>(uint64_t(std::ceil(share * double(n_seq) - 1e-9)), 1, n_seq - 1);
    s.build_end = starts[n_seq - k];
    s.validation_sequences = k;
  } else {
    s.build_end = std::clamp<uint64_t>(uint64_t(std::floor((1 - share) * double(n_tokens))), 1, n_tokens - 1);
  }
  return s;
}

LayerMask mask_tokens(const LayerMask& m, uint64_t begin, uint64_t end) {
  end = std::min(end, m.n_tokens);
  begin = std::min(begin, end);
  LayerMask out(m.n_neurons, end - begin);
  const uint64_t shift = begin & 63, w0 = begin >> 6, src_end = words_for_tokens(end);
  for (uint32_t v = 0; v < m.n_neurons; ++v) {
    const uint64_t* r = m.row(v);
    uint64_t* o = out.row(v);
    for (uint64_t w = 0; w < out.words; ++w) {
      uint64_t x = r[w0 + w] >> shift;
      if (shift && w0 + w + 1 < src_end) x |= r[w0 + w + 1] << (64 - shift);
      o[w] = x;
    }
    const uint64_t tail = out.n_tokens & 63;  // bits past the slice's last token
    if (tail && out.words) o[out.words - 1] &= (uint64_t(1) << tail) - 1;
  }
  return out;
}

LayerMask split_mask_tokens(LayerMask& m, uint64_t end) {
  end = std::min(end, m.n_tokens);
  LayerMask rest = mask_tokens(m, end, m.n_tokens);
  // Rows move down in place (row v's new start is never after its old one): no second copy of the build part.
  const uint64_t old_words = m.words, wb = words_for_tokens(end), tail = end & 63;
  for (uint32_t v = 0; v < m.n_neurons; ++v) {
    uint64_t* dst = m.bits.data() + size_t(v) * wb;
    std::memmove(dst, m.bits.data() + size_t(v) * old_words, wb * sizeof(uint64_t));
    if (tail && wb) dst[wb - 1] &= (uint64_t(1) << tail) - 1;  // bits past the prefix's last token
  }
  m.n_tokens = end;
  m.words = wb;
  m.bits.resize(size_t(m.n_neurons) * wb);
  return rest;
}

uint64_t order_hash(const Order& order) {
  uint64_t h = 1469598103934665603ull;
  for (uint32_t v : order)
    for (int b = 0; b < 4; ++b) h = (h ^ ((v >> (8 * b)) & 0xFF)) * 1099511628211ull;
  return h;
}

void PhaseTimes::add(const std::string& name, double seconds) {
  for (auto& [n, v] : list)
    if (n == name) {
      v += seconds;
      return;
    }
  list.emplace_back(name, seconds);
}

double PhaseTimes::operator[](const std::string& name) const {
  for (const auto& [n, v] : list)
    if (n == name) return v;
  return 0;
}

double LayerSolve::seconds_ls() const {
  double s = 0;
  for (const auto& [n, v] : phases.list)
    if (n.rfind("build ", 0) == 0 || n.rfind("select ", 0) == 0 || n == "rebuild" || n == "replicate") s += v;
  return s;  // "build figures" starts with "build "
}

bool keeps_full_matrix(uint32_t n_neurons, const SolveOptions& opt) {
  const uint64_t pairs = uint64_t(n_neurons) * (n_neurons > 0 ? n_neurons - 1 : 0) / 2;
  return (opt.method == "greedy" || opt.method == "greedy+ls") && pairs * 4 <= opt.full_matrix_bytes;
}

bool runs_ends_in(uint32_t n_neurons, uint32_t merge_gap, const SolveOptions& opt) {
  return merge_gap > opt.ls.max_window && n_neurons >= 4;
}

namespace {

double seconds_since(std::chrono::steady_clock::time_point& t) {
  const auto now = std::chrono::steady_clock::now();
  const double d = std::chrono::duration<double>(now - t).count();
  t = now;
  return d;
}

// The paper's pipeline's and every candidate's cache policy as a label, so that a recipe chosen on the build tokens
// can be rebuilt on all of them (pinned sets are recomputed there).
struct Build {
  std::string label;
  Order order;
  std::vector<LayerCachePolicy> policies;  // [0] is the evaluator's cache (the paper's: nothing recorded)
  std::vector<std::string> policy_labels;
  void add(std::string l, LayerCachePolicy p) {
    policy_labels.push_back(std::move(l));
    policies.push_back(std::move(p));
  }
};

// What the candidate families of one layer are built from: the build tokens, or every profile token for the rebuild.
struct FamilyInput {
  const LayerMask& m;
  const LayerGraph& g;
  const TokenMajorMask& tm;  // the first guard_tokens of m: pinned sets and the peel are measured there
  const SolveOptions& opt;
  const CostModel& cost;  // every estimate and the exact measure (layout/cost_model.h)
  LsOptions lo;
  uint32_t cap = 0, n_pin = 0;
  bool can_pin = false;
  std::vector<uint32_t> hot_pins;
  std::vector<uint32_t> hot_rank;  // every neuron, hottest first (the value cache's order within a class)
  Order greedy;
  GreedyFirstBand band;  // greedy's runs on subsets reuse it

  FamilyInput(const LayerMask& mask, const LayerGraph& graph, const TokenMajorMask& t, const SolveOptions& o,
              const CostModel& c)
      : m(mask), g(graph), tm(t), opt(o), cost(c) {
    lo = opt.ls;
    lo.cost = cost;
    // Without the weight guard the path weight is a diagnostic, so the search may lower it, and a small layer's
    // search runs to min_evaluations (with the guard: the earlier pipeline, byte for byte).
    if (lo.max_evaluations == 0) {
      lo.max_evaluations = std::max<uint64_t>(uint64_t(opt.evaluations_per_neuron) * m.n_neurons,
                                              opt.guard_weight ? 0 : opt.min_evaluations);
      if (!opt.guard_weight && cost.merge_gap + 1 <= lo.max_window && m.n_neurons > 0)
        lo.max_evaluations =
            std::max(lo.max_evaluations, std::min(opt.converge_evaluations, opt.converge_work / uint64_t(m.n_neurons)));
    }
    if (!opt.guard_weight) lo.keep_weight = false;
    if (opt.guard_weight) lo.max_neighbours = 0;  // the earlier pipeline: a fixed list length
    cap = cost.cache_capacity;
    n_pin = uint32_t(std::floor(opt.pin_share * cap + 1e-9));
    can_pin = n_pin > 0 && n_pin < m.n_neurons;
    if (can_pin) hot_pins = hottest(g.freq, n_pin);
    if (cap > 0) hot_rank = hottest(g.freq, m.n_neurons);
  }
  // The value cache (runtime/plan/slot_cache.h), nothing pinned.
  LayerCachePolicy value() const { return LayerCachePolicy{CacheAdmission::kValue, {}, 0, hot_rank}; }
  // The policies every searched order is measured under before its pinned ones: the paper's cache (full set only),
  // the value cache (early in the list: where it wins, the S3-FIFO policies measured after it stop early), and the
  // admission rule with nothing pinned (full set, or where nothing can be pinned).
  void add_common(Build& b) const {
    if (opt.full_candidates) b.add("paper's cache", LayerCachePolicy{});
    if (cap > 0) b.add("value", value());
    if (opt.full_candidates || !can_pin)
      b.add(cache_admission_name(opt.admission), LayerCachePolicy{opt.admission, {}});
  }
  std::string pol_label(CacheAdmission admission, const std::string& pins) const {
    return cache_admission_name(admission) + (pins.empty() ? "" : "+" + pins);
  }
};

// `only` (optional): build just the candidate with that label (the rebuild of a chosen recipe).
bool wanted(const std::string* only, const std::string& label) { return !only || *only == label; }

// The paper's pipeline: greedy with the evaluator's (linking-aligned) cache.
std::vector<Build> family_paper(FamilyInput& in) {
  Build b;
  b.label = "greedy";
  b.order = in.greedy;
  b.add("paper's cache", LayerCachePolicy{});
  return {b};
}

// The order searched from greedy (layout/local_search.h) with the cache policies designed for it: admission `all`
// with nothing pinned, the hottest neurons pinned where they are (all of the pinned share, or 6/8, 5/8, 4/8 of it
// with the rest of the capacity S3-FIFO admitting every miss or only misses read alone), and the full set refined
// for this order (layout/pins.h).
std::vector<Build> family_search(FamilyInput& in, LsStats* ls, PinRefineStats* pins, LayerSolve* r) {
  const SolveOptions& opt = in.opt;
  auto t = std::chrono::steady_clock::now();
  Build b;
  b.label = "search";
  b.order = local_search(in.m, in.g, in.greedy, in.lo, ls);
  if (r) r->phases.add("search: local search", seconds_since(t));
  in.add_common(b);
  if (in.can_pin) b.add(in.pol_label(opt.admission, "hot"), LayerCachePolicy{opt.admission, in.hot_pins});
  for (uint32_t q : {6u, 5u, 4u}) {
    if (!opt.full_candidates) break;  // the partial pinned sets are in the full set only
    const uint32_t k = in.n_pin * q / 8;
    if (!in.can_pin || k == 0 || k >= in.n_pin) continue;
    std::vector<uint32_t> part(in.hot_pins.begin(), in.hot_pins.begin() + k);
    const std::string pl = "hot" + std::to_string(q) + "/8";
    b.add(in.pol_label(opt.admission, pl), LayerCachePolicy{opt.admission, part});
    if (opt.admission != CacheAdmission::kIsolated)
      b.add(in.pol_label(CacheAdmission::kIsolated, pl), LayerCachePolicy{CacheAdmission::kIsolated, std::move(part)});
  }
  if (in.can_pin && opt.pin_rounds > 0) {
    PinRefineStats st;
    std::vector<uint32_t> refined =
        refine_pins(in.tm, b.order, in.hot_pins, in.g.freq, in.cost, opt.pin_rounds, opt.ls.sample_tokens, &st);
    if (pins) *pins = st;
    if (st.swaps > 0)
      b.add(in.pol_label(opt.admission, "refined"), LayerCachePolicy{opt.admission, std::move(refined)});
    if (r) r->phases.add("search: pins", seconds_since(t));
  }
  return {b};
}

// The hottest neurons pinned; the path is solved without them (greedy on the cold neurons' own co-activation, i.e. on
// the miss stream), and they sit in a block at the end ordered by greedy among themselves so that gap-0 reads without a
// cache stay low too; then the search with the pinned rows treated as free.
std::vector<Build> family_pinned(FamilyInput& in) {
  if (!in.can_pin) return {};
  const LayerMask& m = in.m;
  const LayerGraph& g = in.g;
  std::vector<uint8_t> cold(m.n_neurons, 1);
  for (uint32_t v : in.hot_pins) cold[v] = 0;
  Order cp = solve_greedy_subset(g, &m, &cold, nullptr, nullptr, &in.band);
  for (auto& c : cold) c ^= 1;
  Order hp = solve_greedy_subset(g, &m, &cold, nullptr, nullptr, &in.band);
  uint64_t bw = 0;
  int bo = 0;
  for (int o = 0; o < 4; ++o) {  // orient the two paths for the most co-activated junction
    uint32_t a = (o & 1) ? cp.front() : cp.back(), b = (o & 2) ? hp.back() : hp.front();
    uint64_t c = pair_count(g, m, a, b);
    if (c > bw) bw = c, bo = o;
  }
  if (bo & 1) std::reverse(cp.begin(), cp.end());
  if (bo & 2) std::reverse(hp.begin(), hp.end());
  Order seed = cp;
  seed.insert(seed.end(), hp.begin(), hp.end());
  LsOptions lp = in.lo;
  lp.hot_count = in.n_pin;
  LsStats st;
  Build b;
  b.label = "pinned";
  b.order = local_search(m, g, seed, lp, &st);
  in.add_common(b);
  b.add(in.pol_label(in.opt.admission, "hot"), LayerCachePolicy{in.opt.admission, in.hot_pins});
  return {b};
}

// Layers read in few long pieces (the merge gap is wider than the search's windows, so it cannot see what a move
// does to a read's span): the order built from both ends inwards (layout/span.h) with the pinned neurons in a block
// after it (never read while resident). Where both ends' unions already cover all but a share `eps` of the tokens,
// the order changes the span little, so the neurons left there, and the pinned block, are ordered by greedy among
// themselves for the path weight (gap-0 reads). Without the weight guard one peel (the one with the hottest pinned,
// or the unpinned one where nothing can be pinned) is also polished by slot swaps on the exact one-read cost
// (block-aligned span); polishing the others too cost time and never won on the real traces.
std::vector<Build> family_ends_in(FamilyInput& in, const std::string* only) {
  const LayerMask& m = in.m;
  const LayerGraph& g = in.g;
  const TokenMajorMask& tm = in.tm;
  const SolveOptions& opt = in.opt;
  std::vector<Build> out;
  if (!runs_ends_in(m.n_neurons, in.cost.merge_gap, opt)) return out;
  auto peel = [&](const std::vector<uint32_t>& pins) {
    std::vector<uint8_t> inc(m.n_neurons, 1);
    for (uint32_t v : pins) inc[v] = 0;
    return solve_ends_in(tm, inc);
  };
  auto compose = [&](const EndsIn& e, const std::vector<uint32_t>& pins, double eps) {
    const uint64_t n_tok = tm.end - tm.begin;
    const uint64_t need = n_tok - uint64_t(eps * double(n_tok));
    auto kept = [&](const std::vector<uint64_t>& cover) {  // end neurons up to the first covering `need`
      size_t k = 0;
      while (k < cover.size() && cover[k] < need) ++k;
      return std::min(cover.size(), k + 1);
    };
    const size_t kl = kept(e.cover_left), kr = kept(e.cover_right);
    auto greedy_of = [&](const std::vector<uint8_t>& inc, uint32_t after) {  // oriented to join `after`
      Order p = solve_greedy_subset(g, &m, &inc, nullptr, nullptr, &in.band);
      if (after < m.n_neurons && p.size() > 1 && pair_count(g, m, after, p.back()) > pair_count(g, m, after, p.front()))
        std::reverse(p.begin(), p.end());
      return p;
    };
    std::vector<uint8_t> mid(m.n_neurons, 0);
    for (size_t i = kl; i < e.left.size(); ++i) mid[e.left[i]] = 1;
    for (size_t i = kr; i < e.right.size(); ++i) mid[e.right[i]] = 1;
    Order o(e.left.begin(), e.left.begin() + std::ptrdiff_t(kl));
    const Order mp = greedy_of(mid, o.empty() ? m.n_neurons : o.back());
    o.insert(o.end(), mp.begin(), mp.end());
    for (size_t i = kr; i-- > 0;) o.push_back(e.right[i]);
    if (!pins.empty()) {
      std::vector<uint8_t> pin(m.n_neurons, 0);
      for (uint32_t v : pins) pin[v] = 1;
      const Order hp = greedy_of(pin, o.empty() ? m.n_neurons : o.back());
      o.insert(o.end(), hp.begin(), hp.end());
    }
    return o;
  };
  auto polish = [&](const Order& o, const std::vector<uint32_t>& pins) {
    return polish_span(tm, o, pins, in.cost, 4, opt.ls.sample_tokens, opt.polish_work);
  };
  auto eps_label = [](const std::string& base, double eps) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%s eps %g", base.c_str(), eps);
    return std::string(buf);
  };
  auto add = [&](std::string label, Order o, const std::vector<std::pair<std::string, LayerCachePolicy>>& pols) {
    Build b;
    b.label = std::move(label);
    b.order = std::move(o);
    in.add_common(b);
    for (const auto& [l, p] : pols) b.add(l, p);
    out.push_back(std::move(b));
  };
  auto any_wanted = [&](const std::string& base) { return !only || only->rfind(base, 0) == 0; };
  const std::vector<double> shares = {0.0, 0.002, 0.02, 0.1, 0.3};
  const std::string hot_l = in.pol_label(opt.admission, "hot"), ref_l = in.pol_label(opt.admission, "refined");
  if (any_wanted("ends-in ") || any_wanted("ends-in polish")) {
    const EndsIn all = peel({});
    for (double eps : shares)
      if (wanted(only, eps_label("ends-in", eps))) add(eps_label("ends-in", eps), compose(all, {}, eps), {});
    if (!opt.guard_weight && !in.can_pin && wanted(only, "ends-in polish"))
      add("ends-in polish", polish(compose(all, {}, 0.0), {}), {});
  }
  if (!in.can_pin || !any_wanted("ends-in+")) return out;
  const EndsIn cold = peel(in.hot_pins);
  std::vector<uint32_t> refined;
  if (opt.pin_rounds > 0) {
    PinRefineStats ps;
    refined = refine_pins(tm, compose(cold, in.hot_pins, 0.0), in.hot_pins, g.freq, in.cost, opt.pin_rounds,
                          opt.ls.sample_tokens, &ps);
    if (ps.swaps == 0) refined.clear();
  }
  for (double eps : shares) {
    if (!wanted(only, eps_label("ends-in+hot", eps))) continue;
    std::vector<std::pair<std::string, LayerCachePolicy>> pols = {
        {hot_l, LayerCachePolicy{opt.admission, in.hot_pins}}};
    if (!refined.empty()) pols.emplace_back(ref_l, LayerCachePolicy{opt.admission, refined});
    add(eps_label("ends-in+hot", eps), compose(cold, in.hot_pins, eps), pols);
  }
  if (!opt.guard_weight && wanted(only, "ends-in+hot polish"))
    add("ends-in+hot polish", polish(compose(cold, in.hot_pins, 0.0), in.hot_pins),
        {{hot_l, LayerCachePolicy{opt.admission, in.hot_pins}}});
  if (!refined.empty() && any_wanted("ends-in+refined")) {
    const EndsIn rest = peel(refined);
    for (double eps : shares)
      if (wanted(only, eps_label("ends-in+refined", eps)))
        add(eps_label("ends-in+refined", eps), compose(rest, refined, eps),
            {{ref_l, LayerCachePolicy{opt.admission, refined}}});
  }
  return out;
}

// The choice between candidates: each build's order under each of its cache policies on the validation tokens (one
// pass per order), then the two best policies that leave part of the capacity to S3-FIFO again with a larger small
// FIFO: with strong token-to-token persistence a neuron's second access comes one token after its first, and a 10 %
// small queue has evicted it (to the ghost list) by then, so the second access misses too. (Only two: each policy
// costs a planner and cache pass over the validation tokens.) The first strictly better candidate wins ties.
struct Selection {
  const LayerMask& m;  // the mask the validation tokens come from (tm)
  const TokenMajorMask& tm;
  EvalConfig ev;  // token range = tm's
  uint32_t layer = 0, cap = 0;
  const SolveOptions& opt;
  const LayerGraph& g_build;
  const LayerMask& m_build;
  uint64_t w_greedy = 0;

  Selection(const LayerMask& mask, const TokenMajorMask& t, const EvalConfig& e, uint32_t l, uint32_t c,
            const SolveOptions& o, const LayerGraph& gb, const LayerMask& mbuild)
      : m(mask), tm(t), ev(e), layer(l), cap(c), opt(o), g_build(gb), m_build(mbuild) {}

  double best_io = std::numeric_limits<double>::infinity();
  Order best;
  LayerCachePolicy best_policy;
  std::string best_family, best_build, best_policy_label;

  std::vector<CandidateFigure>* seen = nullptr;

  void offer(const std::string& family, const std::vector<Build>& builds, FamilyFigure& fig, bool small_pass = true) {
    fig.family = family;
    double fig_io = std::numeric_limits<double>::infinity();
    for (const Build& b : builds) {
      ++fig.candidates;
      const uint64_t hash = order_hash(b.order);
      if (opt.guard_weight && path_weight(g_build, m_build, b.order) < w_greedy) {
        ++fig.refused;
        if (seen) seen->push_back({family, b.label, -1.0, hash});
        continue;
      }
      const OrderPass pass(m, b.order, ev, layer, &tm);  // the order's slot lists, for every policy below
      // One policy's pass, stopped (opt.early_stop) once its I/O time reaches `bound`: a pass's time only grows, and
      // the first strictly better candidate wins, so a candidate stopped at a bound that is at least the family's
      // best so far changes neither the family's figure nor the winner. Returns its time (infinity if stopped).
      auto measure = [&](const LayerCachePolicy& pol, const std::string& label, double bound) {
        bool stopped = false;
        const LayerEval e = pass.run(&pol, opt.early_stop ? bound : std::numeric_limits<double>::infinity(), &stopped);
        const double io = stopped ? std::numeric_limits<double>::infinity() : e.io_seconds;
        if (seen) {
          // Stopped: the time so far over every token, a lower bound on the candidate's figure.
          const double ms =
              stopped ? 1e3 * e.io_seconds / double(std::max<uint64_t>(1, pass.tokens())) : e.io_ms_per_token();
          seen->push_back({family, b.label + ", " + label, ms, hash, stopped});
        }
        if (io < fig_io) fig_io = io, fig.validation_ms = e.io_ms_per_token(), fig.best = b.label + ", " + label;
        if (io < best_io) {
          best_io = io, best = b.order, best_policy = pol;
          best_family = family, best_build = b.label, best_policy_label = label;
        }
        return io;
      };
      // The small-FIFO retry takes the two best policies that leave part of the capacity to S3-FIFO (ties: the
      // earlier), so such a policy also runs to the end while it may still be one of them: its bound is the larger
      // of the family's best and the second best of them so far.
      const bool retry = small_pass && opt.full_candidates && opt.small_fraction > 0;
      auto eligible = [&](const LayerCachePolicy& p) {
        return p.admission != CacheAdmission::kValue && p.pinned.size() < cap;  // the value cache has no FIFO
      };
      std::vector<double> ios(b.policies.size());
      double first = std::numeric_limits<double>::infinity(), second = first;  // the two best eligible so far
      for (size_t k = 0; k < b.policies.size(); ++k) {
        const bool el = retry && eligible(b.policies[k]);
        ios[k] = measure(b.policies[k], b.policy_labels[k], el ? std::max(fig_io, second) : fig_io);
        if (el && ios[k] < second) (ios[k] < first ? (second = first, first = ios[k]) : second = ios[k]);
      }
      if (!retry) continue;
      std::vector<size_t> idx;
      for (size_t k = 0; k < b.policies.size(); ++k)
        if (eligible(b.policies[k])) idx.push_back(k);
      // A stopped policy's time is infinity here: it was no better than two earlier ones, so the two taken are the
      // same.
      std::stable_sort(idx.begin(), idx.end(), [&](size_t x, size_t y) { return ios[x] < ios[y]; });
      for (size_t i = 0; i < idx.size() && i < 2; ++i) {
        LayerCachePolicy q = b.policies[idx[i]];
        q.small_fraction = opt.small_fraction;
        measure(q, small_label(b.policy_labels[idx[i]]), fig_io);
      }
    }
  }
  std::string small_label(const std::string& l) const {
    char buf[32];
    std::snprintf(buf, sizeof buf, ", small FIFO %g", opt.small_fraction);
    return l + buf;
  }
};

// Runs one family on `in`: the candidates the selection compares, or (only != nullptr) just the one with that label.
std::vector<Build> run_family(const std::string& family, FamilyInput& in, const std::string* only, LayerSolve& r) {
  if (family == "paper") return family_paper(in);
  if (family == "search") return family_search(in, &r.ls, &r.pins, &r);
  if (family == "pinned") return family_pinned(in);
  if (family == "ends-in") return family_ends_in(in, only);
  throw InternalError("solve: unknown candidate family " + family);
}

const std::vector<std::string>& families() {
  static const std::vector<std::string> f = {"paper", "search", "pinned", "ends-in"};
  return f;
}

// The chosen recipe (family, build, cache policy label) rebuilt on `in` (every profile token). A pinned set refined
// on the build tokens may come out unrefined here (no swap pays): the hottest set then stands in for it. Returns
// false when the recipe cannot be rebuilt (the caller keeps the candidate built on the build tokens).
bool rebuild_recipe(FamilyInput& in, const Selection& sel, LayerSolve& r) {
  auto swap_refined = [](std::string s) {
    for (size_t p; (p = s.find("refined")) != std::string::npos;) s.replace(p, 7, "hot");
    return s;
  };
  std::string build = sel.best_build;
  std::vector<Build> bs = run_family(sel.best_family, in, &build, r);
  if (bs.empty() && build.find("refined") != std::string::npos) {
    build = swap_refined(build);
    bs = run_family(sel.best_family, in, &build, r);
  }
  for (const Build& b : bs) {
    if (b.label != build) continue;
    std::string pl = sel.best_policy_label;
    const std::string sf = sel.small_label("");
    const bool small = pl.size() > sf.size() && pl.compare(pl.size() - sf.size(), sf.size(), sf) == 0;
    if (small) pl.resize(pl.size() - sf.size());
    for (int attempt = 0; attempt < 2; ++attempt, pl = swap_refined(pl)) {
      for (size_t k = 0; k < b.policies.size(); ++k) {
        if (b.policy_labels[k] != pl) continue;
        r.order = b.order;
        r.cache = b.policies[k];
        if (small) r.cache.small_fraction = in.opt.small_fraction;
        return true;
      }
    }
  }
  return false;
}

}  // namespace

namespace {

// m's rows (neurons) by ascending frequency, ties by index. Counting pairs costs each row its frequency times the
// columns after it (the sparse count, graph/sparse_vertical.cpp, computes the upper triangle), so with the hottest
// rows last the count does a fraction of the work; what is computed from the counts must not depend on the neurons'
// labels (the path bound: the sum of each neuron's two largest counts). OPT-6.7B shape: the validation part's bound,
// 16.3 thread-seconds of a 32-layer solve before, 12.2-12.5 after (docs/benchmarks.md).
LayerMask rows_by_frequency(const LayerMask& m) {
  std::vector<uint64_t> f(m.n_neurons);
  for (uint32_t v = 0; v < m.n_neurons; ++v) f[v] = m.count(v);
  std::vector<uint32_t> by(m.n_neurons);
  for (uint32_t v = 0; v < m.n_neurons; ++v) by[v] = v;
  std::stable_sort(by.begin(), by.end(), [&](uint32_t a, uint32_t b) { return f[a] < f[b]; });
  LayerMask out(m.n_neurons, m.n_tokens);
  for (uint32_t k = 0; k < m.n_neurons; ++k) std::memcpy(out.row(k), m.row(by[k]), m.words * sizeof(uint64_t));
  return out;
}

// The count matrix of this thread's last layer (512 MiB for 16,384 neurons), kept for its next layer of as many
// neurons: overwritten instead of zeroed and faulted in again (graph/coactivation.h). At most one per solving thread,
// which holds one during each layer anyway.
thread_local std::vector<uint32_t> t_spare_upper;

// `own` (optional) is m itself, given up by the caller: the build part is then split off in place.
LayerSolve solve_layer_impl(const LayerMask& m, LayerMask* own, const SolveOptions& opt, uint32_t layer_index,
                            const std::vector<int64_t>* sequence_starts, const LayerCountsFn& counts) {
  auto t0 = std::chrono::steady_clock::now();
  LayerSolve r;
  CoactivationOptions co;
  co.top_k = std::max<uint32_t>(opt.top_k, 2);
  const std::string& meth = opt.method;
  co.full_matrix = keeps_full_matrix(m.n_neurons, opt);
  // With the full matrix greedy needs no candidate lists; the search reads the first `neighbours` entries and the
  // bound the first two, and exact top-k lists are prefixes of longer ones, so shorter lists change nothing.
  if (co.full_matrix) co.top_k = std::min(co.top_k, std::max<uint32_t>(2, opt.ls.neighbours));
  // greedy+ls builds its candidates on the first sequences and chooses on the rest; every other method (and the
  // objective, the bound) sees every token. Counts given from outside (solve --graph) already hold every counted
  // token, so there is no held-out part to split off: the sample then builds and chooses (docs/solvers.md).
  r.split = validation_split(meth == "greedy+ls" && sequence_starts ? *sequence_starts : std::vector<int64_t>{},
                             m.n_tokens, meth == "greedy+ls" && !counts ? opt.validation_share : 0.0);
  const bool split = r.split.split();
  // Without the rebuild no step needs the whole mask at once: the build part is m's own storage cut down in place
  // (no second 80 % of the layer in memory: 166 MB less peak per OPT-6.7B layer), the validation part a copy.
  const bool in_place = split && own && !opt.rebuild;
  LayerMask m_build_own, m_val_own;
  if (in_place)
    m_val_own = split_mask_tokens(*own, r.split.build_end);
  else if (split)
    m_build_own = mask_tokens(m, 0, r.split.build_end);
  const LayerMask& mb = split && !in_place ? m_build_own : m;
  // The validation tokens as a mask of their own, starting at token 0 (in place) or m's tokens from build_end.
  const LayerMask& m_val = in_place ? m_val_own : m;
  const uint64_t val_begin = in_place ? 0 : r.split.build_end;
  auto tp = t0;  // phase clock
  r.phases.add("split", seconds_since(tp));
  LayerGraph counted;  // the build tokens' counts (completed in place below); unused when `counts` gives them
  if (!counts) counted = coactivation_count(mb, co, &t_spare_upper);
  const LayerGraph& g = counts ? counts(layer_index, co) : counted;
  // Once the candidates are chosen, g becomes every profile token's graph (for the rebuild, the objective and the
  // bound): counts add, so the validation part's counts complete the build part's in place.
  // Without a rebuild only the bound needs the validation part: the sum of the two parts' bounds (the two heaviest
  // counts of a sum are at most the sums of each part's two heaviest) needs its top-2 lists only, not a second matrix.
  double bound_validation = -1;
  auto complete_graph = [&] {
    if (!split) return;
    m_build_own = LayerMask();  // the build tokens are done with
    if (!opt.rebuild) {
      CoactivationOptions cv = co;
      cv.full_matrix = false;
      cv.top_k = 2;
      bound_validation = path_upper_bound(coactivation_count(
          rows_by_frequency(in_place ? m_val_own : mask_tokens(m, r.split.build_end, m.n_tokens)), cv));
      return;
    }
    if (co.full_matrix) {
      const LayerGraph gv = coactivation_count(mask_tokens(m, r.split.build_end, m.n_tokens), co);
      for (size_t i = 0; i < counted.freq.size(); ++i) counted.freq[i] += gv.freq[i];
      for (size_t i = 0; i < counted.upper.size(); ++i) counted.upper[i] += gv.upper[i];
      counted.n_tokens = m.n_tokens;
      coactivation_build_topk(counted, co.top_k);
    } else {
      counted = coactivation_count(m, co);
    }
  };
  r.phases.add("count", seconds_since(tp));
  if (meth == "identity") {
    r.order = solve_identity(m.n_neurons);
    r.phases.add("order", seconds_since(tp));
  } else if (meth == "frequency") {
    r.order = solve_frequency(g);
    r.phases.add("order", seconds_since(tp));
  } else if (meth == "rcm") {
    r.order = solve_rcm(g, opt.rcm_min_count);
    r.phases.add("order", seconds_since(tp));
  } else if (meth == "greedy") {
    r.order = solve_greedy(g, &m, &r.greedy);
    r.phases.add("greedy", seconds_since(tp));
  } else if (meth == "greedy+ls") {
    // The one objective (layout/cost_model.h): every search's estimate and the selection's exact measure.
    const CostModel cost = cost_model(opt.eval, m.n_neurons);
    const EvalConfig& ec = cost.exact;
    // Pinned sets and the peel are measured on the first guard_tokens build tokens (a contiguous prefix, so the cache
    // sees real token-to-token persistence); candidates are compared on as many validation tokens.
    const TokenMajorMask tm_build(mb, 0, std::min<uint64_t>(mb.n_tokens, opt.guard_tokens));
    FamilyInput in(mb, g, tm_build, opt, cost);
    in.greedy = solve_greedy(g, &mb, &r.greedy, nullptr, &in.band);
    r.phases.add("greedy", seconds_since(tp));
    std::unique_ptr<TokenMajorMask> tm_val_own;
    if (split)
      tm_val_own = std::make_unique<TokenMajorMask>(m_val, val_begin,
                                                    std::min<uint64_t>(m_val.n_tokens, val_begin + opt.guard_tokens));
    const TokenMajorMask& tm_val = split ? *tm_val_own : tm_build;
    Selection sel(split ? m_val : mb, tm_val, ec, layer_index, in.cap, opt, g, mb);
    sel.ev.token_begin = tm_val.begin;
    sel.ev.token_end = tm_val.end;
    sel.w_greedy = opt.guard_weight ? path_weight(g, mb, in.greedy) : 0;
    sel.seen = &r.candidates;
    for (const std::string& f : families()) {
      std::vector<Build> bs = run_family(f, in, nullptr, r);
      r.phases.add("build " + f, seconds_since(tp));
      FamilyFigure fig;
      sel.offer(f, bs, fig, f != "paper");
      r.phases.add("select " + f, seconds_since(tp));
      if (fig.candidates == 0) continue;
      if (!opt.family_build_figures) {
        // not asked for (nobody reads them): no pass over the build tokens
      } else if (split && fig.validation_ms > 0) {  // the family's best on the build tokens, for the report
        for (const Build& b : bs) {
          for (size_t k = 0; k < b.policies.size(); ++k) {
            const std::string l = b.label + ", " + b.policy_labels[k];
            LayerCachePolicy p = b.policies[k];
            bool match = fig.best == l;
            if (!match && fig.best == b.label + ", " + sel.small_label(b.policy_labels[k]))
              match = true, p.small_fraction = opt.small_fraction;
            if (!match) continue;
            EvalConfig eb = ec;
            eb.token_begin = tm_build.begin;
            eb.token_end = tm_build.end;
            fig.build_ms =
                evaluate_layer(mb, b.order, eb, layer_index, &p, nullptr, nullptr, &tm_build).io_ms_per_token();
          }
        }
      } else {
        fig.build_ms = fig.validation_ms;  // built and chosen on the same tokens
      }
      if (opt.family_build_figures) r.phases.add("build figures", seconds_since(tp));
      r.families.push_back(std::move(fig));
    }
    r.chosen_family = sel.best_family;
    r.chosen = sel.best_build + ", " + sel.best_policy_label;
    r.chosen_validation_ms = 1e3 * sel.best_io / double(std::max<uint64_t>(1, tm_val.end - tm_val.begin));
    r.order = sel.best;
    r.cache = sel.best_policy;
    complete_graph();
    r.phases.add("bound", seconds_since(tp));
    if (split && opt.rebuild) {
      const TokenMajorMask tm_all(m, 0, std::min<uint64_t>(m.n_tokens, opt.guard_tokens));
      FamilyInput all(m, g, tm_all, opt, cost);
      all.greedy = solve_greedy(g, &m, nullptr, nullptr, &all.band);
      r.rebuilt = rebuild_recipe(all, sel, r);
      r.phases.add("rebuild", seconds_since(tp));
    }
    // Candidates from the build tokens (tm_build's range of m: in place, m is the build part; otherwise m_build_own
    // is already released by complete_graph), the level chosen on tm_val.
    if (opt.replicate_share > 0) {
      const ReplicateResult rep =
          replicate_layer(m, tm_build, sel.m, tm_val, r.order, r.cache, cost, layer_index, opt.replicate_share);
      r.order = rep.order;
      r.replicas = rep.replicas;
      r.replicate_summary = rep.summary;
      r.phases.add("replicate", seconds_since(tp));
    }
  } else {
    throw UsageError("unknown method '" + meth + "' (identity, frequency, greedy, greedy+ls, rcm)");
  }
  r.upper_bound = path_upper_bound(g) + std::max(0.0, bound_validation);
  // Path weights add over token ranges: in place, m holds the build tokens and m_val_own the rest. With replicas the
  // path is the order without its copies.
  const Order primary = r.replicas ? primary_order(r.order, m.n_neurons) : Order();
  const Order& path = r.replicas ? primary : r.order;
  r.objective = graph_covers(g, m) ? path_weight(g, m, path) : path_weight(m, path);
  if (in_place) r.objective += path_weight(m_val_own, path);
  if (!counted.upper.empty()) t_spare_upper.swap(counted.upper);  // the older spare, if any, is freed with counted
  r.phases.add("objective", seconds_since(tp));
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace

LayerSolve solve_layer(const LayerMask& m, const SolveOptions& opt, uint32_t layer_index,
                       const std::vector<int64_t>* sequence_starts, const LayerCountsFn& counts) {
  return solve_layer_impl(m, nullptr, opt, layer_index, sequence_starts, counts);
}

LayerSolve solve_layer(LayerMask&& m, const SolveOptions& opt, uint32_t layer_index,
                       const std::vector<int64_t>* sequence_starts, const LayerCountsFn& counts) {
  return solve_layer_impl(m, &m, opt, layer_index, sequence_starts, counts);
}

nlohmann::json solve_parameters(const SolveOptions& opt) {
  nlohmann::json p = nlohmann::json::object();
  p["seed"] = opt.seed;
  p["top_k"] = opt.top_k;
  if (opt.method == "greedy" || opt.method == "greedy+ls") p["full_matrix_bytes"] = opt.full_matrix_bytes;
  if (opt.method == "rcm") p["min_count"] = opt.rcm_min_count;
  if (opt.method == "greedy+ls") {
    p["gap"] = opt.eval.gap.to_string();
    p["cache_ratio"] = opt.eval.cache_ratio;
    p["device"] = opt.eval.device.name;
    p["bundle_bytes"] = opt.eval.bundle_bytes;
    p["admission"] = cache_admission_name(opt.admission);
    p["pin_share"] = opt.pin_share;
    p["pin_rounds"] = opt.pin_rounds;
    p["small_fraction"] = opt.small_fraction;
    p["candidates"] = opt.full_candidates ? "full" : "lean";
    p["guard_tokens"] = opt.guard_tokens;
    p["validation_share"] = opt.validation_share;
    p["rebuild"] = opt.rebuild;
    p["weight_guard"] = opt.guard_weight;
    p["max_evaluations"] = opt.ls.max_evaluations;
    p["evaluations_per_neuron"] = opt.evaluations_per_neuron;
    p["min_evaluations"] = opt.min_evaluations;
    p["converge_evaluations"] = opt.converge_evaluations;
    p["converge_work"] = opt.converge_work;
    p["max_neighbours"] = opt.ls.max_neighbours;
    p["sample_tokens"] = opt.ls.sample_tokens;
    p["neighbours"] = opt.ls.neighbours;
    if (opt.replicate_share > 0) p["replicate_share"] = opt.replicate_share;
  }
  return p;
}

LayoutLayer layout_layer_of(const LayerSolve& s) {
  LayoutLayer L;
  L.order = s.order;
  L.replicas = s.replicas;
  L.admission = s.cache.admission;
  L.pinned = s.cache.pinned;
  L.small_fraction = s.cache.small_fraction;
  L.hot = s.cache.hot;
  L.objective = double(s.objective);
  L.upper_bound = s.upper_bound;
  return L;
}

void solve_layers(Layout& out, uint32_t n_layers, const std::function<void(uint32_t, const LayerSolve&)>& progress,
                  const std::function<LayerSolve(uint32_t)>& solve_one) {
  out.layers.resize(n_layers);
  std::mutex cb_mu;
  std::exception_ptr err;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t l = 0; l < int64_t(n_layers); ++l) {
    try {
      const LayerSolve s = solve_one(uint32_t(l));
      out.layers[size_t(l)] = layout_layer_of(s);
      if (progress) {
        std::lock_guard<std::mutex> lk(cb_mu);
        progress(uint32_t(l), s);
      }
    } catch (...) {
      std::lock_guard<std::mutex> lk(cb_mu);
      if (!err) err = std::current_exception();
    }
  }
  if (err) std::rethrow_exception(err);
}

Layout solve_trace(const std::string& trace_path, const SolveOptions& opt,
                   const std::function<void(uint32_t, const LayerSolve&)>& progress) {
  TraceReader tr(trace_path);
  const TraceInfo& ti = tr.info();
  Layout out;
  out.method = opt.method;
  out.trace_sha256 = sha256_file(trace_path);
  out.trace_model = ti.model;
  out.trace_tokens = ti.n_tokens;
  out.parameters = solve_parameters(opt);
  std::mutex io_mu;
  solve_layers(out, ti.n_layers, progress, [&](uint32_t l) {
    LayerMask m;
    double read_s = 0;
    {
      std::lock_guard<std::mutex> lk(io_mu);  // HDF5 is serialised
      auto t = std::chrono::steady_clock::now();
      m = tr.read_layer(l);
      read_s = seconds_since(t);
    }
    LayerSolve s = solve_layer(std::move(m), opt, l, &ti.sequences);
    s.phases.list.insert(s.phases.list.begin(), {"read", read_s});
    return s;
  });
  return out;
}

}  // namespace nl
