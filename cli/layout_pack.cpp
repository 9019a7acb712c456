// nl-layout pack: a model + a layout -> the flash image (model.nlw) and its manifest (model.nlw.json), and optionally
// the permuted model in the input's own format (llama2.c .bin or a Hugging Face folder).
#include <cstdio>

#include "cli/commands.h"
#include "formats/core/error.h"
#include "formats/core/image_writer.h"
#include "formats/layout.h"
#include "formats/llama2c.h"
#include "formats/safetensors.h"

namespace nl::cli {
namespace {

struct PackArgs {
  std::string model, layout, out, dtype = "f32", tokenizer, export_permuted;
};

void add_pack_input_options(CLI::App* c, PackArgs& a) {
  c->add_option("--model", a.model, "llama2.c .bin, or a Hugging Face folder / config.json / model.safetensors")
      ->required()
      ->check(CLI::ExistingPath)
      ->group("Input");
  c->add_option("--layout", a.layout, "Layout JSON from nl-layout solve (default: identity order)")
      ->check(CLI::ExistingFile)
      ->group("Input");
  c->add_option("--tokenizer", a.tokenizer, "Tokenizer file recorded in the manifest")->group("Input");
}

void add_pack_output_options(CLI::App* c, PackArgs& a) {
  c->add_option("--out", a.out, "Flash image to write (the manifest goes to OUT.json)")->required()->group("Output");
  c->add_option("--dtype", a.dtype, "Element type in the image")->check(CLI::IsMember({"f32", "f16", "bf16"}))->group("Output");
  c->add_option("--export-permuted", a.export_permuted,
                "Also write the permuted model here, in the input's format (.bin file or Hugging Face folder)")
      ->group("Output");
}

bool is_llama2c(const std::string& p) { return p.size() > 4 && p.compare(p.size() - 4, 4, ".bin") == 0; }

// Permuting gate/up rows and down columns with the same order leaves the function unchanged.
void permute_ffn(ModelWeights& w, const std::vector<std::vector<uint32_t>>& order) {
  const size_t dim = size_t(w.config.dim), hid = size_t(w.config.hidden_dim);
  for (size_t l = 0; l < w.layers.size(); ++l) {
    LayerWeights& L = w.layers[l];
    std::vector<float> g(L.w_gate.size()), u(L.w_up.size()), d(L.w_down.size());
    for (size_t s = 0; s < hid; ++s) {
      const size_t n = order[l][s];
      std::copy_n(L.w_gate.data() + n * dim, dim, g.data() + s * dim);
      std::copy_n(L.w_up.data() + n * dim, dim, u.data() + s * dim);
      for (size_t o = 0; o < dim; ++o) d[o * hid + s] = L.w_down[o * hid + n];
    }
    L.w_gate.swap(g);
    L.w_up.swap(u);
    L.w_down.swap(d);
  }
}

void pack_main(const PackArgs& a, const GlobalOptions& g) {
  apply_global_options(g);
  ModelWeights w = read_model(a.model);
  ImageSpec spec;
  if (!image_dtype_parse(a.dtype, &spec.dtype)) throw UsageError("unknown --dtype " + a.dtype);
  spec.tokenizer = a.tokenizer;
  spec.source = a.model;
  spec.source_format = is_llama2c(a.model) ? "llama2c" : "safetensors";
  if (!a.layout.empty()) {
    Layout lay = layout_load(a.layout);
    if (lay.layers.size() != size_t(w.config.n_layers))
      throw InputError(a.layout, "has " + std::to_string(lay.layers.size()) + " layers, the model has " +
                                     std::to_string(w.config.n_layers));
    for (size_t l = 0; l < lay.layers.size(); ++l) {
      if (lay.layers[l].order.size() != size_t(w.config.hidden_dim))
        throw InputError(a.layout, "layer " + std::to_string(l) + " orders " + std::to_string(lay.layers[l].order.size()) +
                                       " neurons, the model has " + std::to_string(w.config.hidden_dim));
      spec.order.push_back(lay.layers[l].order);
    }
    spec.layout = a.layout;
    spec.layout_method = lay.method;
  }
  const auto order = spec.order;
  ImageManifest m = image_write_model(a.out, w, std::move(spec));
  info(g, "wrote " + a.out + " (" + std::to_string(m.image_bytes) + " bytes, " + std::to_string(m.regions.size()) +
              " regions, bundle " + std::to_string(m.bundle_bytes) + " bytes) and " + manifest_path_for(a.out));
  if (!a.export_permuted.empty()) {
    if (!order.empty()) permute_ffn(w, order);
    if (is_llama2c(a.model)) write_llama2c(a.export_permuted, w);
    else write_safetensors_model(a.export_permuted, w);
    info(g, "wrote the permuted model " + a.export_permuted);
  }
  if (g.json)
    std::printf("{\"image\": \"%s\", \"image_bytes\": %llu, \"bundle_bytes\": %llu}\n", a.out.c_str(),
                static_cast<unsigned long long>(m.image_bytes), static_cast<unsigned long long>(m.bundle_bytes));
}

}  // namespace

void add_layout_pack(CLI::App& app, GlobalOptions& g) {
  static PackArgs a;
  CLI::App* c = app.add_subcommand("pack", "Write the flash image + manifest for a model in a layout's neuron order");
  add_pack_input_options(c, a);
  add_pack_output_options(c, a);
  c->callback([&g] { pack_main(a, g); });
}

}  // namespace nl::cli
