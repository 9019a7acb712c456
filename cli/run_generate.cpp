// nl-run generate: prompt tokens -> greedy tokens, dense weights in DRAM, FFN neurons read from the flash image.
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "cli/run_flash_options.h"
#include "formats/core/error.h"
#include "formats/core/progress.h"
#include "runtime/model/model.h"
#include "runtime/tokenizer.h"
#ifdef NL_FULL_BUILD
#include "profiler/tokenizer.h"  // SentencePiece as well (full builds only: libsentencepiece)
#endif

namespace nl::cli {
namespace {

struct GenerateArgs {
  FlashArgs flash;
  std::string prompt_tokens = "1";  // llama2.c BOS
  std::string prompt, tokenizer;
  int steps = 16;
  std::string select = "gate";
  double target_recall = 0.99;
  std::string calibrate_tokens = "1";
  int calibrate_steps = 64;
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

void add_generate_prompt_options(CLI::App* c, GenerateArgs& a) {
  auto* ids = c->add_option("--prompt-tokens", a.prompt_tokens, "Prompt as comma-separated token ids (default: 1, BOS)")
                  ->group("Prompt");
  c->add_option("--prompt", a.prompt, "Prompt text (BOS + the tokenizer's encoding)")->excludes(ids)->group("Prompt");
  c->add_option("--tokenizer", a.tokenizer,
                "Tokenizer (llama2.c tokenizer.bin; SentencePiece .model in full builds); default: the manifest's "
                "reference, relative to the manifest's folder. Generated text is printed when one is found")
      ->check(CLI::ExistingFile)
      ->group("Prompt");
  c->add_option("--steps", a.steps, "Tokens to generate (greedy)")->check(CLI::Range(1, 1 << 20))->group("Prompt");
  c->add_option("--select", a.select,
                "Which neurons to read: gate (exact, gate rows in DRAM) | dense (whole FFN decoded into DRAM: the "
                "reference) | lowrank:R (ReLU models: rank-R SVD predictor of the gate, threshold calibrated to "
                "--target-recall)")
      ->check([](const std::string& s) {
        return s == "gate" || s == "dense" || lowrank_rank(s) > 0 ? std::string() : "expected gate, dense or lowrank:R (R >= 1)";
      })
      ->group("Prompt");
}

void add_generate_predictor_options(CLI::App* c, GenerateArgs& a) {
  c->add_option("--target-recall", a.target_recall, "lowrank: share of firing neurons the threshold keeps on the calibration tokens")
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
  std::string p = ref;
  if (ref[0] != '/') {
    const std::string& mp = img.manifest_path();
    const auto slash = mp.rfind('/');
    p = (slash == std::string::npos ? std::string() : mp.substr(0, slash + 1)) + ref;
  }
  FILE* f = std::fopen(p.c_str(), "rb");
  if (!f) return "";
  std::fclose(f);
  return p;
}

std::vector<int> parse_tokens(const std::string& s, int vocab) {
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
      throw UsageError("--prompt-tokens: '" + item + "' is not a token id in [0, " + std::to_string(vocab) + ")");
    }
  }
  if (v.empty()) throw UsageError("--prompt-tokens is empty");
  return v;
}

int argmax(const float* x, int n) {
  int best = 0;
  for (int i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return best;
}

// Feeds the prompt, then `steps` greedy tokens; returns the generated tokens. Ends each token on `ffn` (may be null).
// `prog` (may be null) counts forward passes.
std::vector<int> generate_greedy(Model& model, FlashFfn* ffn, const std::vector<int>& prompt, int steps,
                                 Progress* prog = nullptr) {
  const int vocab = model.config().vocab_size;
  const int total = int(prompt.size()) + steps;
  std::vector<int> out;
  int token = prompt[0], pos = 0;
  if (prompt.size() > 1) {
    // Batched prefill: all prompt tokens but the last in one pass (matrix-matrix products; per token the same
    // arithmetic as one at a time, so the tokens are the same), the last one then yields the first logits.
    pos = int(prompt.size()) - 1;
    model.forward_sequence(prompt.data(), pos, 0, nullptr);
    if (ffn) ffn->end_token();
    token = prompt[size_t(pos)];
    if (prog) prog->add(uint64_t(pos));
  }
  for (; pos + 1 < total; ++pos) {
    const float* logits = model.forward_token(token, pos);
    if (ffn) ffn->end_token();
    if (pos + 1 < int(prompt.size())) {
      token = prompt[size_t(pos + 1)];
    } else {
      token = argmax(logits, vocab);
      out.push_back(token);
    }
    if (prog) prog->add(1);
  }
  if (prog) prog->finish();
  return out;
}

void generate_main(const GenerateArgs& a, const GlobalOptions& g) {
  apply_global_options(g);
  auto img = flash_open(a.flash, g);
  const ModelConfig& c = img->manifest().config;
  std::unique_ptr<Tokenizer> tok;
  const std::string tok_path = tokenizer_path(a, *img);
  if (!tok_path.empty()) {
    tok = open_run_tokenizer(tok_path);
    if (tok->vocab_size() != c.vocab_size)
      throw InputError(tok_path, "has " + std::to_string(tok->vocab_size()) + " tokens, the model " +
                                     std::to_string(c.vocab_size));
  }
  std::vector<int> prompt;
  if (!a.prompt.empty()) {
    if (!tok)
      throw UsageError("--prompt needs a tokenizer: --tokenizer FILE, or an image packed with --tokenizer whose file "
                       "sits beside the manifest");
    prompt.push_back(tok->bos_id());
    for (int32_t t : tok->encode(a.prompt)) prompt.push_back(t);
  } else {
    prompt = parse_tokens(a.prompt_tokens, c.vocab_size);
  }
  const std::unique_ptr<DenseStore> dense = img->load_dense_store();
  const ModelView& w = dense->view;
  std::unique_ptr<FlashFfn> ffn;
  if (a.select == "dense") ffn = std::make_unique<FlashFfn>(*img, flash_ffn_options(a.flash, SelectMode::kDense));
  const int total = int(prompt.size()) + a.steps;
  if (total > c.seq_len)
    throw UsageError("prompt + steps = " + std::to_string(total) + " exceeds the model's context " + std::to_string(c.seq_len));
  const int rank = lowrank_rank(a.select);
  nlohmann::json extra = {{"mode", "generate"}, {"select", a.select}, {"prompt_tokens", prompt}};
  std::vector<int> reference;
  if (a.select == "gate" || rank > 0) {
    FlashFfnOptions fo = flash_ffn_options(a.flash, rank > 0 ? SelectMode::kLowRank : SelectMode::kGate);
    fo.lowrank_rank = rank;
    ffn = std::make_unique<FlashFfn>(*img, fo);
  }
  if (rank > 0) {
    // Calibration on the exact model's own continuation of the calibration prompt, then the exact reference run on
    // the prompt (token agreement), then the predicted run whose reads and tokens are reported.
    std::vector<int> cal = parse_tokens(a.calibrate_tokens, c.vocab_size);
    const int cal_total = int(cal.size()) + a.calibrate_steps;
    if (cal_total > c.seq_len)
      throw UsageError("calibration prompt + steps = " + std::to_string(cal_total) + " exceeds the model's context " +
                       std::to_string(c.seq_len));
    ffn->set_phase(LowRankPhase::kCalibrate);
    Model cm(w, cal_total);
    cm.set_ffn(ffn.get());
    generate_greedy(cm, ffn.get(), cal, a.calibrate_steps);
    ffn->set_phase(LowRankPhase::kExact, a.target_recall);
    extra["calibration_samples"] = ffn->calibration_samples();
    Model rm(w, total);
    rm.set_ffn(ffn.get());
    reference = generate_greedy(rm, ffn.get(), prompt, a.steps);
    ffn->set_phase(LowRankPhase::kPredict);
  }
  Model model(w, total);
  if (ffn) model.set_ffn(ffn.get());
  auto t0 = std::chrono::steady_clock::now();
  Progress prog("generate", uint64_t(total - 1), !g.quiet, "tokens");
  std::vector<int> out = generate_greedy(model, ffn.get(), prompt, a.steps, &prog);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  extra["generated"] = out;
  std::string text;
  if (tok) {
    std::vector<int32_t> all(prompt.begin(), prompt.end());
    all.insert(all.end(), out.begin(), out.end());
    text = tok->decode(all);  // prompt + continuation (decoding the parts apart would drop the joining space)
    extra["tokenizer"] = tok_path;
    extra["text"] = text;
    if (!a.prompt.empty()) extra["prompt"] = a.prompt;
  }
  if (rank > 0) {
    const PredictorCounters& p = ffn->predictor();
    size_t same = 0, prefix = 0;
    for (size_t i = 0; i < out.size(); ++i) same += out[i] == reference[i];
    while (prefix < out.size() && out[prefix] == reference[prefix]) ++prefix;
    extra["predictor"] = {{"rank", rank},
                          {"target_recall", a.target_recall},
                          {"calibration_prompt_tokens", parse_tokens(a.calibrate_tokens, c.vocab_size)},
                          {"calibration_steps", a.calibrate_steps},
                          {"thresholds", ffn->thresholds()},
                          {"recall", p.recall()},
                          {"precision", p.precision()},
                          {"predicted_per_layer_token", double(p.predicted) / double(std::max<uint64_t>(1, uint64_t(out.size() + prompt.size() - 1) * uint64_t(c.n_layers)))},
                          {"dense_tokens", reference},
                          {"token_agreement", out.empty() ? 1.0 : double(same) / double(out.size())},
                          {"agreeing_prefix", prefix}};
  }
  if (!g.json) {
    std::printf("tokens:");
    for (int t : out) std::printf(" %d", t);
    std::printf("\n");
    if (tok) std::printf("text: %s\n", text.c_str());
    if (rank > 0) {
      const auto& p = extra["predictor"];
      std::printf("lowrank:%d predictor: recall %.4f, precision %.4f (target recall %.3f on %llu calibration samples); "
                  "token agreement with dense %.4f, first %zu tokens identical\n",
                  rank, p["recall"].get<double>(), p["precision"].get<double>(), a.target_recall,
                  static_cast<unsigned long long>(ffn->calibration_samples()), p["token_agreement"].get<double>(),
                  p["agreeing_prefix"].get<size_t>());
    }
  }
  flash_report(a.flash, g, *img, a.select == "dense" ? nullptr : ffn.get(), wall, uint64_t(total - 1), json_dump(extra));
}

}  // namespace

void add_run_generate(CLI::App& app, GlobalOptions& g) {
  static GenerateArgs a;
  CLI::App* c = app.add_subcommand("generate", "Generate tokens, reading only the needed FFN neurons from the image");
  add_flash_image_options(c, a.flash);
  add_generate_prompt_options(c, a);
  add_generate_predictor_options(c, a);
  add_flash_io_options(c, a.flash);
  add_flash_plan_options(c, a.flash);
  add_flash_metrics_options(c, a.flash);
  c->callback([&g] { generate_main(a, g); });
}

}  // namespace nl::cli
