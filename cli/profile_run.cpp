// nl-profile run: run a model over text (or token ids) and write activation traces (profile + held-out test).
#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "formats/core/atomic_file.h"
#include "formats/core/error.h"
#include "formats/core/progress.h"
#include "formats/safetensors.h"
#include "profiler/profile.h"
#include "profiler/tokenizer.h"

namespace nl::cli {
namespace {

struct RunArgs {
  std::string model, tokenizer, model_name;
  std::vector<std::string> text, token_ids;
  bool no_bos = false;
  int seq_len = 256;
  uint64_t max_tokens = 0;
  std::string out, test_out;
  double test_fraction = 0.1;
  uint64_t seed = 1;
  std::string activation = "auto";
  uint64_t calibrate_tokens = 16384;
  int batch = 0;
  bool no_store_tokens = false;
};

// The trace's default model name: the --model file's or folder's name, or the folder's above it when that name says
// nothing (a Hugging Face folder called `model`, its config.json or *.safetensors): datasets/tiny-relu/model ->
// tiny-relu, not "model".
std::string default_model_name(const std::string& model) {
  namespace fs = std::filesystem;
  fs::path p = fs::path(model).lexically_normal();
  if (!p.has_filename()) p = p.parent_path();  // a trailing slash
  if (p.filename() == "config.json" || p.extension() == ".safetensors") p = p.parent_path();
  if (p.filename() == "model" || p.filename() == "." || p.empty()) {
    fs::path abs = fs::absolute(p).lexically_normal();
    if (!abs.has_filename()) abs = abs.parent_path();
    if (abs.filename() == "model" && abs.has_parent_path() && abs.parent_path().has_filename())
      return abs.parent_path().filename().string();
    return abs.filename().string();
  }
  return p.filename().string();
}

void add_run_model_options(CLI::App* c, RunArgs& a) {
  c->add_option("--model", a.model, "Model: llama2.c .bin, or a Hugging Face folder / config.json / model.safetensors")
      ->required()
      ->check(CLI::ExistingPath)
      ->group("Model");
  c->add_option("--tokenizer", a.tokenizer, "Tokenizer: llama2.c tokenizer.bin or SentencePiece .model")
      ->check(CLI::ExistingFile)
      ->group("Model");
  c->add_option(
       "--model-name", a.model_name,
       "Name stored in the trace (default: the --model file or folder name; its parent's when that is `model`)")
      ->group("Model");
}

void add_run_input_options(CLI::App* c, RunArgs& a) {
  auto* text = c->add_option("--text", a.text, "Plain UTF-8 text files (paragraphs split at blank lines)")
                   ->check(CLI::ExistingFile)
                   ->group("Input");
  auto* ids = c->add_option("--token-ids", a.token_ids, "Token-id files (docs/formats.md), instead of --text")
                  ->check(CLI::ExistingFile)
                  ->group("Input");
  text->excludes(ids);
  c->add_flag("--no-bos", a.no_bos, "With --token-ids: do not start each sequence with BOS (id 1)")->group("Input");
  c->add_option("--seq-len", a.seq_len, "Tokens per sequence, BOS included (capped at the model's context)")
      ->check(CLI::Range(2, 1 << 20))
      ->capture_default_str()
      ->group("Input");
  c->add_option("--max-tokens", a.max_tokens, "Stop after this many tokens in all (0 = the whole input, else >= 2)")
      ->check(CLI::Validator(
          [](std::string& s) {  // a sequence is BOS + at least one token: 1 would silently record 2
            return s == "1" ? std::string("a sequence holds at least 2 tokens (BOS and one more): give 0 or >= 2")
                            : std::string();
          },
          "0 or >= 2"))
      ->capture_default_str()
      ->group("Input");
}

void add_run_output_options(CLI::App* c, RunArgs& a) {
  c->add_option("--out", a.out, "Profile trace to write (HDF5, trace v1)")->required()->group("Output");
  c->add_option("--test-out", a.test_out, "Held-out test trace (a deterministic share of the sequences)")
      ->group("Output");
  c->add_option("--test-fraction", a.test_fraction, "Share of sequences held out for --test-out")
      ->check(CLI::Range(0.001, 0.9))
      ->capture_default_str()
      ->group("Output");
  c->add_option("--seed", a.seed, "Seed of the profile/test split")->capture_default_str()->group("Output");
  c->add_flag("--no-store-tokens", a.no_store_tokens, "Do not store /tokens in the traces")->group("Output");
}

void add_run_activation_options(CLI::App* c, RunArgs& a) {
  c->add_option(
       "--activation", a.activation,
       "When a neuron fires: auto (exact for relu / fatrelu / drelu FFNs, calibrated:0.3 for SiLU), exact (the "
       "model's exact zeros: relu>0, fatrelu>T, drelu: gate x > 0 and up x > 0; relu>0 is an old name), "
       "abs>X, calibrated:F (per-layer |act(gate x)| threshold keeping a fraction F active, CATS-style)")
      ->capture_default_str()
      ->group("Activation");
  c->add_option("--calibrate-tokens", a.calibrate_tokens, "Profile-split tokens used to calibrate thresholds")
      ->check(CLI::Range(uint64_t(1), uint64_t(1) << 40))
      ->capture_default_str()
      ->group("Activation");
  c->add_option("--batch", a.batch, "Tokens per forward pass (0 = whole sequence; 1 = token by token)")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str()
      ->group("Activation");
}

nlohmann::json summary_json(const ProfileResult& r, const std::string& path) {
  nlohmann::json layers = nlohmann::json::array();
  for (size_t l = 0; l < r.n_neurons.size(); ++l) {
    nlohmann::json j = {{"layer", l}, {"n_neurons", r.n_neurons[l]}, {"active_fraction", r.active_fraction[l]}};
    if (!r.thresholds.empty()) j["threshold"] = r.thresholds[l];
    layers.push_back(j);
  }
  return {{"path", path},
          {"n_tokens", r.n_tokens},
          {"n_sequences", r.n_sequences},
          {"seconds", r.seconds},
          {"tokens_per_s", r.seconds > 0 ? double(r.n_tokens) / r.seconds : 0.0},
          {"layers", layers}};
}

void print_summary(const char* what, const ProfileResult& r, const std::string& path) {
  std::printf("%s: %llu tokens in %llu sequences, %.2f s, %.0f tokens/s -> %s\n", what,
              static_cast<unsigned long long>(r.n_tokens), static_cast<unsigned long long>(r.n_sequences), r.seconds,
              r.seconds > 0 ? double(r.n_tokens) / r.seconds : 0.0, path.c_str());
}

void run_main(const RunArgs& a, const GlobalOptions& g) {
  apply_global_options(g);
  if (a.text.empty() && a.token_ids.empty()) throw UsageError("give --text FILE... or --token-ids FILE...");
  if (!a.text.empty() && a.tokenizer.empty()) throw UsageError("--text needs --tokenizer");
  std::vector<NamedPath> inputs = named_paths("--text", a.text);
  for (const NamedPath& n : named_paths("--token-ids", a.token_ids)) inputs.push_back(n);
  inputs.push_back({"--model", a.model});
  inputs.push_back({"--tokenizer", a.tokenizer});
  check_paths(inputs, {{"--out", a.out}, {"--test-out", a.test_out}});
  CommitGroup outputs;  // --out and --test-out commit together or not at all
  const ModelWeights w = read_model(a.model);
  const ModelConfig& c = w.config;
  const int seq_len = std::min(a.seq_len, c.seq_len);
  if (seq_len < a.seq_len) info(g, "note: --seq-len capped at the model's context of " + std::to_string(c.seq_len));

  Corpus all;
  if (!a.text.empty()) {
    std::unique_ptr<Tokenizer> tok = open_tokenizer(a.tokenizer);
    if (tok->vocab_size() != c.vocab_size)
      throw InputError(a.tokenizer, "has " + std::to_string(tok->vocab_size()) + " tokens, the model " +
                                        std::to_string(c.vocab_size));
    all = corpus_from_text_files(a.text, *tok, seq_len, a.max_tokens);
  } else {
    all = corpus_from_token_files(a.token_ids, c.vocab_size, seq_len, a.max_tokens, a.no_bos ? -1 : 1);
  }
  if (all.sequences.empty())  // the files are read and valid, just empty: a bad input file (exit 3), not usage
    throw InputError(a.text.empty() ? a.token_ids.front() : a.text.front(),
                     "the input holds fewer than 2 tokens" +
                         std::string(a.text.size() + a.token_ids.size() > 1 ? " (all files together)" : ""));
  Corpus profile, test;
  split_corpus(all, a.test_out.empty() ? 0.0 : a.test_fraction, a.seed, profile, test);
  info(g, "corpus: " + std::to_string(all.n_tokens()) + " tokens in " + std::to_string(all.sequences.size()) +
              " sequences of up to " + std::to_string(seq_len) + "; profile " + std::to_string(profile.n_tokens()) +
              ", test " + std::to_string(test.n_tokens()));

  Model model(w, seq_len);
  ProfileOptions po;
  po.model_name = a.model_name.empty() ? default_model_name(a.model) : a.model_name;
  po.rule = ActivationRule::parse(a.activation == "auto" ? (ffn_act_sparse(c.act) ? "exact" : "calibrated:0.3")
                                                         : a.activation);
  po.batch_tokens = a.batch;
  po.store_tokens = !a.no_store_tokens;
  if (po.rule.kind == ActivationRule::Kind::kCalibrated) {
    info(g, "calibrating per-layer thresholds on " +
                std::to_string(std::min<uint64_t>(a.calibrate_tokens, profile.n_tokens())) + " profile tokens");
    po.thresholds = calibrate_thresholds(model, profile, po.rule.value, a.calibrate_tokens);
  }
  auto run_split = [&](const char* stage, const Corpus& corpus, const std::string& out) {
    Progress progress(stage, corpus.n_tokens(), !g.quiet, "tokens");
    po.progress = [&progress](uint64_t done, uint64_t) { progress.set(done); };
    ProfileResult r = profile_corpus(w, seq_len, corpus, out, po);
    progress.finish();
    return r;
  };
  const ProfileResult rp = run_split("profile", profile, a.out);
  ProfileResult rt;
  if (!a.test_out.empty()) rt = run_split("test", test, a.test_out);
  outputs.commit();

  if (g.json) {
    nlohmann::json j = {{"model", po.model_name}, {"activation", rp.activation}, {"profile", summary_json(rp, a.out)}};
    if (!rp.thresholds.empty()) j["thresholds"] = rp.thresholds;
    if (!a.test_out.empty()) j["test"] = summary_json(rt, a.test_out);
    std::printf("%s\n", json_dump(j, 2).c_str());
    return;
  }
  std::printf("model %s: %d layers x %d neurons (%s), activation %s\n", po.model_name.c_str(), c.n_layers, c.hidden_dim,
              ffn_act_name(c.act), rp.activation.c_str());
  print_summary("profile", rp, a.out);
  if (!a.test_out.empty()) print_summary("test", rt, a.test_out);
  std::printf("%6s %10s %10s%s\n", "layer", "neurons", "active %", rp.thresholds.empty() ? "" : "  threshold");
  for (size_t l = 0; l < rp.n_neurons.size(); ++l) {
    std::printf("%6zu %10u %10.2f", l, rp.n_neurons[l], 100.0 * rp.active_fraction[l]);
    if (!rp.thresholds.empty()) std::printf("  %9.4g", rp.thresholds[l]);
    std::printf("\n");
  }
}

}  // namespace

void add_profile_run(CLI::App& app, GlobalOptions& g) {
  static RunArgs a;
  CLI::App* c = app.add_subcommand("run", "Run a model over text and write activation traces (HDF5, trace v1)");
  add_run_model_options(c, a);
  add_run_input_options(c, a);
  add_run_activation_options(c, a);
  add_run_output_options(c, a);
  c->callback([&g] { run_main(a, g); });
}

}  // namespace nl::cli
