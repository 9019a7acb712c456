// nl-profile convert: llama2.c .bin -> Hugging Face folder (config.json + model.safetensors), or back.
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "formats/llama2c.h"
#include "formats/safetensors.h"

namespace nl::cli {
namespace {

struct ConvertArgs {
  std::string model, out, dtype = "f32", to = "hf";
};

void add_convert_options(CLI::App* c, ConvertArgs& a) {
  c->add_option("--model", a.model, "Input model: llama2.c .bin or a Hugging Face folder")
      ->required()
      ->check(CLI::ExistingPath);
  c->add_option("--out", a.out, "Output: a folder for --to hf, a .bin file for --to llama2c")->required();
  c->add_option("--to", a.to, "Output format")->check(CLI::IsMember({"hf", "llama2c"}))->capture_default_str();
  c->add_option("--dtype", a.dtype, "Tensor dtype of a Hugging Face output")
      ->check(CLI::IsMember({"f32", "f16", "bf16"}))
      ->capture_default_str();
}

void convert_main(const ConvertArgs& a, const GlobalOptions& g) {
  apply_global_options(g);
  check_paths({{"--model", a.model}},
              a.to == "hf" ? hf_folder_outputs("--out", a.out) : std::vector<NamedPath>{{"--out", a.out}});
  const ModelWeights w = read_model(a.model);
  if (a.to == "hf") {
    write_safetensors_model(a.out, w, tensor_dtype_from_name(a.dtype));
  } else {
    write_llama2c(a.out, w);
  }
  const ModelConfig& c = w.config;
  if (g.json) {
    std::printf("%s\n", nlohmann::json({{"model", a.model},
                                        {"out", a.out},
                                        {"to", a.to},
                                        {"dtype", a.dtype},
                                        {"dim", c.dim},
                                        {"hidden_dim", c.hidden_dim},
                                        {"n_layers", c.n_layers},
                                        {"vocab_size", c.vocab_size}})
                            .dump(2)
                            .c_str());
    return;
  }
  std::printf("wrote %s (%s%s): dim %d, %d layers x %d neurons, %d heads / %d kv heads, vocab %d, %s FFN\n",
              a.out.c_str(), a.to.c_str(), a.to == "hf" ? (", " + a.dtype).c_str() : "", c.dim, c.n_layers,
              c.hidden_dim, c.n_heads, c.n_kv_heads, c.vocab_size, ffn_act_name(c.act));
}

}  // namespace

void add_profile_convert(CLI::App& app, GlobalOptions& g) {
  static ConvertArgs a;
  CLI::App* c = app.add_subcommand("convert", "Convert a model: llama2.c .bin <-> Hugging Face safetensors folder");
  add_convert_options(c, a);
  c->callback([&g] { convert_main(a, g); });
}

}  // namespace nl::cli
