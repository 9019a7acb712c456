// Generation as a library (runtime/generate.h).
#include "runtime/generate.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>

#include "formats/core/error.h"
#include "formats/core/number_text.h"
#include "runtime/device.h"

namespace nl {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// A whole decimal integer >= 1, or -1.
int positive_int(const std::string& s) {
  if (s.empty() || s.size() > 9 || s.find_first_not_of("0123456789") != std::string::npos) return -1;
  const int v = std::atoi(s.c_str());
  return v >= 1 ? v : -1;
}

// A number >= 0 that float_arg_problem accepts, or -1.
double nonnegative_number(const std::string& s) {
  if (!float_arg_problem(s).empty()) return -1;
  const double v = std::strtod(s.c_str(), nullptr);
  return v >= 0 ? v : -1;
}

}  // namespace

std::string selection_parse(const std::string& s, Selection* out) {
  Selection r;
  auto after = [&s](const char* prefix) {
    const std::string p = prefix;
    return s.rfind(p, 0) == 0 ? s.substr(p.size()) : std::string("\x01");  // \x01: not of this form
  };
  if (s == "gate") {
    r.mode = SelectMode::kGate;
  } else if (s == "dense") {
    r.mode = SelectMode::kDense;
  } else if (s == "threshold") {
    r.mode = SelectMode::kThreshold;
  } else if (s == "predictor") {  // lowrank's calibration and phases with the image's stored predictor
    r.mode = SelectMode::kLowRank;
    r.stored = true;
  } else if (const std::string pt = after("predictor:"); pt != "\x01") {  // deployment: a fixed score threshold
    r.mode = SelectMode::kLowRank;
    r.stored = r.deploy = true;
    if (!float_arg_problem(pt).empty()) return "predictor:T needs a finite number T, not '" + pt + "'";
    r.predictor_threshold = std::strtod(pt.c_str(), nullptr);
  } else if (const std::string rank = after("lowrank:"); rank != "\x01") {
    r.mode = SelectMode::kLowRank;
    r.rank = positive_int(rank);
    if (r.rank < 1) return "lowrank:R needs a whole rank R >= 1, not '" + rank + "'";
  } else if (const std::string k = after("topk:"); k != "\x01") {  // CATS by count (the paper's sensitivity study)
    r.mode = SelectMode::kThreshold;
    r.topk = nonnegative_number(k);
    r.threshold = 0;
    if (!(r.topk > 0 && r.topk <= 1)) return "topk:F needs a share F in (0, 1], not '" + k + "'";
  } else if (const std::string t = after("threshold:"); t != "\x01") {
    r.mode = SelectMode::kThreshold;
    r.threshold = nonnegative_number(t);
    if (r.threshold < 0) return "threshold:T needs a finite number T >= 0, not '" + t + "'";
  } else if (const std::string f = after("trace:"); f != "\x01" && !f.empty()) {
    r.mode = SelectMode::kTrace;
    r.trace = f;
  } else if (const std::string pf = after("predictor+trace:"); pf != "\x01" && !pf.empty()) {
    r.mode = SelectMode::kTrace;
    r.trace = pf;
    r.stored = r.trace_pays_predictor = true;
  } else {
    return "expected gate, dense, lowrank:R (R >= 1), predictor, predictor:T, threshold, threshold:T (T >= 0), "
           "topk:F (0 < F <= 1), trace:FILE.h5 or predictor+trace:FILE.h5";
  }
  *out = r;
  return "";
}

std::string PlannerSettings::effective_gap(const ImagePlanner& manifest) const {
  return !gap.empty() ? gap : !manifest.empty() ? manifest.gap : "off";
}

double PlannerSettings::effective_cache_ratio(const ImagePlanner& manifest) const {
  return cache_ratio >= 0 ? cache_ratio : !manifest.empty() ? manifest.cache_ratio : 0.0;
}

FlashFfnOptions flash_ffn_options(const PlannerSettings& s, const ImagePlanner& manifest, SelectMode select) {
  FlashFfnOptions o;
  o.select = select;
  o.gap = GapPolicy::parse(s.effective_gap(manifest));
  if (!s.device.empty())
    o.cost = device_load(s.device).cost;
  else if (!manifest.empty())
    o.cost = CostFit{manifest.read_latency_us, manifest.bandwidth_MBps};
  if (o.gap.mode == GapMode::Auto && s.device.empty() && manifest.empty())
    throw UsageError("--gap auto needs --device PROFILE.json (the manifest records no device)");
  o.cache_ratio = s.effective_cache_ratio(manifest);
  o.cache.window_tokens = s.cache_window;
  o.cache.run_admit_prob = s.run_admit_prob;
  o.cache.seed = s.seed;
  o.cache_policy = s.cache_policy;
  return o;
}

MemorySizing size_memory(const ImageManifest& m, const std::string& image_path, const MemoryRequest& r) {
  const ModelConfig& c = m.config;
  MemorySizing z;
  MemoryPlan& plan = z.plan;
  plan = memory_plan(m, r.context, r.residency, r.threads, r.baseline, r.read_batch, r.read_ahead, r.prefill_block,
                     r.read_buffers);
  if (r.lowrank_rank > 0 || r.stored_predictor)  // lowrank's f32 factors, or the stored predictor's region as stored
    plan.ffn_resident += r.stored_predictor
                             ? io_align_up(m.regions[m.predictor_region_index()].bytes)
                             : uint64_t(c.n_layers) * uint64_t(c.hidden_dim + c.dim) * uint64_t(r.lowrank_rank) * 4;
  if (r.verify_reads) {  // the per-bundle checksum table (8 bytes a slot) and the one FFN region held to build it
    for (int l = 0; l < c.n_layers; ++l) plan.scratch += uint64_t(m.n_slots(l)) * 8;
    for (int l = 0; l < c.n_layers; ++l)
      plan.load_transient = std::max(plan.load_transient, io_align_up(m.ffn(l).bytes));
  }
  z.cache_ratio = r.cache_ratio;
  z.cache_from = r.cache_ratio_given || r.budget == 0 ? "--cache-ratio" : "--memory-budget";
  if (r.residency == FfnResidency::kAll) {
    z.cache_ratio = 0;
    z.cache_from = "none (--select dense)";
  }
  if (r.budget) {
    const std::string what =
        "dense weights " + format_bytes(plan.dense) + " + FFN rows in DRAM " + format_bytes(plan.ffn_resident) +
        " + KV cache (" + std::to_string(r.context) + " positions) " + format_bytes(plan.kv) + " + buffers " +
        format_bytes(plan.scratch + plan.load_transient) + " + the process itself " + format_bytes(plan.baseline);
    const std::string limit = "more than --memory-budget " + r.budget_text + " = " + format_bytes(r.budget);
    if (plan.fixed() > r.budget)
      throw InputError(image_path, "needs " + format_bytes(plan.fixed()) + " before any neuron cache (" + what + "), " +
                                       limit + "; nothing was loaded");
    if (r.residency != FfnResidency::kAll) {
      if (r.cache_ratio_given) {
        plan.cache_bundles_per_layer = cache_capacity_for_ratio(z.cache_ratio, uint32_t(c.hidden_dim));
        if (plan.fixed() + plan.cache_bytes(c.n_layers) > r.budget)
          throw InputError(image_path, "--cache-ratio " + std::to_string(z.cache_ratio) + " needs " +
                                           format_bytes(plan.cache_bytes(c.n_layers)) + " of neuron cache on top of " +
                                           format_bytes(plan.fixed()) + " (" + what + "), " + limit +
                                           "; nothing was loaded");
      } else {
        plan.cache_bundles_per_layer = cache_bundles_for_budget(plan, m, r.budget);
        z.cache_ratio = double(plan.cache_bundles_per_layer) / double(c.hidden_dim);
      }
    }
  } else if (r.residency != FfnResidency::kAll) {
    plan.cache_bundles_per_layer = cache_capacity_for_ratio(z.cache_ratio, uint32_t(c.hidden_dim));
  }
  return z;
}

Generation generate(Model& model, FlashFfn* ffn, const std::vector<int>& prompt, int steps, Sampler& sampler,
                    const std::vector<int>& stop_tokens, int block, const GenerateHooks& hooks) {
  const int vocab = model.config().vocab_size;
  const int total = int(prompt.size()) + steps;
  Generation g;
  g.prompt_forwards = int(prompt.size());
  const bool batched = prompt.size() > 1;
  if (batched) model.reserve(std::min(block, int(prompt.size())));  // a pass's scratch, as llama.cpp's at load
  const auto t0 = Clock::now();
  auto t_first = t0;
  int token = prompt[0], pos = 0;
  const float* prompt_logits = nullptr;
  auto progress = [&hooks](uint64_t n) {
    if (hooks.on_progress) hooks.on_progress(n);
  };
  if (batched) {
    // Batched prefill: the prompt in passes of up to `block` tokens (matrix-matrix products; per token the same
    // arithmetic as one at a time, so the tokens are the same; a flash FFN reads the union of a pass's active sets
    // once per layer); the last pass takes the last token too and runs the classifier on it alone (forward_prompt):
    // the first token's logits.
    const int n = int(prompt.size());
    for (pos = 0; pos < n;) {
      const int len = std::min(block, n - pos);
      if (hooks.before_forward) hooks.before_forward(uint64_t(pos), len);
      if (pos + len == n)
        prompt_logits = model.forward_prompt(prompt.data() + pos, len, pos);
      else
        model.forward_sequence(prompt.data() + pos, len, pos, nullptr);
      if (ffn) ffn->end_token();
      progress(uint64_t(len));
      pos += len;
    }
    pos = n - 1;
    token = prompt[size_t(pos)];
  }
  for (; pos + 1 < total; ++pos) {
    const float* logits = prompt_logits;
    if (!logits) {
      if (hooks.stop && hooks.stop->load(std::memory_order_relaxed) && !g.tokens.empty()) {
        g.stopped_by_caller = true;
        break;
      }
      if (hooks.before_forward) hooks.before_forward(uint64_t(pos), 1);
      logits = model.forward_token(token, pos);
      if (ffn) ffn->end_token();
      progress(1);
    }
    prompt_logits = nullptr;
    if (pos + 1 < int(prompt.size())) {
      token = prompt[size_t(pos + 1)];
      continue;
    }
    if (g.tokens.empty()) g.prefill_seconds = since(t0);
    if (hooks.stop && hooks.stop->load(std::memory_order_relaxed)) {
      g.stopped_by_caller = true;
      break;
    }
    if (hooks.on_logits) hooks.on_logits(logits);
    token = sampler.sample(logits, vocab);
    g.tokens.push_back(token);
    const bool more = !hooks.on_token || hooks.on_token(token);
    if (g.tokens.size() == 1) {
      t_first = Clock::now();
      g.first_token_seconds = since(t0);
    }
    if (std::find(stop_tokens.begin(), stop_tokens.end(), token) != stop_tokens.end()) {
      g.stopped_at_eos = true;
      break;
    }
    if (!more) {
      g.stopped_by_caller = true;
      break;
    }
  }
  if (g.tokens.empty()) g.prefill_seconds = g.first_token_seconds = since(t0);  // keep the figures defined
  g.decode_seconds = std::chrono::duration<double>(Clock::now() - t_first).count();
  return g;
}

TextStream::TextStream(const Tokenizer& tok, const std::vector<int>& prompt)
    : tok_(tok), all_(prompt.begin(), prompt.end()), shown_(tok.decode(all_)) {}

std::string TextStream::push(int token) {
  all_.push_back(token);
  const std::string now = tok_.decode(all_);
  if (now.size() < shown_.size() || now.compare(0, shown_.size(), shown_) != 0) return "";
  std::string add = now.substr(shown_.size());
  shown_ = now;
  return add;
}

}  // namespace nl
