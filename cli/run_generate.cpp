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

namespace nl::cli {
namespace {

struct GenerateArgs {
  FlashArgs flash;
  std::string prompt_tokens = "1";  // llama2.c BOS
  int steps = 16;
  std::string select = "gate";
};

void add_generate_prompt_options(CLI::App* c, GenerateArgs& a) {
  c->add_option("--prompt-tokens", a.prompt_tokens, "Prompt as comma-separated token ids (default: 1, BOS)")
      ->group("Prompt");
  c->add_option("--steps", a.steps, "Tokens to generate (greedy)")->check(CLI::Range(1, 1 << 20))->group("Prompt");
  c->add_option("--select", a.select,
                "Which neurons to read: gate (exact, gate rows in DRAM) | dense (whole FFN decoded into DRAM: the reference)")
      ->check(CLI::IsMember({"gate", "dense"}))
      ->group("Prompt");
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

void generate_main(const GenerateArgs& a, const GlobalOptions& g) {
  apply_global_options(g);
  auto img = flash_open(a.flash, g);
  const ModelConfig& c = img->manifest().config;
  std::vector<int> prompt = parse_tokens(a.prompt_tokens, c.vocab_size);
  ModelWeights w = img->load_dense();
  std::unique_ptr<FlashFfn> ffn;
  if (a.select == "dense") {
    for (int l = 0; l < c.n_layers; ++l) img->load_ffn_layer(l, &w.layers[size_t(l)]);
  }
  const int total = int(prompt.size()) + a.steps;
  if (total > c.seq_len)
    throw UsageError("prompt + steps = " + std::to_string(total) + " exceeds the model's context " + std::to_string(c.seq_len));
  Model model(w, total);
  if (a.select == "gate") {
    ffn = std::make_unique<FlashFfn>(*img, flash_ffn_options(a.flash, SelectMode::kGate));
    model.set_ffn(ffn.get());
  }
  std::vector<int> out;
  auto t0 = std::chrono::steady_clock::now();
  int token = prompt[0];
  Progress prog("generate", uint64_t(total - 1), !g.quiet, "tokens");
  for (int pos = 0; pos + 1 < total; ++pos) {
    const float* logits = model.forward_token(token, pos);
    if (ffn) ffn->end_token();
    if (pos + 1 < int(prompt.size())) {
      token = prompt[size_t(pos + 1)];
    } else {
      token = argmax(logits, c.vocab_size);
      out.push_back(token);
    }
    prog.add(1);
  }
  prog.finish();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  nlohmann::json extra = {{"mode", "generate"}, {"select", a.select}, {"prompt_tokens", prompt}, {"generated", out}};
  if (!g.json) {
    std::printf("tokens:");
    for (int t : out) std::printf(" %d", t);
    std::printf("\n");
  }
  flash_report(a.flash, g, *img, ffn.get(), wall, uint64_t(total - 1), extra.dump());
}

}  // namespace

void add_run_generate(CLI::App& app, GlobalOptions& g) {
  static GenerateArgs a;
  CLI::App* c = app.add_subcommand("generate", "Generate tokens, reading only the needed FFN neurons from the image");
  add_flash_image_options(c, a.flash);
  add_generate_prompt_options(c, a);
  add_flash_io_options(c, a.flash);
  add_flash_plan_options(c, a.flash);
  add_flash_metrics_options(c, a.flash);
  c->callback([&g] { generate_main(a, g); });
}

}  // namespace nl::cli
