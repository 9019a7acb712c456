// nl-run generate: prompt -> tokens (greedy or sampled), streamed to stdout as they are produced; dense weights in
// DRAM, FFN neurons read from the flash image; a memory budget that sizes the neuron cache; a closing summary
// (time to first token, prompt and decode tokens/s, I/O share, peak RSS). docs/runtime.md "Generation".
#include <omp.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "cli/run_flash_options.h"
#include "formats/core/atomic_file.h"
#include "formats/core/bitmask.h"
#include "formats/core/error.h"
#include "formats/core/progress.h"
#include "runtime/io/file.h"
#include "runtime/memory.h"
#include "runtime/model/model.h"
#include "runtime/sampler.h"
#include "runtime/session.h"
#include "runtime/tokenizer.h"
#ifdef NL_FULL_BUILD
#include "cli/run_trace.h"
#include "profiler/tokenizer.h"  // SentencePiece as well (full builds only: libsentencepiece)
#endif

namespace nl::cli {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct GenerateArgs {
  FlashArgs flash;
  std::string prompt_tokens = "1";  // llama2.c BOS
  std::string prompt, tokenizer;
  int steps = 16;
  std::string select = "gate";
  double target_recall = 0.99;
  std::string calibrate_tokens = "1";
  int calibrate_steps = 64;
  SamplerConfig sampler;
  bool ignore_eos = false;
  int context = 0;  // 0 = prompt + steps (at most the model's seq_len)
  std::string memory_budget;
  std::string read_batch, read_ahead;  // --read-batch / --read-ahead; empty = memory.h's defaults
  int prefill_block = kPrefillBlockTokens;
  InvalidUtf8 invalid_utf8 = InvalidUtf8::kReplace;
  std::string overlap = "auto";            // auto | none | layer | cross | both; default measured in docs/runtime.md
  std::string logits_out;                  // --logits FILE.npy: every generated token's logits
  int top_logits = 0;                      // --top-logits K: the K largest logits per step in --json
  CLI::Option* prompt_opt = nullptr;       // to tell --prompt "" from no --prompt
  CLI::Option* queue_depth_opt = nullptr;  // to tell an explicit --queue-depth from its default
};

// A --memory-budget / --read-batch / --read-ahead value is checked when parsed: given, it is a size of at least one
// byte (an empty value or one that rounds to 0 bytes is refused, never read as "no budget").
CLI::Validator memory_size_check(const std::string& option) {
  return CLI::Validator(
      [option](std::string& s) {
        try {
          parse_memory_size(s, option);
          return std::string();
        } catch (const UsageError& e) {  // CLI11 puts the option's name before the message
          const std::string m = e.what();
          return m.rfind(option + ": ", 0) == 0 ? m.substr(option.size() + 2) : m;
        }
      },
      "", "SIZE");
}

std::string select_trace(const std::string& select) {
  Selection sel;
  return selection_parse(select, &sel).empty() ? sel.trace : std::string();
}

void add_generate_prompt_options(CLI::App* c, GenerateArgs& a) {
  auto* ids = c->add_option("--prompt-tokens", a.prompt_tokens, "Prompt as comma-separated token ids (default: 1, BOS)")
                  ->group("Prompt");
  a.prompt_opt = c->add_option("--prompt", a.prompt,
                               "Prompt text (BOS + the tokenizer's encoding; \"\" = BOS alone, with a warning, as in "
                               "llama.cpp)")
                     ->excludes(ids)
                     ->group("Prompt");
  c->add_option("--tokenizer", a.tokenizer,
                "Tokenizer (llama2.c tokenizer.bin; SentencePiece .model in full builds); default: the manifest's "
                "reference, relative to the manifest's folder. Generated text is printed when one is found")
      ->check(CLI::ExistingFile)
      ->group("Prompt");
  c->add_option("--steps", a.steps, "Tokens to generate at most (fewer when EOS comes first)")
      ->check(CLI::Range(1, 1 << 20))
      ->group("Prompt");
  c->add_option(
       "--select", a.select,
       "Which neurons to read: gate (exact, gate rows in DRAM) | dense (whole FFN decoded into DRAM: the "
       "reference) | predictor (the image's stored predictor, nl-layout pack --predictor; threshold calibrated as "
       "lowrank's) | predictor:T (deployed: score > T, no gate rows in DRAM, no calibration, recall not measured) | "
       "predictor+trace:T.h5 (the trace's sets, the stored predictor run and paid for) | lowrank:R (ReLU models: "
       "rank-R SVD predictor of the gate, threshold calibrated to "
       "--target-recall) | threshold:T (CATS: |act(gate x)| > T, gate rows in DRAM) | threshold (the same with the "
       "manifest's per-layer act_threshold) | topk:F (CATS by count: each layer-token's share F of neurons with the "
       "largest |act|, gate rows in DRAM) | trace:T.h5 (full "
       "builds: each token's neurons from a trace of the same shape; timing benchmarks)")
      ->check([](const std::string& s) {
        Selection sel;
        return selection_parse(s, &sel);
      })
      ->check([](const std::string& s) {  // a missing trace is a usage error (exit 2), as every missing input file
        const std::string t = select_trace(s);
        struct stat st {};
        return t.empty() || ::stat(t.c_str(), &st) == 0 ? std::string() : s + ": no such file";
      })
      ->group("Prompt");
}

void add_generate_sampling_options(CLI::App* c, GenerateArgs& a) {
  c->add_option("--temperature", a.sampler.temperature,
                "Sampling temperature; 0 = greedy (argmax), as is any T below 1e-4")
      ->check(CLI::Range(0.0, 1e6))
      ->group("Sampling");
  c->add_option("--top-k", a.sampler.top_k, "Keep the K most likely tokens (0 = all)")
      ->check(CLI::Range(0, 1 << 30))
      ->group("Sampling");
  c->add_option("--top-p", a.sampler.top_p, "Keep the smallest set of most likely tokens reaching probability P")
      ->check(CLI::Range(0.0, 1.0))
      ->group("Sampling");
  c->add_flag("--ignore-eos", a.ignore_eos, "Keep generating after the tokenizer's EOS token")->group("Sampling");
  c->add_option_function<std::string>(
       "--invalid-utf8",
       [&a](const std::string& s) { a.invalid_utf8 = s == "escape" ? InvalidUtf8::kEscape : InvalidUtf8::kReplace; },
       "Text that is not UTF-8 (byte tokens) in JSON: replace (U+FFFD per bad byte) or escape (\\xNN); stdout "
       "always gets the raw bytes")
      ->check(CLI::IsMember({"replace", "escape"}))
      ->default_str("replace")
      ->group("Output");
}

void add_generate_output_options(CLI::App* c, GenerateArgs& a) {
  c->add_option("--logits", a.logits_out,
                "Write the logits each generated token was drawn from, as a NumPy .npy file: float32 [generated "
                "tokens, vocab] (row i: before sampling token i; numpy.load reads it); committed with --metrics")
      ->group("Output");
  c->add_option("--top-logits", a.top_logits,
                "With --json: the K largest logits of each generated token as [id, logit] pairs (top_logits)")
      ->check(CLI::Range(1, 1 << 20))
      ->group("Output");
}

void add_generate_memory_options(CLI::App* c, GenerateArgs& a) {
  c->add_option("--context", a.context, "KV cache positions (default: prompt + steps, at most the model's seq_len)")
      ->check(CLI::Range(1, 1 << 24))
      ->group("Memory");
  c->add_option("--memory-budget", a.memory_budget,
                "DRAM for the whole process (6GiB, 512MiB, 2GB, 80% of MemAvailable): the neuron cache gets what the "
                "dense weights, gate rows, KV cache and buffers leave (an explicit --cache-ratio wins and is "
                "checked against it); refused with exit 3 when the fixed part does not fit")
      ->check(memory_size_check("--memory-budget"))
      ->group("Memory");
  c->add_option("--read-batch", a.read_batch,
                "FFN read staging: a layer's reads are staged and computed this many bytes at a time (default " +
                    std::to_string(kFfnReadBatchBytes >> 20) +
                    "MiB, at most a layer's FFN region; a read longer than this is split at bundle boundaries; two "
                    "such buffers under --overlap other than none, the next batch read while one is computed); the "
                    "tokens are the same for every size")
      ->check(memory_size_check("--read-batch"))
      ->group("Memory");
  c->add_option("--prefill-block", a.prefill_block,
                "prompt tokens per prefill pass (default " + std::to_string(kPrefillBlockTokens) +
                    "; 1 = one at a time): a flash FFN reads the union of a pass's active sets once per layer; the "
                    "tokens are the same for every size")
      ->check(CLI::Range(1, 1 << 16))
      ->group("Memory");
  c->add_option("--read-ahead", a.read_ahead,
                "--overlap cross|both: at most this many bytes of a layer's predicted bundles are read ahead "
                "(default " +
                    std::to_string(kFfnReadAheadBytes >> 20) +
                    "MiB, at most a layer's FFN region; the rest is read after the exact selection)")
      ->check(memory_size_check("--read-ahead"))
      ->group("Memory");
}

void add_generate_overlap_options(CLI::App* c, GenerateArgs& a) {
  c->add_option("--overlap", a.overlap,
                "I/O-compute overlap: layer = compute each bundle as its read completes (real with --io uring); "
                "cross = start a layer's FFN reads before its attention from a predictor; both; none; auto (default) = "
                "both, or layer for an image with flash replicas (cross does not read them)")
      ->check(CLI::IsMember({"auto", "none", "layer", "cross", "both"}))
      ->group("I/O");
}

void add_generate_predictor_options(CLI::App* c, GenerateArgs& a) {
  c->add_option("--target-recall", a.target_recall,
                "lowrank: share of firing neurons the threshold keeps on the calibration tokens")
      ->check(CLI::Range(0.0, 1.0))
      ->group("Predictor");
  c->add_option("--calibrate-prompt-tokens", a.calibrate_tokens,
                "lowrank: calibration prompt (token ids); the dense model's greedy continuation is the calibration set")
      ->group("Predictor");
  c->add_option("--calibrate-steps", a.calibrate_steps, "lowrank: calibration tokens generated")
      ->check(CLI::Range(1, 1 << 20))
      ->group("Predictor");
}

// `option` names the flag the ids came from (--prompt-tokens, --calibrate-prompt-tokens) in its errors.
std::vector<int> parse_tokens(const std::string& s, int vocab, const std::string& option) {
  std::vector<int> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t used = 0;
      int t = std::stoi(item, &used);
      if (used != item.size() || t < 0 || t >= vocab) throw std::invalid_argument(item);
      v.push_back(t);
    } catch (const std::exception&) {
      throw UsageError(option + ": '" + item + "' is not a token id in [0, " + std::to_string(vocab) + ")");
    }
  }
  if (v.empty()) throw UsageError(option + " is empty");
  return v;
}

// Writes the text (with a tokenizer) or the ids (without) to stdout as tokens are produced, flushed per token.
class Streamer {
 public:
  Streamer(const Tokenizer* tok, const std::vector<int>& prompt, bool on) : on_(on) {
    if (!on_) return;
    if (tok) {
      text_ = std::make_unique<TextStream>(*tok, prompt);
      std::fputs("text: ", stdout);
      std::fwrite(text_->text().data(), 1, text_->text().size(), stdout);
    } else {
      std::fputs("tokens:", stdout);
    }
    std::fflush(stdout);
  }
  void token(int t) {
    if (!on_) return;
    if (text_) {
      const std::string add = text_->push(t);
      std::fwrite(add.data(), 1, add.size(), stdout);
    } else {
      std::printf(" %d", t);
    }
    std::fflush(stdout);
  }
  void finish() {
    if (!on_) return;
    std::fputc('\n', stdout);
    std::fflush(stdout);
  }

 private:
  bool on_;
  std::unique_ptr<TextStream> text_;
};

// --select trace: each forward pass f takes trace token f (wrapping at the trace's end) for every layer.
struct TraceFeed {
  std::vector<LayerMask> masks;
  uint64_t n_tokens = 0;
  uint64_t wrapped = 0;  // forward passes that used a wrapped-around trace token
  std::vector<uint32_t> active;
  // Forward passes first .. first + n - 1 as tokens 0 .. n - 1 of one pass (a prompt block when n > 1).
  void apply(FlashFfn& ffn, uint64_t first, int n = 1) {
    for (int i = 0; i < n; ++i) {
      const uint64_t forward = first + uint64_t(i), t = forward % n_tokens;
      if (forward >= n_tokens) ++wrapped;
      for (size_t l = 0; l < masks.size(); ++l) {
        active.clear();
        const LayerMask& mk = masks[l];
        for (uint32_t k = 0; k < mk.n_neurons; ++k)
          if (mk.test(k, t)) active.push_back(k);
        ffn.set_trace_active(int(l), active, i);
      }
    }
  }
};

// Agreement of `out` with `ref`: share of equal positions (over the shorter) and the equal prefix.
// The K largest logits as [[id, logit], ...], largest first (ties: the lower id first).
nlohmann::json top_logits_json(const float* lg, int n, int k) {
  std::vector<int> ids(static_cast<size_t>(n), 0);
  for (int i = 0; i < n; ++i) ids[size_t(i)] = i;
  const size_t kk = std::min(size_t(k), ids.size());
  std::partial_sort(ids.begin(), ids.begin() + long(kk), ids.end(),
                    [lg](int x, int y) { return lg[x] > lg[y] || (lg[x] == lg[y] && x < y); });
  nlohmann::json r = nlohmann::json::array();
  for (size_t i = 0; i < kk; ++i) r.push_back({ids[i], lg[ids[i]]});
  return r;
}

// A NumPy .npy file (format 1.0) of float32 [rows][cols], little-endian: the magic, the header dict padded to a
// multiple of 64 bytes, the data.
std::string npy_f32(const std::vector<float>& v, size_t rows, size_t cols) {
  std::string h = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + std::to_string(rows) + ", " +
                  std::to_string(cols) + "), }";
  const size_t total = 10 + h.size() + 1;
  h.append((64 - total % 64) % 64, ' ');
  h += '\n';
  std::string out("\x93NUMPY\x01\x00", 8);
  out += char(h.size() & 0xff);
  out += char(h.size() >> 8);
  out += h;
  out.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));  // x86 and aarch64: little-endian
  return out;
}

std::pair<double, size_t> agreement(const std::vector<int>& out, const std::vector<int>& ref) {
  const size_t n = std::min(out.size(), ref.size());
  size_t same = 0, prefix = 0;
  for (size_t i = 0; i < n; ++i) same += out[i] == ref[i];
  while (prefix < n && out[prefix] == ref[prefix]) ++prefix;
  return {n ? double(same) / double(n) : 1.0, prefix};
}

// The session's settings from the command line.
SessionOptions session_options(const GenerateArgs& a, const FlashArgs& fa) {
  SessionOptions o;
  o.select = a.select;
  o.overlap = a.overlap;
  o.planner = fa.settings();
  o.memory_budget = a.memory_budget.empty() ? 0 : parse_memory_size(a.memory_budget);
  o.memory_budget_text = a.memory_budget;
  if (!a.read_batch.empty()) o.read_batch = parse_memory_size(a.read_batch, "--read-batch");
  if (!a.read_ahead.empty()) o.read_ahead = parse_memory_size(a.read_ahead, "--read-ahead");
  o.prefill_block = a.prefill_block;
  o.verify_reads = fa.verify_reads;
  o.tokenizer = a.tokenizer;
#ifdef NL_FULL_BUILD
  o.open_tokenizer = open_tokenizer;  // SentencePiece too; the runtime-only build keeps the Session's llama2.c reader
#endif
  o.warn = [](const std::string& s) { std::fprintf(stderr, "nl-run: warning: %s\n", s.c_str()); };
  o.target_recall = a.target_recall;
  o.calibrate_steps = a.calibrate_steps;
  return o;
}

// The prompt's ids: BOS + the tokenizer's encoding of --prompt, else --prompt-tokens; then the context it needs.
std::vector<int> read_prompt(const GenerateArgs& a, const Session& s, int* context) {
  const ModelConfig& c = s.manifest().config;
  std::vector<int> prompt;
  const bool text_prompt = a.prompt_opt && a.prompt_opt->count() > 0;
  if (text_prompt && a.prompt.empty()) warn_empty_prompt("nl-run");
  if (text_prompt) {
    if (!s.tokenizer())
      throw UsageError(
          "--prompt needs a tokenizer: --tokenizer FILE, or an image packed with --tokenizer whose file "
          "sits beside the manifest");
    prompt.push_back(s.tokenizer()->bos_id());
    for (int32_t t : s.tokenizer()->encode(a.prompt)) prompt.push_back(t);
  } else {
    prompt = parse_tokens(a.prompt_tokens, c.vocab_size, "--prompt-tokens");
  }
  const int total = int(prompt.size()) + a.steps;
  if (total > c.seq_len)
    throw UsageError("prompt + steps = " + std::to_string(total) + " exceeds the model's context " +
                     std::to_string(c.seq_len));
  *context = a.context ? a.context : total;
  if (*context > c.seq_len)
    throw UsageError("--context " + std::to_string(*context) + " exceeds the model's context " +
                     std::to_string(c.seq_len));
  if (total > *context)
    throw UsageError("prompt + steps = " + std::to_string(total) + " exceeds --context " + std::to_string(*context));
  return prompt;
}

// --select trace:FILE: the trace's masks (part of the process the budget covers, so read before sizing memory).
std::unique_ptr<TraceFeed> load_trace(const std::string& path, const ImageManifest& man, nlohmann::json& extra,
                                      bool* synthetic) {
  if (path.empty()) return nullptr;
#ifdef NL_FULL_BUILD
  auto feed = std::make_unique<TraceFeed>();
  TraceInfo ti;
  feed->masks = read_trace_masks(path, man, &ti);
  feed->n_tokens = ti.n_tokens;
  if (!feed->n_tokens) throw InputError(path, "has no tokens");
  *synthetic = *synthetic || trace_is_synthetic(ti);
  extra["trace"] = {
      {"path", path}, {"tokens", ti.n_tokens}, {"activation", ti.activation}, {"synthetic", trace_is_synthetic(ti)}};
  return feed;
#else
  (void)man, (void)extra, (void)synthetic;
  throw UsageError("--select trace:FILE.h5 reads HDF5 traces: it needs a full build (this is the runtime-only build)");
#endif
}

// lowrank / threshold: the calibration (lowrank), then the exact run on the prompt with the same sampler (the tokens
// the predicted run is compared with), then the predicting phase.
std::vector<int> reference_run(Session& s, const std::vector<int>& prompt, int steps, const SamplerConfig& sc,
                               const std::vector<int>& stop, nlohmann::json& extra) {
  const SelectMode m = s.selection().mode;
  if (m != SelectMode::kLowRank && m != SelectMode::kThreshold) return {};
  if (s.selection().deploy) {  // predictor:T has no gate rows: no exact run to compare with
    s.start_selection();
    return {};
  }
  s.calibrate();
  if (m == SelectMode::kLowRank) extra["calibration_samples"] = s.ffn()->calibration_samples();
  std::vector<int> reference = s.generate(prompt, steps, sc, stop).tokens;
  s.start_selection();
  return reference;
}

// Decode-time figures (the forwards after the prompt's), summed from the FFN's per-token counters.
struct DecodeTimes {
  double io = 0, io_busy = 0, compute = 0, verify = 0;
};
DecodeTimes decode_times(const FlashFfn* ffn, int prompt_forwards) {
  DecodeTimes d;
  if (ffn)
    for (size_t i = size_t(prompt_forwards); i < ffn->per_token().size(); ++i) {
      d.io += ffn->per_token()[i].io_seconds;
      d.io_busy += ffn->per_token()[i].io_busy_seconds;
      d.compute += ffn->per_token()[i].compute_seconds;
      d.verify += ffn->per_token()[i].verify_seconds;
    }
  return d;
}

nlohmann::json overlap_json(const Session& s, const OverlapCounters& o) {
  // Whole run, prompt included; io_wait is the I/O nobody computed under.
  return {{"mode", overlap_mode_name(s.overlap())},
          {"engine_async", s.image().io().async()},
          {"layer_tokens", o.layer_tokens},
          {"bundles_computed", o.bundles_computed},
          {"bundles_computed_in_flight", o.bundles_in_flight},
          {"prefetches", o.prefetches},
          {"predicted_bundles", o.predicted},
          {"needed_bundles", o.needed},
          {"predicted_and_needed_bundles", o.predicted_needed},
          {"prefetch_bytes", o.prefetch_bytes},
          {"prefetch_used_bytes", o.prefetch_used_bytes},
          {"pieces_in_place", o.pieces_in_place},
          {"pieces_copied", o.pieces_copied},
          {"extra_bytes", o.extra_bytes()},
          {"late_bytes", o.late_bytes},
          {"batches", o.batches},
          {"batches_read_ahead", o.batches_ahead},
          {"io_busy_seconds", o.io_busy_seconds},
          {"io_wait_seconds", o.io_wait_seconds},
          {"overlap_share_of_io", o.overlap_share()}};
}

nlohmann::json memory_json(const Session& s, uint64_t peak) {
  const MemoryPlan& plan = s.memory().plan;
  return {{"budget_bytes", s.options().memory_budget},
          {"context", s.context()},
          {"baseline_bytes", plan.baseline},
          {"dense_bytes", plan.dense},
          {"ffn_resident_bytes", plan.ffn_resident},
          {"kv_cache_bytes", plan.kv},
          {"scratch_bytes", plan.scratch},
          {"load_transient_bytes", plan.load_transient},
          {"fixed_bytes", plan.fixed()},
          {"cache_bundles_per_layer", plan.cache_bundles_per_layer},
          {"cache_bytes", plan.cache_bytes(s.manifest().config.n_layers)},
          {"cache_sized_by", s.memory().cache_from},
          {"peak_rss_bytes", peak}};
}

// The predictor's (lowrank) or the threshold's figures against the exact run's tokens.
void selection_json(const GenerateArgs& a, const Session& s, const std::vector<int>& out,
                    const std::vector<int>& reference, uint64_t forwards, nlohmann::json& extra) {
  const SelectMode m = s.selection().mode;
  const FlashFfn* ffn = s.ffn();
  const auto [agree, prefix] = agreement(out, reference);
  if (m == SelectMode::kTrace && s.selection().trace_pays_predictor) {
    extra["predictor"] = {
        {"rank", s.selection().rank},
        {"source", "stored: " + s.manifest().predictor_source},
        {"paid", true},  // run and timed as predictor:0; the trace's sets are read instead of its choice
        {"predicted_per_layer_token",
         double(ffn->predictor().predicted) /
             double(std::max<uint64_t>(1, forwards * uint64_t(s.manifest().config.n_layers)))}};
    return;
  }
  if (m == SelectMode::kLowRank && s.selection().deploy) {
    const PredictorCounters& p = ffn->predictor();
    extra["predictor"] = {
        {"rank", s.selection().rank},
        {"source", "stored: " + s.manifest().predictor_source},
        {"deployed", true},
        {"threshold", s.selection().predictor_threshold},
        {"recall", nullptr},  // no gate rows: what fires is not known (--select predictor measures it)
        {"precision", nullptr},
        {"predicted_per_layer_token",
         double(p.predicted) / double(std::max<uint64_t>(1, forwards * uint64_t(s.manifest().config.n_layers)))}};
    return;
  }
  if (m == SelectMode::kLowRank) {
    const PredictorCounters& p = ffn->predictor();
    const int layers = s.manifest().config.n_layers;
    extra["predictor"] = {
        {"rank", s.selection().rank},
        {"source", s.selection().stored ? "stored: " + s.manifest().predictor_source : "lowrank SVD fit"},
        {"target_recall", a.target_recall},
        {"calibration_prompt_tokens", s.options().calibrate_tokens},
        {"calibration_steps", a.calibrate_steps},
        {"thresholds", ffn->thresholds()},
        {"recall", p.recall()},
        {"precision", p.precision()},
        {"predicted_per_layer_token", double(p.predicted) / double(std::max<uint64_t>(1, forwards * uint64_t(layers)))},
        {"dense_tokens", reference},
        {"token_agreement", agree},
        {"agreeing_prefix", prefix}};
  }
  if (m == SelectMode::kThreshold) {
    const ThresholdCounters& tc = ffn->threshold_counters();
    extra["threshold"] = {{"t", s.thresholds()},
                          {"topk", s.selection().topk},
                          {"mass_recall", tc.mass_recall()},
                          {"kept_fraction", tc.total ? double(tc.kept) / double(tc.total) : 1.0},
                          {"dense_tokens", reference},
                          {"token_agreement", agree},
                          {"agreeing_prefix", prefix}};
  }
}

// The run's timing and memory (JSON `generation`); stderr's summary line.
nlohmann::json generation_json(const Generation& gen, const DecodeTimes& d, const std::vector<int>& stop,
                               const SamplerConfig& sc, uint64_t peak) {
  const int decode_forwards = gen.tokens.empty() ? 0 : int(gen.tokens.size()) - 1;
  const double pp_tps = gen.prefill_seconds > 0 ? double(gen.prompt_forwards) / gen.prefill_seconds : 0.0;
  const double dec_tps = gen.decode_seconds > 0 && decode_forwards ? double(decode_forwards) / gen.decode_seconds : 0.0;
  return {{"prompt_tokens", gen.prompt_forwards},
          {"generated_tokens", gen.tokens.size()},
          {"stop", gen.stopped_at_eos ? "eos" : "steps"},
          {"stop_tokens", stop},
          {"time_to_first_token_seconds", gen.first_token_seconds},
          {"prefill_seconds", gen.prefill_seconds},
          {"prompt_tokens_per_second", pp_tps},
          {"decode_forwards", decode_forwards},
          {"decode_seconds", gen.decode_seconds},
          {"decode_tokens_per_second", dec_tps},
          {"decode_io_seconds", d.io},
          {"decode_io_share", gen.decode_seconds > 0 ? d.io / gen.decode_seconds : 0.0},
          {"decode_io_busy_seconds", d.io_busy},
          {"decode_ffn_compute_seconds", d.compute},
          {"decode_verify_seconds", d.verify},  // --verify-reads: hashing the bundles read
          {"peak_rss_bytes", peak},
          {"sampler", {{"temperature", sc.temperature}, {"top_k", sc.top_k}, {"top_p", sc.top_p}, {"seed", sc.seed}}}};
}

// What stdout gets after the streamed line (without --json) and stderr's summary (without --quiet).
void print_summary(const GenerateArgs& a, const GlobalOptions& g, Session& s, const nlohmann::json& extra,
                   const std::string& label) {
  const nlohmann::json& gj = extra["generation"];
  if (!g.json) {
    if (s.tokenizer()) {  // the text streamed above; the ids now
      std::printf("tokens:");
      for (int t : extra["generated"]) std::printf(" %d", t);
      std::printf("\n");
    }
    if (extra.contains("predictor") && extra["predictor"].contains("paid")) {
      std::printf(
          "stored rank-%d predictor run and paid for (%.1f neurons per layer-token at score > 0, discarded: "
          "the trace's sets are read)\n",
          s.selection().rank, extra["predictor"]["predicted_per_layer_token"].get<double>());
    } else if (extra.contains("predictor") && extra["predictor"].contains("deployed")) {
      const auto& p = extra["predictor"];
      std::printf(
          "stored rank-%d predictor, deployed: score > %g, %.1f neurons per layer-token; recall not measured "
          "(no gate rows: --select predictor measures it)\n",
          s.selection().rank, p["threshold"].get<double>(), p["predicted_per_layer_token"].get<double>());
    } else if (extra.contains("predictor")) {
      const auto& p = extra["predictor"];
      std::printf(
          "%s%d predictor: recall %.4f, precision %.4f (target recall %.3f on %llu calibration samples); "
          "token agreement with dense %.4f, first %zu tokens identical\n",
          s.selection().stored ? "stored rank-" : "lowrank:", s.selection().rank, p["recall"].get<double>(),
          p["precision"].get<double>(), a.target_recall,
          static_cast<unsigned long long>(s.ffn()->calibration_samples()), p["token_agreement"].get<double>(),
          p["agreeing_prefix"].get<size_t>());
    }
    if (extra.contains("threshold")) {
      const auto& p = extra["threshold"];
      std::printf(
          "%s: |act| mass recall %.4f, neurons kept %.4f; token agreement with dense %.4f, first %zu "
          "tokens identical\n",
          a.select.c_str(), p["mass_recall"].get<double>(), p["kept_fraction"].get<double>(),
          p["token_agreement"].get<double>(), p["agreeing_prefix"].get<size_t>());
    }
    if (!label.empty()) std::printf("%s\n", label.c_str());
  }
  if (g.quiet) return;
  const uint64_t budget = s.options().memory_budget;
  std::fprintf(stderr,
               "generate: %d prompt tokens in %.3f s (%.1f tok/s), first token after %.3f s; %d decode tokens in "
               "%.3f s (%.1f tok/s), I/O %.1f%% of decode; peak RSS %s%s%s\n",
               gj["prompt_tokens"].get<int>(), gj["prefill_seconds"].get<double>(),
               gj["prompt_tokens_per_second"].get<double>(), gj["time_to_first_token_seconds"].get<double>(),
               gj["decode_forwards"].get<int>(), gj["decode_seconds"].get<double>(),
               gj["decode_tokens_per_second"].get<double>(), gj["decode_io_share"].get<double>() * 100,
               format_bytes(gj["peak_rss_bytes"].get<uint64_t>()).c_str(),
               budget ? (" (budget " + format_bytes(budget) + ")").c_str() : "",
               !label.empty() ? (" [" + label + "]").c_str() : "");
  if (extra.contains("overlap") && s.overlap() != OverlapMode::kNone) {
    const OverlapCounters& o = s.ffn()->overlap();
    std::fprintf(
        stderr,
        "overlap %s (%s): I/O busy %.3f s, waited %.3f s (%.1f%% hidden); %llu of %llu bundles computed with "
        "reads in flight; read-ahead: %llu predicted, %llu needed, %llu both, %s extra, %s late\n",
        overlap_mode_name(s.overlap()),
        s.image().io().async() ? "async engine" : "synchronous engine: reads overlap compute only across threads",
        o.io_busy_seconds, o.io_wait_seconds, o.overlap_share() * 100,
        static_cast<unsigned long long>(o.bundles_in_flight), static_cast<unsigned long long>(o.bundles_computed),
        static_cast<unsigned long long>(o.predicted), static_cast<unsigned long long>(o.needed),
        static_cast<unsigned long long>(o.predicted_needed),
        format_bytes(uint64_t(std::max(0.0, o.extra_bytes()))).c_str(), format_bytes(o.late_bytes).c_str());
  }
}

void generate_main(const GenerateArgs& a, const GlobalOptions& g) {
  apply_global_options(g);
  CommitGroup outputs;  // --logits and --metrics commit together or not at all
  if (std::string p = sampler_config_problem(a.sampler); !p.empty()) throw UsageError(p);
  FlashArgs fa = a.flash;
  // A whole layer's reads in flight under read-ahead overlap unless --queue-depth says otherwise (default_queue_depth).
  if (a.queue_depth_opt && a.queue_depth_opt->count() == 0) fa.queue_depth = default_queue_depth(a.overlap);
  SessionOptions so = session_options(a, fa);
  auto img = flash_open(fa, g, {}, {{"--logits", a.logits_out}});
  if (a.select.rfind("lowrank:", 0) == 0 || a.select == "predictor")
    so.calibrate_tokens =
        parse_tokens(a.calibrate_tokens, img->manifest().config.vocab_size, "--calibrate-prompt-tokens");
  Session s(std::move(img), so);
  int context = 0;
  const std::vector<int> prompt = read_prompt(a, s, &context);
  const bool synthetic_image = s.manifest().source.rfind("synthetic", 0) == 0;
  bool synthetic = synthetic_image;
  nlohmann::json extra = {{"mode", "generate"}, {"select", a.select}, {"prompt_tokens", prompt}};
  std::unique_ptr<TraceFeed> feed = load_trace(s.selection().trace, s.manifest(), extra, &synthetic);
  s.load(context);
  fa.cache_ratio_ran = s.memory().cache_ratio;  // as sized (the summary's and --metrics' cache ratio)
  const std::vector<int> stop = a.ignore_eos ? std::vector<int>{} : s.stop_tokens();
  SamplerConfig sc = a.sampler;
  sc.seed = fa.seed;
  const std::vector<int> reference = reference_run(s, prompt, a.steps, sc, stop, extra);
  const int vocab = s.manifest().config.vocab_size;
  Streamer stream(s.tokenizer(), prompt, !g.json);
  Progress prog("generate", uint64_t(int(prompt.size()) + a.steps - 1), !g.quiet, "tokens");
  std::vector<float> logits_rows;  // --logits: [generated][vocab]
  nlohmann::json top = nlohmann::json::array();
  GenerateHooks hooks;
  if (!a.logits_out.empty() || (a.top_logits > 0 && g.json))
    hooks.on_logits = [&](const float* lg) {
      if (!a.logits_out.empty()) logits_rows.insert(logits_rows.end(), lg, lg + vocab);
      if (a.top_logits > 0 && g.json) top.push_back(top_logits_json(lg, vocab, a.top_logits));
    };
  hooks.on_token = [&stream](int t) { return stream.token(t), true; };
  hooks.on_progress = [&prog](uint64_t n) { prog.add(n); };
  if (feed) hooks.before_forward = [&](uint64_t first, int n) { feed->apply(*s.ffn(), first, n); };
  const auto t0 = Clock::now();
  const Generation gen = s.generate(prompt, a.steps, sc, stop, hooks);
  const double wall = since(t0);
  stream.finish();  // the streamed line ends before progress writes its last line (2>&1 stays readable)
  prog.finish();
  const std::vector<int>& out = gen.tokens;
  const uint64_t forwards = uint64_t(gen.prompt_forwards) + (out.empty() ? 0 : out.size() - 1);
  extra["generated"] = out;
  if (a.top_logits > 0 && g.json) extra["top_logits"] = top;
  if (!a.logits_out.empty()) {
    write_file_atomic(a.logits_out, npy_f32(logits_rows, out.size(), size_t(vocab)));  // with --metrics
    extra["logits_file"] = a.logits_out;
  }
  if (const Tokenizer* tok = s.tokenizer()) {
    std::vector<int32_t> all(prompt.begin(), prompt.end());
    all.insert(all.end(), out.begin(), out.end());
    extra["tokenizer"] = s.tokenizer_path();  // json_dump below applies --invalid-utf8
    extra["text"] = tok->decode(all);  // prompt + continuation (decoding the parts apart would drop the joining space)
    if (a.prompt_opt && a.prompt_opt->count() > 0) extra["prompt"] = a.prompt;
  }
  const uint64_t peak = peak_rss_bytes();
  extra["generation"] = generation_json(gen, decode_times(s.ffn(), gen.prompt_forwards), stop, sc, peak);
  const std::string label = synthetic ? "synthetic selection from a trace: timing only, text meaningless" : "";
  if (synthetic) extra["synthetic"] = label;
  const bool dense = s.selection().mode == SelectMode::kDense;
  if (!dense) extra["overlap"] = overlap_json(s, s.ffn()->overlap());
  if (feed) extra["trace"]["wrapped_forwards"] = feed->wrapped;
  extra["memory"] = memory_json(s, peak);
  selection_json(a, s, out, reference, forwards, extra);
  print_summary(a, g, s, extra, label);
  flash_report(fa, g, s.image(), dense ? nullptr : s.ffn(), wall, forwards, json_dump(extra, -1, a.invalid_utf8));
  outputs.commit();  // --logits and --metrics: both or neither
}

}  // namespace

void add_run_generate(CLI::App& app, GlobalOptions& g) {
  static GenerateArgs a;
  CLI::App* c = app.add_subcommand("generate", "Generate tokens, reading only the needed FFN neurons from the image");
  add_flash_image_options(c, a.flash);
  add_generate_prompt_options(c, a);
  add_generate_sampling_options(c, a);
  add_generate_memory_options(c, a);
  add_generate_output_options(c, a);
  add_generate_predictor_options(c, a);
  add_flash_io_options(c, a.flash);
  add_generate_overlap_options(c, a);
  add_flash_plan_options(c, a.flash);
  add_flash_metrics_options(c, a.flash);
  a.queue_depth_opt = c->get_option("--queue-depth");
  c->callback([&g] { generate_main(a, g); });
}

}  // namespace nl::cli
