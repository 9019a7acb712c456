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
#include "runtime/tokenizer.h"
#ifdef NL_FULL_BUILD
#include "cli/run_trace.h"
#include "profiler/tokenizer.h"  // SentencePiece as well (full builds only: libsentencepiece)
#endif

namespace nl::cli {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// io_uring reads in flight under --overlap cross|both (a layer's read-ahead; the ring itself is a few hundred KiB).
constexpr uint32_t kReadAheadQueueDepth = 4096;

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
  CLI::Option* cache_ratio_opt = nullptr;  // to tell an explicit --cache-ratio from its default
  CLI::Option* prompt_opt = nullptr;       // to tell --prompt "" from no --prompt
  CLI::Option* queue_depth_opt = nullptr;  // to tell an explicit --queue-depth from its default
};

// "lowrank:R" -> R, else 0.
int lowrank_rank(const std::string& select) {
  if (select.rfind("lowrank:", 0) != 0) return 0;
  try {
    size_t used = 0;
    int r = std::stoi(select.substr(8), &used);
    return used == select.size() - 8 && r > 0 ? r : -1;
  } catch (const std::exception&) {
    return -1;
  }
}

// "threshold:T" -> T (>= 0); NaN when `select` is not of that form.
double select_threshold(const std::string& select) {
  if (select.rfind("threshold:", 0) != 0) return std::nan("");
  const std::string num = select.substr(10);
  if (!float_arg_problem(num).empty()) return -1.0;
  const double t = std::strtod(num.c_str(), nullptr);
  return t >= 0 ? t : -1.0;
}

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
  return select.rfind("trace:", 0) == 0 ? select.substr(6) : std::string();
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
       "reference) | lowrank:R (ReLU models: rank-R SVD predictor of the gate, threshold calibrated to "
       "--target-recall) | threshold:T (CATS: |act(gate x)| > T, gate rows in DRAM) | threshold (the same with the "
       "manifest's per-layer act_threshold) | trace:T.h5 (full "
       "builds: each token's neurons from a trace of the same shape; timing benchmarks)")
      ->check([](const std::string& s) {
        return s == "gate" || s == "dense" || s == "threshold" || lowrank_rank(s) > 0 || select_threshold(s) >= 0 ||
                       !select_trace(s).empty()
                   ? std::string()
                   : "expected gate, dense, lowrank:R (R >= 1), threshold, threshold:T (T >= 0) or trace:FILE.h5";
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

std::unique_ptr<Tokenizer> open_run_tokenizer(const std::string& path) {
#ifdef NL_FULL_BUILD
  return open_tokenizer(path);
#else
  if (is_sentencepiece_file(path))
    throw InputError(path, "is a SentencePiece model; this runtime-only build reads llama2.c tokenizers only");
  return open_llama2c_tokenizer(path);
#endif
}

// --tokenizer, else the manifest's reference (relative to the manifest's folder) when that file exists, else "".
std::string tokenizer_path(const GenerateArgs& a, const FlashImage& img) {
  if (!a.tokenizer.empty()) return a.tokenizer;
  const std::string& ref = img.manifest().tokenizer;
  if (ref.empty()) return "";
  // manifest_load accepts only a file name here (no path out of the folder).
  const std::string& mp = img.manifest_path();
  const auto slash = mp.rfind('/');
  const std::string p = (slash == std::string::npos ? std::string() : mp.substr(0, slash + 1)) + ref;
  // Exists: then the tokenizer reader opens it (without blocking: a FIFO there is refused, not waited on).
  struct stat st {};
  return ::lstat(p.c_str(), &st) == 0 ? p : "";
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
// Raw bytes: a byte token goes out as its byte, even where it leaves UTF-8 incomplete.
class Streamer {
 public:
  Streamer(const Tokenizer* tok, const std::vector<int>& prompt, bool on) : tok_(tok), on_(on) {
    all_.assign(prompt.begin(), prompt.end());
    if (!on_) return;
    if (tok_) {
      shown_ = tok_->decode(all_);
      std::fputs("text: ", stdout);
      std::fwrite(shown_.data(), 1, shown_.size(), stdout);
    } else {
      std::fputs("tokens:", stdout);
    }
    std::fflush(stdout);
  }
  void token(int t) {
    all_.push_back(t);
    if (!on_) return;
    if (tok_) {
      // The decoded sequence grows at its end; a tokenizer that rewrites earlier text (none we read does) waits.
      const std::string now = tok_->decode(all_);
      if (now.size() >= shown_.size() && now.compare(0, shown_.size(), shown_) == 0) {
        std::fwrite(now.data() + shown_.size(), 1, now.size() - shown_.size(), stdout);
        shown_ = now;
      }
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
  const Tokenizer* tok_;
  bool on_;
  std::vector<int32_t> all_;
  std::string shown_;
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

struct Generation {
  std::vector<int> tokens;  // generated (the EOS token included when it stopped generation)
  bool stopped_at_eos = false;
  int prompt_forwards = 0;  // forward passes over the prompt (its last one gives the first token's logits)
  double prefill_seconds = 0, first_token_seconds = 0, decode_seconds = 0;
};

// Feeds the prompt, then up to `steps` tokens from `sampler`, stopping after a token of `stop`. Ends each forward
// pass on `ffn` (may be null). `stream`, `feed` and `prog` may be null.
// `on_logits` (may be empty) sees the logits of each generated token before it is sampled.
Generation generate(Model& model, FlashFfn* ffn, const std::vector<int>& prompt, int steps, Sampler& sampler,
                    const std::vector<int>& stop, int block, Streamer* stream = nullptr, TraceFeed* feed = nullptr,
                    Progress* prog = nullptr, const std::function<void(const float*)>& on_logits = {}) {
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
  if (batched) {
    // Batched prefill: the prompt in passes of up to `block` tokens (matrix-matrix products; per token the same
    // arithmetic as one at a time, so the tokens are the same; a flash FFN reads the union of a pass's active sets
    // once per layer); the last pass takes the last token too and runs the classifier on it alone (forward_prompt):
    // the first token's logits. A trace feed names each token's neurons.
    const int n = int(prompt.size());
    for (pos = 0; pos < n;) {
      const int len = std::min(block, n - pos);
      if (feed) feed->apply(*ffn, uint64_t(pos), len);
      if (pos + len == n)
        prompt_logits = model.forward_prompt(prompt.data() + pos, len, pos);
      else
        model.forward_sequence(prompt.data() + pos, len, pos, nullptr);
      if (ffn) ffn->end_token();
      if (prog) prog->add(uint64_t(len));
      pos += len;
    }
    pos = n - 1;
    token = prompt[size_t(pos)];
  }
  for (; pos + 1 < total; ++pos) {
    const float* logits = prompt_logits;
    if (!logits) {
      if (feed) feed->apply(*ffn, uint64_t(pos));
      logits = model.forward_token(token, pos);
      if (ffn) ffn->end_token();
      if (prog) prog->add(1);
    }
    prompt_logits = nullptr;
    if (pos + 1 < int(prompt.size())) {
      token = prompt[size_t(pos + 1)];
      continue;
    }
    if (g.tokens.empty()) g.prefill_seconds = since(t0);
    if (on_logits) on_logits(logits);
    token = sampler.sample(logits, vocab);
    g.tokens.push_back(token);
    if (stream) stream->token(token);
    if (g.tokens.size() == 1) {
      t_first = Clock::now();
      g.first_token_seconds = since(t0);
    }
    if (std::find(stop.begin(), stop.end(), token) != stop.end()) {
      g.stopped_at_eos = true;
      break;
    }
  }
  if (g.tokens.empty()) {  // steps == 0 cannot happen (--steps >= 1); keep the figures defined
    g.prefill_seconds = g.first_token_seconds = since(t0);
  }
  g.decode_seconds = std::chrono::duration<double>(Clock::now() - t_first).count();
  if (stream) stream->finish();  // the streamed line ends before progress writes its last line (2>&1 stays readable)
  if (prog) prog->finish();
  return g;
}

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

void generate_main(const GenerateArgs& a, const GlobalOptions& g) {
  apply_global_options(g);
  CommitGroup outputs;  // --logits and --metrics commit together or not at all
  if (std::string p = sampler_config_problem(a.sampler); !p.empty()) throw UsageError(p);
  const uint64_t budget = a.memory_budget.empty() ? 0 : parse_memory_size(a.memory_budget);
  FlashArgs fa = a.flash;  // the cache ratio may come from the budget
  // Read-ahead runs while nobody collects completions (during attention): only reads already in the kernel's hands
  // progress then, so cross overlap puts a whole layer's reads in flight unless --queue-depth says otherwise.
  // (auto: resolved below, once the manifest tells whether the image holds replicas; the depth is set either way.)
  if ((a.overlap == "cross" || a.overlap == "both" || a.overlap == "auto") && a.queue_depth_opt &&
      a.queue_depth_opt->count() == 0)
    fa.queue_depth = kReadAheadQueueDepth;
  auto img = flash_open(fa, g, {}, {{"--logits", a.logits_out}});
  const ImageManifest& man = img->manifest();
  const std::string overlap = a.overlap != "auto" ? a.overlap : man.replicated() ? "layer" : "both";
  const ModelConfig& c = man.config;
  std::unique_ptr<Tokenizer> tok;
  const std::string tok_path = tokenizer_path(a, *img);
  if (!tok_path.empty()) {
    tok = open_run_tokenizer(tok_path);
    if (tok->vocab_size() != c.vocab_size)
      throw InputError(
          tok_path, "has " + std::to_string(tok->vocab_size()) + " tokens, the model " + std::to_string(c.vocab_size));
  }
  std::vector<int> prompt;
  const bool text_prompt = a.prompt_opt && a.prompt_opt->count() > 0;
  if (text_prompt && a.prompt.empty()) warn_empty_prompt("nl-run");
  if (text_prompt) {
    if (!tok)
      throw UsageError(
          "--prompt needs a tokenizer: --tokenizer FILE, or an image packed with --tokenizer whose file "
          "sits beside the manifest");
    prompt.push_back(tok->bos_id());
    for (int32_t t : tok->encode(a.prompt)) prompt.push_back(t);
  } else {
    prompt = parse_tokens(a.prompt_tokens, c.vocab_size, "--prompt-tokens");
  }
  const int total = int(prompt.size()) + a.steps;
  if (total > c.seq_len)
    throw UsageError("prompt + steps = " + std::to_string(total) + " exceeds the model's context " +
                     std::to_string(c.seq_len));
  const int context = a.context ? a.context : total;
  if (context > c.seq_len)
    throw UsageError("--context " + std::to_string(context) + " exceeds the model's context " +
                     std::to_string(c.seq_len));
  if (total > context)
    throw UsageError("prompt + steps = " + std::to_string(total) + " exceeds --context " + std::to_string(context));
  const int rank = lowrank_rank(a.select);
  const double thr = select_threshold(a.select);
  const bool threshold = thr >= 0 || a.select == "threshold";
  std::vector<float> thresholds;  // per layer
  if (thr >= 0) thresholds.assign(size_t(c.n_layers), float(thr));
  if (a.select == "threshold") {
    if (man.act_threshold.empty())
      throw InputError(img->manifest_path(),
                       "records no act_threshold: pack with --act-threshold-from TRACE.h5 (a "
                       "calibrated trace), or give --select threshold:T");
    for (double t : man.act_threshold) thresholds.push_back(float(t));
    if (man.version_major == 1 && man.version_minor < kImageVersionMinorThresholds)
      std::fprintf(stderr,
                   "nl-run: warning: %s is format 1.%u, whose image id does not cover act_threshold (an edit would go "
                   "unnoticed); re-pack to get a 1.%u image that covers it\n",
                   img->manifest_path().c_str(), man.version_minor, kImageVersionMinorThresholds);
  }
  const std::string trace_path = select_trace(a.select);
  const bool synthetic_image = man.source.rfind("synthetic", 0) == 0;
  bool synthetic = synthetic_image;

  // The trace first (its masks are part of the process the budget covers).
  std::unique_ptr<TraceFeed> feed;
  nlohmann::json extra = {{"mode", "generate"}, {"select", a.select}, {"prompt_tokens", prompt}};
  if (!trace_path.empty()) {
#ifdef NL_FULL_BUILD
    feed = std::make_unique<TraceFeed>();
    TraceInfo ti;
    feed->masks = read_trace_masks(trace_path, man, &ti);
    feed->n_tokens = ti.n_tokens;
    if (!feed->n_tokens) throw InputError(trace_path, "has no tokens");
    synthetic = synthetic || trace_is_synthetic(ti);
    extra["trace"] = {{"path", trace_path},
                      {"tokens", ti.n_tokens},
                      {"activation", ti.activation},
                      {"synthetic", trace_is_synthetic(ti)}};
#else
    throw UsageError(
        "--select trace:FILE.h5 reads HDF5 traces: it needs a full build (this is the runtime-only build)");
#endif
  }

  // Memory: the fixed part (measured baseline + dense + FFN rows in DRAM + KV + buffers) must fit the budget; the
  // neuron cache gets the rest unless --cache-ratio was given.
  const FfnResidency residency = a.select == "dense"   ? FfnResidency::kAll
                                 : !trace_path.empty() ? FfnResidency::kNone
                                                       : FfnResidency::kGateRows;
  const uint64_t read_batch =
      a.read_batch.empty() ? kFfnReadBatchBytes : parse_memory_size(a.read_batch, "--read-batch");
  const uint64_t read_ahead = overlap != "cross" && overlap != "both" ? 0
                              : a.read_ahead.empty()                  ? kFfnReadAheadBytes
                                                                      : parse_memory_size(a.read_ahead, "--read-ahead");
  MemoryPlan plan = memory_plan(man, context, residency, omp_get_max_threads(), current_rss_bytes(), read_batch,
                                read_ahead, a.prefill_block, overlap == "none" ? 1 : kFfnOverlapReadBuffers);
  if (rank > 0) plan.ffn_resident += uint64_t(c.n_layers) * uint64_t(c.hidden_dim + c.dim) * uint64_t(rank) * 4;
  if (fa.verify_reads) {  // the per-bundle checksum table (8 bytes a slot) and the one FFN region held to build it
    for (int l = 0; l < c.n_layers; ++l) plan.scratch += uint64_t(man.n_slots(l)) * 8;
    for (int l = 0; l < c.n_layers; ++l)
      plan.load_transient = std::max(plan.load_transient, io_align_up(man.ffn(l).bytes));
  }
  const bool ratio_given = a.cache_ratio_opt && a.cache_ratio_opt->count() > 0;
  // The ratio that runs: --cache-ratio, else the manifest's planner setting (effective_cache_ratio); the budget may
  // size it below. Both fields are set so that flash_ffn_options reads the same figure either way.
  auto set_ratio = [&fa](double r) { fa.cache_ratio = fa.planner.cache_ratio = r; };
  set_ratio(fa.effective_cache_ratio());
  std::string cache_from = ratio_given || budget == 0 ? "--cache-ratio" : "--memory-budget";
  if (residency == FfnResidency::kAll) set_ratio(0), cache_from = "none (--select dense)";
  if (budget) {
    const std::string what =
        "dense weights " + format_bytes(plan.dense) + " + FFN rows in DRAM " + format_bytes(plan.ffn_resident) +
        " + KV cache (" + std::to_string(context) + " positions) " + format_bytes(plan.kv) + " + buffers " +
        format_bytes(plan.scratch + plan.load_transient) + " + the process itself " + format_bytes(plan.baseline);
    if (plan.fixed() > budget)
      throw InputError(img->image_path(), "needs " + format_bytes(plan.fixed()) + " before any neuron cache (" + what +
                                              "), more than --memory-budget " + a.memory_budget + " = " +
                                              format_bytes(budget) + "; nothing was loaded");
    if (residency != FfnResidency::kAll) {
      if (ratio_given) {
        plan.cache_bundles_per_layer = cache_capacity_for_ratio(fa.cache_ratio, uint32_t(c.hidden_dim));
        if (plan.fixed() + plan.cache_bytes(c.n_layers) > budget)
          throw InputError(img->image_path(), "--cache-ratio " + std::to_string(fa.cache_ratio) + " needs " +
                                                  format_bytes(plan.cache_bytes(c.n_layers)) +
                                                  " of neuron cache on top of " + format_bytes(plan.fixed()) + " (" +
                                                  what + "), more than --memory-budget " + a.memory_budget + " = " +
                                                  format_bytes(budget) + "; nothing was loaded");
      } else {
        plan.cache_bundles_per_layer = cache_bundles_for_budget(plan, man, budget);
        set_ratio(double(plan.cache_bundles_per_layer) / double(c.hidden_dim));
      }
    }
  } else if (residency != FfnResidency::kAll) {
    plan.cache_bundles_per_layer = cache_capacity_for_ratio(fa.cache_ratio, uint32_t(c.hidden_dim));
  }

  // The dense weights in DRAM as stored (no f32 copy); --select dense holds the whole FFN in DRAM the same way.
  const std::unique_ptr<DenseStore> dense = img->load_dense_store();
  const ModelView& w = dense->view;
  std::unique_ptr<FlashFfn> ffn;
  if (a.select == "dense") ffn = std::make_unique<FlashFfn>(*img, flash_ffn_options(fa, SelectMode::kDense));
  // Stop tokens: the tokenizer's EOS; llama2.c models also end a text with BOS (run.c stops there). None without a
  // tokenizer or with --ignore-eos.
  std::vector<int> stop;
  if (tok && !a.ignore_eos) {
    stop.push_back(tok->eos_id());
    if (tok->kind() == "llama2c") stop.push_back(tok->bos_id());
  }
  SamplerConfig sc = a.sampler;
  sc.seed = fa.seed;
  std::vector<int> reference;
  if (a.select != "dense") {
    const SelectMode mode = rank > 0    ? SelectMode::kLowRank
                            : threshold ? SelectMode::kThreshold
                            : feed      ? SelectMode::kTrace
                                        : SelectMode::kGate;
    FlashFfnOptions fo = flash_ffn_options(fa, mode);
    fo.lowrank_rank = rank;
    if (!overlap_mode_parse(overlap, &fo.overlap)) throw UsageError("unknown --overlap " + overlap);
    fo.read_batch_bytes = read_batch;
    fo.read_ahead_bytes = read_ahead;
    if (threshold) fo.act_threshold.assign(size_t(c.n_layers), -std::numeric_limits<float>::infinity());
    ffn = std::make_unique<FlashFfn>(*img, fo);
  }
  if (rank > 0) {
    // Calibration on the exact model's own continuation of the calibration prompt, then the exact reference run on
    // the prompt (token agreement), then the predicted run whose reads and tokens are reported.
    std::vector<int> cal = parse_tokens(a.calibrate_tokens, c.vocab_size, "--calibrate-prompt-tokens");
    const int cal_total = int(cal.size()) + a.calibrate_steps;
    if (cal_total > c.seq_len)
      throw UsageError("calibration prompt + steps = " + std::to_string(cal_total) + " exceeds the model's context " +
                       std::to_string(c.seq_len));
    ffn->set_phase(LowRankPhase::kCalibrate);
    {
      Model cm(w, cal_total);
      cm.set_ffn(ffn.get());
      Sampler greedy(SamplerConfig{});
      generate(cm, ffn.get(), cal, a.calibrate_steps, greedy, {}, a.prefill_block);
    }
    ffn->set_phase(LowRankPhase::kExact, a.target_recall);
    extra["calibration_samples"] = ffn->calibration_samples();
  }
  if (rank > 0 || threshold) {
    // The exact run (gate selection) on the prompt with the same sampler settings: the tokens to agree with.
    Model rm(w, context);
    rm.set_ffn(ffn.get());
    Sampler s(sc);
    reference = generate(rm, ffn.get(), prompt, a.steps, s, stop, a.prefill_block).tokens;
    if (rank > 0) ffn->set_phase(LowRankPhase::kPredict);
    if (threshold) ffn->set_thresholds(thresholds);
  }
  Model model(w, context);
  if (ffn) model.set_ffn(ffn.get());
  Sampler sampler(sc);
  const bool stream_on = !g.json;
  Streamer stream(tok.get(), prompt, stream_on);
  Progress prog("generate", uint64_t(total - 1), !g.quiet, "tokens");
  std::vector<float> logits_rows;  // --logits: [generated][vocab]
  nlohmann::json top = nlohmann::json::array();
  std::function<void(const float*)> on_logits;
  if (!a.logits_out.empty() || (a.top_logits > 0 && g.json))
    on_logits = [&](const float* lg) {
      if (!a.logits_out.empty()) logits_rows.insert(logits_rows.end(), lg, lg + c.vocab_size);
      if (a.top_logits > 0 && g.json) top.push_back(top_logits_json(lg, c.vocab_size, a.top_logits));
    };
  const auto t0 = Clock::now();
  Generation gen = generate(model, ffn.get(), prompt, a.steps, sampler, stop, a.prefill_block, &stream, feed.get(),
                            &prog, on_logits);
  const double wall = since(t0);
  const std::vector<int>& out = gen.tokens;
  const uint64_t forwards = uint64_t(gen.prompt_forwards) + (out.empty() ? 0 : out.size() - 1);
  extra["generated"] = out;
  if (a.top_logits > 0 && g.json) extra["top_logits"] = top;
  if (!a.logits_out.empty()) {
    write_file_atomic(a.logits_out, npy_f32(logits_rows, out.size(), size_t(c.vocab_size)));  // with --metrics
    extra["logits_file"] = a.logits_out;
  }
  std::string text;
  if (tok) {
    std::vector<int32_t> all(prompt.begin(), prompt.end());
    all.insert(all.end(), out.begin(), out.end());
    text = tok->decode(all);        // prompt + continuation (decoding the parts apart would drop the joining space)
    extra["tokenizer"] = tok_path;  // json_dump below applies --invalid-utf8
    extra["text"] = text;
    if (text_prompt) extra["prompt"] = a.prompt;
  }
  // Timing and memory of this run.
  double decode_io = 0, decode_io_busy = 0, decode_ffn_compute = 0, decode_verify = 0;
  if (ffn)
    for (size_t i = size_t(gen.prompt_forwards); i < ffn->per_token().size(); ++i) {
      decode_io += ffn->per_token()[i].io_seconds;
      decode_io_busy += ffn->per_token()[i].io_busy_seconds;
      decode_ffn_compute += ffn->per_token()[i].compute_seconds;
      decode_verify += ffn->per_token()[i].verify_seconds;
    }
  const int decode_forwards = out.empty() ? 0 : int(out.size()) - 1;
  const uint64_t peak = peak_rss_bytes();
  const double pp_tps = gen.prefill_seconds > 0 ? double(gen.prompt_forwards) / gen.prefill_seconds : 0.0;
  const double dec_tps = gen.decode_seconds > 0 && decode_forwards ? double(decode_forwards) / gen.decode_seconds : 0.0;
  const double io_share = gen.decode_seconds > 0 ? decode_io / gen.decode_seconds : 0.0;
  const std::string label = synthetic ? "synthetic selection from a trace: timing only, text meaningless" : "";
  extra["generation"] = {
      {"prompt_tokens", gen.prompt_forwards},
      {"generated_tokens", out.size()},
      {"stop", gen.stopped_at_eos ? "eos" : "steps"},
      {"stop_tokens", stop},
      {"time_to_first_token_seconds", gen.first_token_seconds},
      {"prefill_seconds", gen.prefill_seconds},
      {"prompt_tokens_per_second", pp_tps},
      {"decode_forwards", decode_forwards},
      {"decode_seconds", gen.decode_seconds},
      {"decode_tokens_per_second", dec_tps},
      {"decode_io_seconds", decode_io},
      {"decode_io_share", io_share},
      {"decode_io_busy_seconds", decode_io_busy},
      {"decode_ffn_compute_seconds", decode_ffn_compute},
      {"decode_verify_seconds", decode_verify},  // --verify-reads: hashing the bundles read
      {"peak_rss_bytes", peak},
      {"sampler", {{"temperature", sc.temperature}, {"top_k", sc.top_k}, {"top_p", sc.top_p}, {"seed", sc.seed}}}};
  if (synthetic) extra["synthetic"] = label;
  const bool ov_on = ffn && a.select != "dense" && overlap != "none";
  if (ffn && a.select != "dense") {
    // Overlap figures (whole run, prompt included); io_wait is the I/O nobody computed under.
    const OverlapCounters& o = ffn->overlap();
    extra["overlap"] = {{"mode", overlap},
                        {"engine_async", img->io().async()},
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
  if (feed) extra["trace"]["wrapped_forwards"] = feed->wrapped;
  extra["memory"] = {{"budget_bytes", budget},
                     {"context", context},
                     {"baseline_bytes", plan.baseline},
                     {"dense_bytes", plan.dense},
                     {"ffn_resident_bytes", plan.ffn_resident},
                     {"kv_cache_bytes", plan.kv},
                     {"scratch_bytes", plan.scratch},
                     {"load_transient_bytes", plan.load_transient},
                     {"fixed_bytes", plan.fixed()},
                     {"cache_bundles_per_layer", plan.cache_bundles_per_layer},
                     {"cache_bytes", plan.cache_bytes(c.n_layers)},
                     {"cache_sized_by", cache_from},
                     {"peak_rss_bytes", peak}};
  if (rank > 0) {
    const PredictorCounters& p = ffn->predictor();
    const auto [agree, prefix] = agreement(out, reference);
    extra["predictor"] = {
        {"rank", rank},
        {"target_recall", a.target_recall},
        {"calibration_prompt_tokens", parse_tokens(a.calibrate_tokens, c.vocab_size, "--calibrate-prompt-tokens")},
        {"calibration_steps", a.calibrate_steps},
        {"thresholds", ffn->thresholds()},
        {"recall", p.recall()},
        {"precision", p.precision()},
        {"predicted_per_layer_token",
         double(p.predicted) / double(std::max<uint64_t>(1, forwards * uint64_t(c.n_layers)))},
        {"dense_tokens", reference},
        {"token_agreement", agree},
        {"agreeing_prefix", prefix}};
  }
  if (threshold) {
    const ThresholdCounters& tc = ffn->threshold_counters();
    const auto [agree, prefix] = agreement(out, reference);
    extra["threshold"] = {{"t", thresholds},
                          {"mass_recall", tc.mass_recall()},
                          {"kept_fraction", tc.total ? double(tc.kept) / double(tc.total) : 1.0},
                          {"dense_tokens", reference},
                          {"token_agreement", agree},
                          {"agreeing_prefix", prefix}};
  }
  if (!g.json) {
    if (tok) {  // the text streamed above; the ids now
      std::printf("tokens:");
      for (int t : out) std::printf(" %d", t);
      std::printf("\n");
    }
    if (rank > 0) {
      const auto& p = extra["predictor"];
      std::printf(
          "lowrank:%d predictor: recall %.4f, precision %.4f (target recall %.3f on %llu calibration samples); "
          "token agreement with dense %.4f, first %zu tokens identical\n",
          rank, p["recall"].get<double>(), p["precision"].get<double>(), a.target_recall,
          static_cast<unsigned long long>(ffn->calibration_samples()), p["token_agreement"].get<double>(),
          p["agreeing_prefix"].get<size_t>());
    }
    if (threshold) {
      const auto& p = extra["threshold"];
      std::printf(
          "%s: |act| mass recall %.4f, neurons kept %.4f; token agreement with dense %.4f, first %zu "
          "tokens identical\n",
          a.select.c_str(), p["mass_recall"].get<double>(), p["kept_fraction"].get<double>(),
          p["token_agreement"].get<double>(), p["agreeing_prefix"].get<size_t>());
    }
    if (synthetic) std::printf("%s\n", label.c_str());
  }
  if (!g.quiet)
    std::fprintf(stderr,
                 "generate: %d prompt tokens in %.3f s (%.1f tok/s), first token after %.3f s; %d decode tokens in "
                 "%.3f s (%.1f tok/s), I/O %.1f%% of decode; peak RSS %s%s%s\n",
                 gen.prompt_forwards, gen.prefill_seconds, pp_tps, gen.first_token_seconds, decode_forwards,
                 gen.decode_seconds, dec_tps, io_share * 100, format_bytes(peak).c_str(),
                 budget ? (" (budget " + format_bytes(budget) + ")").c_str() : "",
                 synthetic ? (" [" + label + "]").c_str() : "");
  if (!g.quiet && ov_on) {
    const OverlapCounters& o = ffn->overlap();
    std::fprintf(stderr,
                 "overlap %s (%s): I/O busy %.3f s, waited %.3f s (%.1f%% hidden); %llu of %llu bundles computed with "
                 "reads in flight; read-ahead: %llu predicted, %llu needed, %llu both, %s extra, %s late\n",
                 overlap.c_str(),
                 img->io().async() ? "async engine" : "synchronous engine: reads overlap compute only across threads",
                 o.io_busy_seconds, o.io_wait_seconds, o.overlap_share() * 100,
                 static_cast<unsigned long long>(o.bundles_in_flight),
                 static_cast<unsigned long long>(o.bundles_computed), static_cast<unsigned long long>(o.predicted),
                 static_cast<unsigned long long>(o.needed), static_cast<unsigned long long>(o.predicted_needed),
                 format_bytes(uint64_t(std::max(0.0, o.extra_bytes()))).c_str(), format_bytes(o.late_bytes).c_str());
  }
  flash_report(fa, g, *img, a.select == "dense" ? nullptr : ffn.get(), wall, forwards,
               json_dump(extra, -1, a.invalid_utf8));
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
  a.cache_ratio_opt = c->get_option("--cache-ratio");
  a.queue_depth_opt = c->get_option("--queue-depth");
  c->callback([&g] { generate_main(a, g); });
}

}  // namespace nl::cli
