// nl-layout pack: a model + a layout -> the flash image (model.nlw) and its manifest (model.nlw.json), and optionally
// the permuted model in the input's own format (llama2.c .bin or a Hugging Face folder).
#include <cmath>
#include <cstdio>
#include <map>

#include "cli/commands.h"
#include <nlohmann/json.hpp>

#include "formats/core/error.h"
#include "formats/core/image_writer.h"
#include "formats/core/progress.h"
#include "formats/layout.h"
#include "formats/llama2c.h"
#include "formats/model_source.h"
#include "formats/safetensors.h"
#include "formats/trace.h"

namespace nl::cli {
namespace {

struct PackArgs {
  std::string model, layout, out, dtype, tokenizer, export_permuted, synthetic_shape;
  std::string act_threshold_from;  // trace whose per-layer thresholds go to the manifest's act_threshold
  int synthetic_layers = 4;
  uint64_t seed = 1;
};

// FFN shapes of the paper's models (Neuralink, ASPLOS 2025): width, neurons per layer, bundle kind. Keys are the
// workload preset names (configs/workloads/*.json), so a synthetic trace and a synthetic image pair up by name.
struct SyntheticShape {
  int dim = 0, hidden = 0;
  BundleKind kind = BundleKind::kPlain;
};
const std::map<std::string, SyntheticShape>& synthetic_shapes() {
  static const std::map<std::string, SyntheticShape> m = {
      {"opt-350m", {1024, 4096, BundleKind::kPlain}},                // 4 KiB f16 bundles
      {"opt-6.7b", {4096, 16384, BundleKind::kPlain}},               // 16 KiB
      {"llama2-7b-prosparse", {4096, 11008, BundleKind::kGated}},    // 24 KiB
      {"mistral-7b-turbosparse", {4096, 14336, BundleKind::kGated}}, // 24 KiB
  };
  return m;
}

// Per-layer CATS thresholds of a trace: its `threshold` layer attributes (calibrated rules), or X of an `abs>X` rule
// for every layer. InputError naming the trace when it has neither or another layer count.
std::vector<double> trace_act_thresholds(const std::string& path, int n_layers) {
  TraceInfo ti = TraceReader(path).info();
  if (ti.n_layers != uint32_t(n_layers))
    throw InputError(path, "has " + std::to_string(ti.n_layers) + " layers, the model has " + std::to_string(n_layers));
  if (!ti.thresholds.empty()) return ti.thresholds;
  if (ti.activation.rfind("abs>", 0) == 0) {
    try {
      size_t used = 0;
      const double x = std::stod(ti.activation.substr(4), &used);
      if (used == ti.activation.size() - 4 && x >= 0 && std::isfinite(x)) return std::vector<double>(size_t(n_layers), x);
    } catch (const std::exception&) {
    }
  }
  throw InputError(path, "records no activation thresholds (activation '" + ti.activation +
                             "'; profile with --activation calibrated:F or abs>X)");
}

// "NAME" from the table, or "DIMxHIDDEN" / "DIMxHIDDENxplain|gated" (plain when omitted).
SyntheticShape synthetic_shape_parse(const std::string& s) {
  if (auto it = synthetic_shapes().find(s); it != synthetic_shapes().end()) return it->second;
  SyntheticShape r;
  char kind[16] = {0};
  int used = 0;
  const int got = std::sscanf(s.c_str(), "%dx%d%n", &r.dim, &r.hidden, &used);
  if (got == 2 && size_t(used) < s.size()) {
    if (std::sscanf(s.c_str() + used, "x%15s", kind) != 1) r.dim = 0;
  }
  const std::string k = kind;
  if (got != 2 || r.dim <= 0 || r.hidden <= 0 || (!k.empty() && k != "plain" && k != "gated")) {
    std::string names;
    for (const auto& [n, v] : synthetic_shapes()) names += (names.empty() ? "" : ", ") + n;
    throw UsageError("--synthetic-shape " + s + ": expected one of " + names + ", or DIMxHIDDEN[xplain|xgated]");
  }
  r.kind = k == "gated" ? BundleKind::kGated : BundleKind::kPlain;
  return r;
}

// splitmix64: fast, seedable per layer, so each layer's weights do not depend on the others.
struct SplitMix {
  uint64_t x;
  uint64_t next() {
    uint64_t z = (x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
};
void fill_uniform(std::vector<float>& v, size_t n, float scale, SplitMix& r) {
  v.resize(n);
  for (size_t i = 0; i < n; ++i) v[i] = (float(r.next() >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f) * scale;
}

void add_pack_input_options(CLI::App* c, PackArgs& a) {
  auto* model = c->add_option("--model", a.model, "llama2.c .bin, or a Hugging Face folder / config.json / model.safetensors")
                    ->check(CLI::ExistingPath)
                    ->group("Input");
  auto* synth = c->add_option("--synthetic-shape", a.synthetic_shape,
                              "Instead of --model: random FFN weights of a paper model's shape, for I/O benchmarks "
                              "(opt-350m, opt-6.7b, llama2-7b-prosparse, mistral-7b-turbosparse, or DIMxHIDDEN[xplain|xgated])")
                    ->group("Synthetic");
  model->excludes(synth);
  c->add_option("--layers", a.synthetic_layers, "Synthetic: FFN layers")->check(CLI::Range(1, 4096))->group("Synthetic");
  c->add_option("--seed", a.seed, "Synthetic: weight seed (same shape, seed and layout give identical bytes)")
      ->group("Synthetic");
  c->add_option("--layout", a.layout, "Layout JSON from nl-layout solve (default: identity order)")
      ->check(CLI::ExistingFile)
      ->group("Input");
  c->add_option("--tokenizer", a.tokenizer, "Tokenizer copied beside the image as OUT.tokenizer and named in the manifest (nl-run --prompt finds it)")->group("Input");
  c->add_option("--act-threshold-from", a.act_threshold_from,
                "Trace (nl-profile run --activation calibrated:F or abs>X) whose per-layer thresholds go to the "
                "manifest's act_threshold (nl-run --select threshold)")
      ->check(CLI::ExistingFile)
      ->group("Input");
}

void add_pack_output_options(CLI::App* c, PackArgs& a) {
  c->add_option("--out", a.out, "Flash image to write (the manifest goes to OUT.json)")->required()->group("Output");
  c->add_option("--dtype", a.dtype, "Element type in the image (default f32; f16 with --synthetic-shape)")->check(CLI::IsMember({"f32", "f16", "bf16"}))->group("Output");
  c->add_option("--export-permuted", a.export_permuted,
                "Also write the permuted model here, in the input's format (.bin file or Hugging Face folder)")
      ->group("Output");
}

bool is_llama2c(const std::string& p) { return p.size() > 4 && p.compare(p.size() - 4, 4, ".bin") == 0; }

// Only what replay reads has the paper's shape and random values: the FFN bundles. The dense part (never read by
// nl-run replay) is a small stand-in: vocabulary 256, one KV head, zero attention weights, unit norms.
ModelConfig synthetic_config(const SyntheticShape& s, int layers) {
  ModelConfig c;
  c.dim = s.dim;
  c.hidden_dim = s.hidden;
  c.n_layers = layers;
  c.n_heads = s.dim % 32 == 0 && s.dim >= 64 ? 32 : 1;
  c.n_kv_heads = 1;
  c.vocab_size = 256;
  c.seq_len = 256;
  c.act = FfnAct::kRelu;
  return c;
}

ImageManifest write_synthetic(const std::string& out, const SyntheticShape& s, int layers, uint64_t seed,
                              ImageSpec spec, const ProgressFn& progress) {
  spec.config = synthetic_config(s, layers);
  spec.bundle_kind = s.kind;
  const ModelConfig& c = spec.config;
  ImageWriter iw(out, std::move(spec));
  iw.set_progress(progress);
  for (const DenseTensor& t : image_dense_tensor_list(c)) {
    const bool norm = t.name.find("rms_") != std::string::npos;
    std::vector<float> v(t.elems(), norm ? 1.0f : 0.0f);
    iw.add_dense(t.name, v.data(), v.size());
  }
  const size_t mat = size_t(c.dim) * size_t(c.hidden_dim);
  const float scale = 1.0f / std::sqrt(float(c.dim));
  std::vector<float> gate, up, down;
  for (int l = 0; l < layers; ++l) {
    SplitMix r{seed * 0x100000001b3ull + uint64_t(l) * 0x9e3779b97f4a7c15ull};
    if (s.kind == BundleKind::kGated) fill_uniform(gate, mat, scale, r);
    fill_uniform(up, mat, scale, r);
    fill_uniform(down, mat, scale, r);
    iw.add_layer(l, s.kind == BundleKind::kGated ? gate.data() : nullptr, up.data(), down.data());
  }
  return iw.commit();
}

void pack_main(const PackArgs& a, const GlobalOptions& g) {
  apply_global_options(g);
  if (a.model.empty() == a.synthetic_shape.empty()) throw UsageError("pack needs --model or --synthetic-shape");
  const bool synthetic = !a.synthetic_shape.empty();
  const std::string dtype = !a.dtype.empty() ? a.dtype : synthetic ? "f16" : "f32";
  std::unique_ptr<ModelSource> src;  // streams the FFN layer by layer
  ImageSpec spec;
  if (!image_dtype_parse(dtype, &spec.dtype)) throw UsageError("unknown --dtype " + dtype);
  ModelWeights w;
  SyntheticShape shape;
  if (synthetic) {
    if (!a.export_permuted.empty()) throw UsageError("--export-permuted needs --model");
    shape = synthetic_shape_parse(a.synthetic_shape);
    w.config = synthetic_config(shape, a.synthetic_layers);
  } else {
    src = open_model_source(a.model);
    w = src->read_dense();
  }
  if (!a.tokenizer.empty()) {
    // The tokenizer travels with the image (to a phone, say): copied beside it and recorded by its file name, which
    // nl-run resolves relative to the manifest's folder. Copied first, so a manifest never names a missing file.
    const std::string tok_out = a.out + ".tokenizer";
    write_file_atomic(tok_out, read_file(a.tokenizer, 256ull << 20));
    spec.tokenizer = tok_out.substr(tok_out.rfind('/') == std::string::npos ? 0 : tok_out.rfind('/') + 1);
  }
  spec.source = synthetic ? "synthetic:" + a.synthetic_shape + " seed " + std::to_string(a.seed) + " (random weights)"
                          : a.model;
  spec.source_format = synthetic ? "" : is_llama2c(a.model) ? "llama2c" : "safetensors";
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
    spec.cache_policy = layout_cache_policy_slots(lay);  // pinned neurons -> slots (docs/formats.md)
    spec.layout = a.layout;
    spec.layout_method = lay.method;
  }
  if (!a.act_threshold_from.empty()) spec.act_threshold = trace_act_thresholds(a.act_threshold_from, w.config.n_layers);
  const auto order = spec.order;
  ImageManifest m;
  {
    // Per FFN layer, as the image is written (the dense region comes first).
    Progress prog("pack", uint64_t(w.config.n_layers), !g.quiet, "layers");
    const ProgressFn on_layer = [&prog](uint64_t done, uint64_t) { prog.set(done); };
    m = synthetic ? write_synthetic(a.out, shape, a.synthetic_layers, a.seed, std::move(spec), on_layer)
                  : image_write_source(a.out, *src, w, std::move(spec), on_layer);
    prog.finish();
  }
  w = ModelWeights{};  // the dense weights are not needed by the export, which streams
  info(g, "wrote " + a.out + " (" + std::to_string(m.image_bytes) + " bytes, " + std::to_string(m.regions.size()) +
              " regions, bundle " + std::to_string(m.bundle_bytes) + " bytes) and " + manifest_path_for(a.out) +
              (m.cache_policy.empty() ? "" : " with the layout's cache policy"));
  if (!a.export_permuted.empty()) {
    // Streams like the image: one FFN matrix in memory at a time, other tensors copied through in chunks.
    Progress prog("export", 3 * uint64_t(m.config.n_layers), !g.quiet, "FFN matrices");
    src->write_permuted(a.export_permuted, order, [&prog](uint64_t done, uint64_t) { prog.set(done); });
    prog.finish();
    info(g, "wrote the permuted model " + a.export_permuted);
  }
  if (g.json) {
    nlohmann::json j = {{"image", a.out},
                        {"manifest", manifest_path_for(a.out)},
                        {"image_bytes", m.image_bytes},
                        {"bundle_bytes", m.bundle_bytes},
                        {"regions", m.regions.size()},
                        {"layers", m.config.n_layers},
                        {"dtype", image_dtype_name(m.dtype)}};
    if (!a.export_permuted.empty()) j["permuted_model"] = a.export_permuted;
    std::printf("%s\n", j.dump(2).c_str());
  }
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
