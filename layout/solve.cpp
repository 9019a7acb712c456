#include "layout/solve.h"

#include <omp.h>

#include <chrono>
#include <cmath>
#include <mutex>

#include "formats/core/error.h"
#include "formats/sha256.h"
#include "formats/trace.h"
#include "layout/pins.h"
#include "layout/span.h"

namespace nl {

LayerSolve solve_layer(const LayerMask& m, const SolveOptions& opt, uint32_t layer_index, const LayerCountsFn& counts) {
  auto t0 = std::chrono::steady_clock::now();
  LayerSolve r;
  CoactivationOptions co;
  co.top_k = std::max<uint32_t>(opt.top_k, 2);
  const uint64_t pairs = uint64_t(m.n_neurons) * (m.n_neurons > 0 ? m.n_neurons - 1 : 0) / 2;
  co.full_matrix = (opt.method == "greedy" || opt.method == "greedy+ls") && pairs * 4 <= opt.full_matrix_bytes;
  // With the full matrix greedy needs no candidate lists; the search reads the first `neighbours` entries and the
  // bound the first two, and exact top-k lists are prefixes of longer ones, so shorter lists change nothing.
  if (co.full_matrix) co.top_k = std::min(co.top_k, std::max<uint32_t>(2, opt.ls.neighbours));
  LayerGraph counted;
  const LayerGraph& g = counts ? counts(layer_index, co) : (counted = coactivation_count(m, co));
  auto lap = [t = t0]() mutable {
    auto now = std::chrono::steady_clock::now();
    double d = std::chrono::duration<double>(now - t).count();
    t = now;
    return d;
  };
  r.seconds_count = lap();
  r.upper_bound = path_upper_bound(g);
  const std::string& meth = opt.method;
  if (meth == "identity") {
    r.order = solve_identity(m.n_neurons);
  } else if (meth == "frequency") {
    r.order = solve_frequency(g);
  } else if (meth == "rcm") {
    r.order = solve_rcm(g, opt.rcm_min_count);
  } else if (meth == "greedy" || meth == "greedy+ls") {
    GreedyFirstBand first_band;  // the pinned variant's greedy runs on subsets reuse it
    r.order = solve_greedy(g, &m, &r.greedy, nullptr, &first_band);
    r.seconds_greedy = lap();
    if (meth == "greedy+ls") {
      EvalConfig ec = opt.eval;
      if (ec.bundle_bytes == 0) ec.bundle_bytes = default_bundle_bytes(m.n_neurons);
      PlannerConfig pc;
      pc.n_slots = m.n_neurons;
      pc.bundle_bytes = ec.bundle_bytes;
      pc.gap = ec.gap;
      pc.cost = ec.device.cost;
      LsOptions lo = opt.ls;
      lo.merge_gap = ReadPlanner(pc).merge_gap_bundles();
      lo.read_us = ec.device.cost.read_latency_us;
      lo.bundle_us = double(ec.bundle_bytes) / ec.device.cost.bandwidth_MBps;  // bytes / (MB/s) = us
      lo.seed = opt.seed * 7919 + layer_index;
      if (lo.max_evaluations == 0) lo.max_evaluations = uint64_t(opt.evaluations_per_neuron) * m.n_neurons;
      const uint32_t cap = cache_capacity_for_ratio(ec.cache_ratio, m.n_neurons);
      const uint32_t n_pin = uint32_t(std::floor(opt.pin_share * cap + 1e-9));
      const uint64_t w_greedy = path_weight(g, m, r.order);
      // The guard's device objective runs the planner and cache on the first guard_tokens profile tokens (a
      // contiguous prefix, so the cache sees real token-to-token persistence): bounded cost at paper scale.
      EvalConfig eg = ec;
      eg.token_end = std::min<uint64_t>(m.n_tokens, opt.guard_tokens);
      const TokenMajorMask tm(m, eg.token_begin, eg.token_end);  // shared by every guard evaluation below
      // The paper's pipeline on the profile trace: greedy + the evaluator's (linking-aligned) cache.
      LayerEval e_paper = evaluate_layer(m, r.order, eg, layer_index, nullptr, nullptr, nullptr, &tm);
      r.io_ms_greedy = e_paper.io_ms_per_token();
      double best_io = e_paper.io_seconds;
      Order best = r.order;
      LayerCachePolicy best_policy;
      bool kept_ours = false;
      // Each candidate order is tried with the paper's cache (no recorded policy), with admission `opt.admission`
      // and with each of the given cache policies (pinned sets); the best on the profile prefix is kept.
      auto try_order = [&](const Order& o, const std::vector<LayerCachePolicy>& cands, double& io_ms_out) {
        if (!(path_weight(g, m, o) >= w_greedy || !opt.guard_weight)) return;
        std::vector<LayerCachePolicy> pols = {LayerCachePolicy{}, LayerCachePolicy{opt.admission, {}}};
        for (const auto& c : cands)
          if (!c.pinned.empty()) pols.push_back(c);
        auto run = [&](const std::vector<LayerCachePolicy>& ps) {
          std::vector<const LayerCachePolicy*> pp;
          for (const auto& pol : ps) pp.push_back(&pol);
          const std::vector<LayerEval> es = evaluate_layer_policies(m, o, eg, layer_index, pp, &tm);  // one pass
          for (size_t k = 0; k < ps.size(); ++k) {
            const LayerEval& e = es[k];
            double ms = e.io_ms_per_token();
            if (io_ms_out == 0 || ms < io_ms_out) io_ms_out = ms;
            if (e.io_seconds < best_io) best_io = e.io_seconds, best = o, best_policy = ps[k], kept_ours = true;
          }
          return es;
        };
        const std::vector<LayerEval> es = run(pols);
        // The two best of these policies that leave part of the capacity to S3-FIFO, again with a larger small
        // FIFO: with strong token-to-token persistence a neuron's second access comes one token after its first,
        // and a 10 % small queue has evicted it (to the ghost list) by then, so the second access misses too.
        // (Only two: each policy costs a planner and cache pass over the guard tokens.)
        if (opt.small_fraction > 0) {
          std::vector<size_t> idx;
          for (size_t k = 0; k < pols.size(); ++k)
            if (pols[k].pinned.size() < cap) idx.push_back(k);
          std::stable_sort(idx.begin(), idx.end(),
                           [&](size_t a, size_t b) { return es[a].io_seconds < es[b].io_seconds; });
          std::vector<LayerCachePolicy> more;
          for (size_t i = 0; i < idx.size() && i < 2; ++i) {
            LayerCachePolicy q = pols[idx[i]];
            q.small_fraction = opt.small_fraction;
            more.push_back(std::move(q));
          }
          if (!more.empty()) run(more);
        }
      };
      // Variant 1: search from the greedy seed; also with the hottest neurons pinned where they are (the order
      // and so the gap-0 path weight unchanged, only the cache policy differs).
      const bool can_pin = n_pin > 0 && n_pin < m.n_neurons;
      const std::vector<uint32_t> hot_pins = can_pin ? hottest(g.freq, n_pin) : std::vector<uint32_t>{};
      std::vector<uint32_t> refined_pins;
      {
        lo.hot_count = uint32_t(std::floor(opt.hot_share * cap));
        Order o = local_search(m, g, r.order, lo, &r.ls);
        std::vector<LayerCachePolicy> cands = {LayerCachePolicy{opt.admission, hot_pins}};
        // Smaller hot sets leave part of the capacity to S3-FIFO, admitting every miss or only the misses read
        // alone ("isolated": a hit there saves a whole read, and persistent isolated neurons come back).
        for (uint32_t q : {6u, 5u, 4u}) {
          const uint32_t k = n_pin * q / 8;
          if (!can_pin || k == 0 || k >= n_pin) continue;
          std::vector<uint32_t> part(hot_pins.begin(), hot_pins.begin() + k);
          cands.push_back(LayerCachePolicy{opt.admission, part});
          if (opt.admission != CacheAdmission::kIsolated)
            cands.push_back(LayerCachePolicy{CacheAdmission::kIsolated, std::move(part)});
        }
        // The same capacity pinned where the pins save the most reads and bytes under this order's read plans.
        if (can_pin && opt.pin_rounds > 0) {
          PinCost pc_cost{lo.read_us, lo.bundle_us, lo.merge_gap};
          std::vector<uint32_t> refined =
              refine_pins(tm, o, hot_pins, g.freq, pc_cost, opt.pin_rounds, opt.ls.sample_tokens, &r.pins);
          if (r.pins.swaps > 0)
            refined_pins = refined, cands.push_back(LayerCachePolicy{opt.admission, std::move(refined)});
        }
        try_order(o, cands, r.io_ms_ls);
      }
      // Variant 2: the hottest neurons pinned; the path is solved without them (greedy on the cold neurons' own
      // co-activation, i.e. on the miss stream), and they sit in a block at the end ordered by greedy among
      // themselves so that gap-0 reads without a cache stay low too.
      if (can_pin) {
        LayerCachePolicy pol{opt.admission, hot_pins};
        std::vector<uint8_t> cold(m.n_neurons, 1);
        for (uint32_t v : pol.pinned) cold[v] = 0;
        Order cp = solve_greedy_subset(g, &m, &cold, nullptr, nullptr, &first_band);
        for (auto& c : cold) c ^= 1;
        Order hp = solve_greedy_subset(g, &m, &cold, nullptr, nullptr, &first_band);
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
        LsOptions lp = lo;
        lp.hot_count = n_pin;
        LsStats st;
        Order o = local_search(m, g, seed, lp, &st);
        try_order(o, {pol}, r.io_ms_pinned);
      }
      // Variant 3: the miss stream (design section 5): simulate the layout's cache on the profile trace, then
      // solve greedy + search on the co-activation of the misses only.
      if (opt.miss_stream) {
        LayerCachePolicy pol{opt.admission, {}};
        LayerMask miss;
        evaluate_layer(m, r.order, eg, layer_index, &pol, &miss, nullptr, &tm);
        LayerGraph gm = coactivation_count(miss, co);
        Order o = solve_greedy(gm, &miss);
        r.weight_miss_greedy = path_weight(g, m, o);
        LsOptions lm = lo;
        lm.hot_count = 0;
        LsStats st;
        o = local_search(miss, gm, o, lm, &st);
        r.weight_miss = path_weight(g, m, o);
        try_order(o, {}, r.io_ms_miss);
      }
      // Variant 4: layers read in few long pieces (the merge gap is wider than the search's windows, so it cannot
      // see what a move does to a read's span): the order built from both ends inwards (layout/span.h) with the
      // pinned neurons in a block after it (never read while resident). Where both ends' unions already cover all
      // but a share `eps` of the tokens, the order changes the span little, so the neurons left there, and the
      // pinned block, are ordered by greedy among themselves for the path weight (gap-0 reads).
      if (lo.merge_gap > lo.max_window && m.n_neurons >= 4) {
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
            Order p = solve_greedy_subset(g, &m, &inc, nullptr, nullptr, &first_band);
            if (after < m.n_neurons && p.size() > 1 &&
                pair_count(g, m, after, p.back()) > pair_count(g, m, after, p.front()))
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
        // Without the weight guard the gap-0 reads are free to rise: the peel is then also polished by slot swaps
        // on the exact one-read cost (block-aligned span), which lowers the path weight further.
        SpanCost sc{lo.read_us, 1.0 / ec.device.cost.bandwidth_MBps, ec.bundle_bytes, ec.device.block_bytes};
        auto polish = [&](const Order& o, const std::vector<uint32_t>& pins) {
          return polish_span(tm, o, pins, sc, 4, opt.ls.sample_tokens, uint64_t(1) << 29);
        };
        const std::vector<double> shares = {0.0, 0.002, 0.02, 0.1, 0.3};
        const EndsIn all = peel({});
        for (double eps : shares) try_order(compose(all, {}, eps), {}, r.io_ms_span);
        if (!opt.guard_weight) try_order(polish(compose(all, {}, 0.0), {}), {}, r.io_ms_span);
        if (can_pin) {
          const EndsIn cold = peel(hot_pins);
          std::vector<uint32_t> refined;
          if (opt.pin_rounds > 0) {
            PinCost pc_cost{lo.read_us, lo.bundle_us, lo.merge_gap};
            PinRefineStats ps;
            refined = refine_pins(tm, compose(cold, hot_pins, 0.0), hot_pins, g.freq, pc_cost, opt.pin_rounds,
                                  opt.ls.sample_tokens, &ps);
            if (ps.swaps == 0) refined.clear();
          }
          for (double eps : shares) {
            std::vector<LayerCachePolicy> cands = {LayerCachePolicy{opt.admission, hot_pins}};
            if (!refined.empty()) cands.push_back(LayerCachePolicy{opt.admission, refined});
            try_order(compose(cold, hot_pins, eps), cands, r.io_ms_span);
          }
          if (!opt.guard_weight) {
            try_order(polish(compose(cold, hot_pins, 0.0), hot_pins), {LayerCachePolicy{opt.admission, hot_pins}},
                      r.io_ms_span);
          }
          if (!refined.empty()) {
            const EndsIn rest = peel(refined);
            for (double eps : shares)
              try_order(compose(rest, refined, eps), {LayerCachePolicy{opt.admission, refined}}, r.io_ms_span);
            if (!opt.guard_weight)
              try_order(polish(compose(rest, refined, 0.0), refined), {LayerCachePolicy{opt.admission, refined}},
                        r.io_ms_span);
          }
        }
      }
      r.seconds_ls = lap();
      r.guard_kept_seed = !kept_ours;
      r.pins_refined = kept_ours && !refined_pins.empty() && best_policy.pinned == refined_pins;
      r.order = std::move(best);
      r.cache = std::move(best_policy);
    }
  } else {
    throw UsageError("unknown method '" + meth + "' (identity, frequency, greedy, greedy+ls, rcm)");
  }
  r.objective = path_weight(g, m, r.order);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
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
    p["guard_tokens"] = opt.guard_tokens;
    if (opt.hot_share > 0) p["hot_share"] = opt.hot_share;
    p["max_evaluations"] = opt.ls.max_evaluations;
    p["evaluations_per_neuron"] = opt.evaluations_per_neuron;
    p["sample_tokens"] = opt.ls.sample_tokens;
    p["neighbours"] = opt.ls.neighbours;
    p["kicks"] = opt.ls.kicks;
    if (opt.ls.time_budget_s > 0) p["time_budget_s"] = opt.ls.time_budget_s;
  }
  return p;
}

LayoutLayer layout_layer_of(const LayerSolve& s) {
  LayoutLayer L;
  L.order = s.order;
  L.admission = s.cache.admission;
  L.pinned = s.cache.pinned;
  L.small_fraction = s.cache.small_fraction;
  L.objective = double(s.objective);
  L.upper_bound = s.upper_bound;
  return L;
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
  out.layers.resize(ti.n_layers);
  std::mutex io_mu, cb_mu;
  std::exception_ptr err;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t l = 0; l < int64_t(ti.n_layers); ++l) {
    try {
      LayerMask m;
      {
        std::lock_guard<std::mutex> lk(io_mu);  // HDF5 is serialised
        m = tr.read_layer(uint32_t(l));
      }
      LayerSolve s = solve_layer(m, opt, uint32_t(l));
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
  return out;
}

}  // namespace nl
