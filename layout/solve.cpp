#include "layout/solve.h"

#include <omp.h>

#include <chrono>
#include <cmath>
#include <mutex>

#include "formats/core/error.h"
#include "formats/sha256.h"
#include "formats/trace.h"

namespace nl {

LayerSolve solve_layer(const LayerMask& m, const SolveOptions& opt, uint32_t layer_index) {
  auto t0 = std::chrono::steady_clock::now();
  LayerSolve r;
  CoactivationOptions co;
  co.top_k = std::max<uint32_t>(opt.top_k, 2);
  LayerGraph g = coactivation_count(m, co);
  r.upper_bound = path_upper_bound(g);
  const std::string& meth = opt.method;
  if (meth == "identity") {
    r.order = solve_identity(m.n_neurons);
  } else if (meth == "frequency") {
    r.order = solve_frequency(g);
  } else if (meth == "rcm") {
    r.order = solve_rcm(g, opt.rcm_min_count);
  } else if (meth == "greedy" || meth == "greedy+ls") {
    r.order = solve_greedy(g, &m, &r.greedy);
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
      lo.hot_count = uint32_t(std::floor(opt.hot_share * cache_capacity_for_ratio(ec.cache_ratio, m.n_neurons)));
      Order ls = local_search(m, g, r.order, lo, &r.ls);
      // Guard: keep the seed unless the result is at least as good on the profile trace in both the device
      // objective (eval settings) and gap-0 reads (path weight).
      LayerEval e_seed = evaluate_layer(m, r.order, ec, layer_index);
      LayerEval e_ls = evaluate_layer(m, ls, ec, layer_index);
      if (e_ls.io_seconds <= e_seed.io_seconds && r.ls.weight_final >= r.ls.weight_seed)
        r.order = std::move(ls);
      else
        r.guard_kept_seed = true;
    }
  } else {
    throw UsageError("unknown method '" + meth + "' (identity, frequency, greedy, greedy+ls, rcm)");
  }
  r.objective = path_weight(m, r.order);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
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
  nlohmann::json p = nlohmann::json::object();
  p["seed"] = opt.seed;
  p["top_k"] = opt.top_k;
  if (opt.method == "rcm") p["min_count"] = opt.rcm_min_count;
  if (opt.method == "greedy+ls") {
    p["gap"] = opt.eval.gap.to_string();
    p["cache_ratio"] = opt.eval.cache_ratio;
    p["device"] = opt.eval.device.name;
    p["bundle_bytes"] = opt.eval.bundle_bytes;
    p["hot_share"] = opt.hot_share;
    p["sample_tokens"] = opt.ls.sample_tokens;
    p["neighbours"] = opt.ls.neighbours;
    p["kicks"] = opt.ls.kicks;
    if (opt.ls.time_budget_s > 0) p["time_budget_s"] = opt.ls.time_budget_s;
  }
  out.parameters = p;
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
      out.layers[size_t(l)].order = s.order;
      out.layers[size_t(l)].objective = double(s.objective);
      out.layers[size_t(l)].upper_bound = s.upper_bound;
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
