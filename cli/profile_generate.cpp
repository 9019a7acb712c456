// nl-profile generate: greedy generation with the dense model, to check that a model and tokenizer load and work.
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "formats/core/error.h"
#include "formats/safetensors.h"
#include "profiler/tokenizer.h"
#include "runtime/model/model.h"

namespace nl::cli {
namespace {

struct GenerateArgs {
  std::string model, tokenizer, prompt;
  int steps = 64;
  CLI::Option* prompt_opt = nullptr;  // to tell `--prompt ""` from no --prompt
};

void add_generate_options(CLI::App* c, GenerateArgs& a) {
  c->add_option("--model", a.model, "Model: llama2.c .bin or a Hugging Face folder")
      ->required()
      ->check(CLI::ExistingPath);
  c->add_option("--tokenizer", a.tokenizer, "llama2.c tokenizer.bin or SentencePiece .model")
      ->required()
      ->check(CLI::ExistingFile);
  a.prompt_opt = c->add_option("--prompt", a.prompt, "Text to start from (after BOS)");
  c->add_option("--steps", a.steps, "Positions to run, prompt included")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
}

void generate_main(const GenerateArgs& a, const GlobalOptions& g) {
  apply_global_options(g);
  if (a.prompt_opt->count() > 0 && a.prompt.empty()) warn_empty_prompt("nl-profile");
  const ModelWeights w = read_model(a.model);
  const auto tok = open_tokenizer(a.tokenizer);
  if (tok->vocab_size() != w.config.vocab_size)
    throw InputError(a.tokenizer, "has " + std::to_string(tok->vocab_size()) + " tokens, the model " +
                                      std::to_string(w.config.vocab_size));
  Model m(w);
  std::vector<int32_t> ids{tok->bos_id()};
  for (int32_t t : tok->encode(a.prompt)) ids.push_back(t);
  // Same rule as reference-greedy.json: at most `steps` positions; stop when BOS or EOS is the argmax.
  const int steps = std::min(a.steps, m.max_seq());
  for (int pos = 0; pos < steps && pos < int(ids.size()); ++pos) {
    const float* l = m.forward_token(ids[size_t(pos)], pos);
    if (pos + 1 < int(ids.size())) continue;  // still inside the prompt
    int next = 0;
    for (int i = 1; i < w.config.vocab_size; ++i)
      if (l[i] > l[next]) next = i;
    if (next == tok->bos_id() || next == tok->eos_id() || pos + 1 == steps) break;
    ids.push_back(next);
  }
  if (g.json) {
    std::printf("%s\n", json_dump(nlohmann::json({{"tokens", ids}, {"text", tok->decode(ids)}}), 2).c_str());
  } else {
    std::printf("%s\n", tok->decode(ids).c_str());
  }
}

}  // namespace

void add_profile_generate(CLI::App& app, GlobalOptions& g) {
  static GenerateArgs a;
  CLI::App* c = app.add_subcommand("generate", "Greedy generation with the dense model (a quick load check)");
  add_generate_options(c, a);
  c->callback([&g] { generate_main(a, g); });
}

}  // namespace nl::cli
