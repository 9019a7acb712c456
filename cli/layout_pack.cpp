// nl-layout pack: a model + a layout -> the flash image (model.nlw) and its manifest (model.nlw.json), and optionally
// the permuted model in the input's own format (llama2.c .bin or a Hugging Face folder); the storage-error report of
// f16/bf16/q8_0/q4_0 images; synthetic images (FFN-only shapes for I/O, whole models for timing).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/layout_options.h"
#include "formats/core/atomic_file.h"
#include "formats/core/error.h"
#include "formats/core/image_writer.h"
#include "formats/core/progress.h"
#include "formats/core/rng.h"
#include "formats/core/synthetic_models.h"
#include "formats/layout.h"
#include "formats/llama2c.h"
#include "formats/model_source.h"
#include "formats/predictor_file.h"
#include "formats/safetensors.h"
#include "formats/trace.h"
#include "layout/evaluate.h"
#include "runtime/device.h"
#include "runtime/flash_image.h"
#include "runtime/model/model.h"
#include "runtime/plan/read_plan.h"
#include "runtime/plan/replica_cover.h"

namespace nl::cli {
namespace {

struct PackArgs {
  std::string model, layout, out, dtype, tokenizer, export_permuted, synthetic_shape, device, predictor;
  std::string synthetic_act;       // whole synthetic models: "relu" (their own) or "silu"
  std::string act_threshold_from;  // trace whose per-layer thresholds go to the manifest's act_threshold
  std::string predictor_input = "residual";
  int synthetic_layers = 4;
  CLI::Option* layers_opt = nullptr;  // whole synthetic models keep their layer count unless --layers is given
  uint64_t seed = 1;
};

// Whole synthetic models: formats/core/synthetic_models.h.
constexpr const char* kSyntheticNote = kSyntheticWeightsNote;

// Per-layer CATS thresholds of a trace: its `threshold` layer attributes (calibrated rules), or X of an `abs>X` rule
// for every layer. InputError naming the trace when it has neither or another layer count.
std::vector<double> trace_act_thresholds(const std::string& path, int n_layers) {
  TraceInfo ti = TraceReader(path).info();
  if (ti.n_layers != uint32_t(n_layers))
    throw InputError(path, "has " + std::to_string(ti.n_layers) + " layers, the model has " + std::to_string(n_layers));
  if (!ti.thresholds.empty()) {
    for (size_t l = 0; l < ti.thresholds.size(); ++l)
      if (!(ti.thresholds[l] >= 0) || !std::isfinite(ti.thresholds[l]))
        throw InputError(path, "layer " + std::to_string(l) + "'s activation threshold " +
                                   std::to_string(ti.thresholds[l]) + " is not a finite number >= 0");
    return ti.thresholds;
  }
  if (ti.activation.rfind("abs>", 0) == 0) {
    try {
      size_t used = 0;
      const double x = std::stod(ti.activation.substr(4), &used);
      if (used == ti.activation.size() - 4 && x >= 0 && std::isfinite(x))
        return std::vector<double>(size_t(n_layers), x);
    } catch (const std::exception&) {
    }
  }
  throw InputError(path, "records no activation thresholds (activation '" + ti.activation +
                             "'; profile with --activation calibrated:F or abs>X)");
}

// "NAME" from the tables, or "DIMxHIDDEN" / "DIMxHIDDENxplain|gated" (plain when omitted).
SyntheticFfnShape synthetic_shape_parse(const std::string& s) {
  SyntheticFfnShape r;
  if (!synthetic_ffn_shape_parse(s, &r))
    throw UsageError("--synthetic-shape " + s + ": expected " + synthetic_shape_names() +
                     ", or DIMxHIDDEN[xplain|xgated]");
  return r;
}

// splitmix64 (formats/core/rng.h): fast, seedable per layer, so each layer's weights do not depend on the others.
using SplitMix = SplitMix64;
void fill_uniform(std::vector<float>& v, size_t n, float scale, SplitMix& r) {
  v.resize(n);
  for (size_t i = 0; i < n; ++i) v[i] = (float(r.next() >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f) * scale;
}
// A tensor's own stream, keyed by (seed, tensor name): the bytes do not depend on which tensors came before, so
// tensors can be generated in any order (and one at a time).
SplitMix tensor_rng(uint64_t seed, const std::string& name) {
  return SplitMix{seed * 0x100000001b3ull ^ xxh64_of(name.data(), name.size())};
}

// --predictor random:R -> R (>= 1); -1 for a malformed random:..., 0 for anything else (a file name).
int random_predictor_rank(const std::string& s) {
  if (s.rfind("random:", 0) != 0) return 0;
  const std::string r = s.substr(7);
  if (r.empty() || r.size() > 7 || r.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::atoi(r.c_str()) >= 1 ? std::atoi(r.c_str()) : -1;
}

void add_pack_input_options(CLI::App* c, PackArgs& a) {
  auto* model =
      c->add_option("--model", a.model, "llama2.c .bin, or a Hugging Face folder / config.json / model.safetensors")
          ->check(CLI::ExistingPath)
          ->group("Input");
  auto* synth = c->add_option("--synthetic-shape", a.synthetic_shape,
                              "Instead of --model: random weights. A whole model for end-to-end timing (llama2-7b, "
                              "mistral-7b, llama-1b, tiny-test; meaningless text, real timing) or only the FFN of a "
                              "paper model's shape, for I/O benchmarks (opt-350m, opt-6.7b, llama2-7b-prosparse, "
                              "mistral-7b-turbosparse, or DIMxHIDDEN[xplain|xgated])")
                    ->group("Synthetic");
  model->excludes(synth);
  // Runs while parsing, before --out is required: a query, not a pack.
  c->add_flag_callback(
       "--list-synthetic-models",
       [] {
         nlohmann::json j = nlohmann::json::object();
         for (const auto& [name, m] : synthetic_models()) {
           const ModelConfig& k = m.config;
           j[name] = {{"dim", k.dim},         {"hidden_dim", k.hidden_dim},      {"n_layers", k.n_layers},
                      {"n_heads", k.n_heads}, {"n_kv_heads", k.n_kv_heads},      {"vocab_size", k.vocab_size},
                      {"seq_len", k.seq_len}, {"arch", model_arch_name(k.arch)}, {"what", m.what}};
         }
         std::printf("%s\n", json_dump(j, 1).c_str());
         throw CLI::Success();
       },
       "Print the whole synthetic models' shapes (--synthetic-shape) as JSON and exit")
      ->group("Synthetic");
  a.layers_opt = c->add_option("--layers", a.synthetic_layers,
                               "Synthetic: layers (FFN-only shapes: default 4; whole models: default the model's)")
                     ->check(CLI::Range(1, 4096))
                     ->group("Synthetic");
  c->add_option("--synthetic-act", a.synthetic_act,
                "Whole synthetic models: FFN activation, relu (default: ProSparse / TurboSparse-like, exact zeros) or "
                "silu (the same weights as a dense SiLU Llama, e.g. to time against llama.cpp, whose LLaMA arch "
                "computes SiLU only)")
      ->check(CLI::IsMember({"relu", "silu"}))
      ->group("Synthetic");
  c->add_option("--seed", a.seed, "Synthetic: weight seed (same shape, seed and layout give identical bytes)")
      ->group("Synthetic");
  c->add_option("--layout", a.layout, "Layout JSON from nl-layout solve (default: identity order)")
      ->check(CLI::ExistingFile)
      ->group("Input");
  c->add_option("--device", a.device,
                "Device profile the layout was solved for, recorded in the manifest for nl-run (default: the "
                "built-in UFS 4.0, nl-layout eval's default; needed when the layout names another device)")
      ->check(CLI::ExistingFile)
      ->group("Input");
  c->add_option(
       "--tokenizer", a.tokenizer,
       "Tokenizer copied beside the image as OUT.tokenizer and named in the manifest (nl-run --prompt finds it)")
      ->check(CLI::ExistingFile)
      ->group("Input");
  CLI::Option* pred =
      c->add_option("--predictor", a.predictor,
                    "Activation predictor stored in the image for nl-run --select predictor (score = fc2 relu(fc1 x)): "
                    "a GGUF or safetensors file with PowerInfer's names blk.{l}.fc1.weight [rank][dim] and "
                    "blk.{l}.fc2.weight [hidden][rank]; a TurboSparse checkpoint folder (its "
                    "model.layers.{l}.mlp.predictor.fc1/fc2.weight); random:R with a whole synthetic model: random "
                    "weights of rank R (benchmarks)")
          ->check([](const std::string& s) {
            const int r = random_predictor_rank(s);
            return r > 0 ? std::string() : r < 0 ? "random:R needs a whole rank R >= 1" : CLI::ExistingPath(s);
          })
          ->group("Input");
  c->add_option("--predictor-input", a.predictor_input,
                "What the predictor reads: residual (the residual stream entering the FFN, before its norm: what "
                "PowerInfer's and TurboSparse's predictors were trained on) or ffn_norm (the FFN's normalised input)")
      ->check([](const std::string& s) {
        PredictorInput p;
        return predictor_input_parse(s, &p) ? std::string() : "must be residual or ffn_norm";
      })
      ->needs(pred)
      ->capture_default_str()
      ->group("Input");
  c->add_option("--act-threshold-from", a.act_threshold_from,
                "Trace (nl-profile run --activation calibrated:F or abs>X) whose per-layer thresholds go to the "
                "manifest's act_threshold (nl-run --select threshold)")
      ->check(CLI::ExistingFile)
      ->group("Input");
}

void add_pack_output_options(CLI::App* c, PackArgs& a) {
  c->add_option("--out", a.out, "Flash image to write (the manifest goes to OUT.json)")->required()->group("Output");
  c->add_option("--dtype", a.dtype,
                "Element type in the image: f32, f16, bf16, or GGUF-style q8_0 / q4_0 blocks of 32 along dim (needs "
                "dim % 32 == 0; norms stay f32). Default f32; f16 with --synthetic-shape")
      ->check(CLI::IsMember({"f32", "f16", "bf16", "q8_0", "q4_0"}))
      ->group("Output");
  c->add_option("--export-permuted", a.export_permuted,
                "Also write the permuted model here, in the input's format (.bin file or Hugging Face folder)")
      ->group("Output");
}

bool is_llama2c(const std::string& p) { return p.size() > 4 && p.compare(p.size() - 4, 4, ".bin") == 0; }

// Only what replay reads has the paper's shape and random values: the FFN bundles. The dense part (never read by
// nl-run replay) is a small stand-in: vocabulary 256, one KV head, zero attention weights, unit norms.
ModelConfig synthetic_config(const SyntheticFfnShape& s, int layers) {
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

ImageManifest write_synthetic(const std::string& out, const SyntheticFfnShape& s, int layers, uint64_t seed,
                              ImageSpec spec, const ProgressFn& progress, StoredErrors* errors) {
  spec.config = synthetic_config(s, layers);
  spec.bundle_kind = s.kind;
  const ModelConfig& c = spec.config;
  ImageWriter iw(out, std::move(spec));
  iw.set_progress(progress);
  iw.set_error_stats(errors);
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

// Memory pack needs, refused before anything is read or generated when MemAvailable is less (the image's disk room
// is checked by ImageWriter before any byte is written): one layer's FFN as f32 (gate, up, down) and its stored
// bundles, plus the dense tensors as f32 (all of them for a real model, whose dense weights are held; the largest
// one for a synthetic model, generated one at a time).
void refuse_impossible_pack(const ModelConfig& c, bool synthetic, const std::string& name) {
  const unsigned __int128 mat = (unsigned __int128)uint64_t(c.dim) * uint64_t(c.hidden_dim);
  unsigned __int128 dense = 0, largest = 0;
  for (const DenseTensor& t : image_dense_tensor_list(c)) {
    dense += (unsigned __int128)t.elems() * 4;
    largest = std::max<unsigned __int128>(largest, (unsigned __int128)t.elems() * 4);
  }
  const unsigned __int128 need =
      mat * 4 * 3 + mat * 4 * 3 /*stored bundles, at most f32 bytes*/ + (synthetic ? largest : dense);
  require_memory("nl-layout pack " + name + " (dim " + std::to_string(c.dim) + ", " + std::to_string(c.hidden_dim) +
                     " FFN neurons)",
                 need > UINT64_MAX ? UINT64_MAX : uint64_t(need));
}

// Outputs and the files they imply (manifest, tokenizer copy, an exported folder's files) against the inputs.
void pack_check_paths(const PackArgs& a) {
  std::vector<NamedPath> outputs = {{"--out", a.out}, {"--out", manifest_path_for(a.out)}};
  if (!a.tokenizer.empty()) outputs.push_back({"--out", a.out + ".tokenizer"});
  if (!a.export_permuted.empty()) {
    if (is_llama2c(a.model)) {
      outputs.push_back({"--export-permuted", a.export_permuted});
    } else {
      for (const NamedPath& n : hf_folder_outputs("--export-permuted", a.export_permuted)) outputs.push_back(n);
    }
  }
  check_paths({{"--model", a.model},
               {"--layout", a.layout},
               {"--tokenizer", a.tokenizer},
               {"--predictor", random_predictor_rank(a.predictor) > 0 ? std::string() : a.predictor}},
              outputs);
}

// A whole synthetic model, tensor by tensor: uniform weights of variance 1/in (scale sqrt(3/in)), so activations
// keep their size through the layers; unit RMS-norm weights; embeddings uniform in [-1, 1]. Memory: one tensor
// (or one layer's FFN) at a time.
ImageManifest write_synthetic_model(const std::string& out, const ModelConfig& c, uint64_t seed, ImageSpec spec,
                                    const ProgressFn& progress, StoredErrors* errors, const PredictorFile* predictor,
                                    int random_rank) {
  spec.config = c;
  spec.bundle_kind = bundle_kind_of(c);
  ImageWriter iw(out, std::move(spec));
  iw.set_progress(progress);
  iw.set_error_stats(errors);
  std::vector<float> v;
  for (const DenseTensor& t : image_dense_tensor_list(c)) {
    if (image_dense_is_norm(t.rows)) {  // norm weights start at 1, OPT's biases at 0
      v.assign(t.elems(), t.name.find("rms_") != std::string::npos ? 1.0f : 0.0f);
    } else {
      SplitMix r = tensor_rng(seed, t.name);
      fill_uniform(v, t.elems(), t.name == "tok_embeddings" ? 1.0f : std::sqrt(3.0f / float(t.cols)), r);
    }
    iw.add_dense(t.name, v.data(), v.size());
  }
  v = {};
  const size_t mat = size_t(c.dim) * size_t(c.hidden_dim);
  std::vector<float> gate, up, down;
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    SplitMix rg = tensor_rng(seed, p + "w_gate"), ru = tensor_rng(seed, p + "w_up"),
             rd = tensor_rng(seed, p + "w_down");
    if (c.ffn_gated()) fill_uniform(gate, mat, std::sqrt(3.0f / float(c.dim)), rg);
    fill_uniform(up, mat, std::sqrt(3.0f / float(c.dim)), ru);
    fill_uniform(down, mat, std::sqrt(3.0f / float(c.hidden_dim)), rd);
    iw.add_layer(l, c.ffn_gated() ? gate.data() : nullptr, up.data(), down.data());
  }
  if (predictor) predictor->write_to(iw);                         // a predictor file given for the synthetic model
  for (int l = 0; l < (random_rank > 0 ? c.n_layers : 0); ++l) {  // --predictor random:R: uniform, variance 1/in
    const std::string p = "predictor." + std::to_string(l) + ".";
    SplitMix r1 = tensor_rng(seed, p + "fc1"), r2 = tensor_rng(seed, p + "fc2");
    fill_uniform(gate, size_t(random_rank) * size_t(c.dim), std::sqrt(3.0f / float(c.dim)), r1);
    fill_uniform(up, size_t(c.hidden_dim) * size_t(random_rank), std::sqrt(3.0f / float(random_rank)), r2);
    iw.add_predictor_layer(l, gate.data(), up.data());
  }
  return iw.commit();
}

// ---- storage-error report ----------------------------------------------------------------------------------

// The fixed prompt of the logit check: BOS, then the f32 model's own greedy continuation.
constexpr int kReportBos = 1;
constexpr int kReportTokens = 64;
// The logit check holds the model twice in fp32; above this it is skipped (said so in the report).
constexpr uint64_t kReportMaxModelBytes = 2ull << 30;

struct LogitCheck {
  bool done = false;
  std::string skipped;      // why not, when !done
  int positions = 0;        // positions compared (teacher-forced on the f32 model's greedy tokens)
  int agree = 0;            // positions where the stored model's greedy token equals the f32 model's
  int common_prefix = 0;    // free-running greedy: tokens equal before the first difference
  double max_abs_diff = 0;  // max |logit difference| over all positions and the vocabulary
};

uint64_t model_f32_bytes(const ModelConfig& c) {
  const uint64_t dim = uint64_t(c.dim), kv = uint64_t(c.kv_dim()), hid = uint64_t(c.hidden_dim);
  const uint64_t per_layer = 2 * dim * dim + 2 * kv * dim + 3 * hid * dim + 2 * dim;
  return 4 * (uint64_t(c.vocab_size) * dim * (c.shared_classifier ? 1 : 2) + uint64_t(c.n_layers) * per_layer + dim);
}

// Runs the f32 source and the image's stored weights (decoded to f32, exactly the values the stored bytes hold)
// through the same f32 Model: the tokens the stored dtype gives, up to the runtime kernels' rounding.
LogitCheck logit_check(ModelSource& src, const std::string& image) {
  LogitCheck r;
  const ModelConfig& c = src.config();
  if (model_f32_bytes(c) > kReportMaxModelBytes) {
    r.skipped = "the model is larger than 2 GiB in f32";
    return r;
  }
  if (c.vocab_size <= kReportBos) {
    r.skipped = "the vocabulary has no BOS token 1";
    return r;
  }
  const ModelWeights w0 = read_model_source(src);
  IoOptions io;
  io.direct = false;
  FlashImage img(image, io);
  ModelWeights w1 = img.load_dense();
  for (int l = 0; l < c.n_layers; ++l) img.load_ffn_layer(l, &w1.layers[size_t(l)]);
  const int n = std::min(kReportTokens, c.seq_len);
  const int vocab = c.vocab_size;
  {
    Model m0(w0, n), m1(w1, n);
    int tok = kReportBos;
    for (int pos = 0; pos < n; ++pos) {
      const float* a = m0.forward_token(tok, pos);
      std::vector<float> la(a, a + vocab);
      const float* b = m1.forward_token(tok, pos);
      for (int i = 0; i < vocab; ++i)
        r.max_abs_diff = std::max(r.max_abs_diff, double(std::fabs(la[size_t(i)] - b[i])));
      const int t0 = int(std::max_element(la.begin(), la.end()) - la.begin());
      const int t1 = int(std::max_element(b, b + vocab) - b);
      r.agree += t0 == t1;
      tok = t0;  // both follow the f32 tokens
    }
    r.positions = n;
  }
  {
    Model m0(w0, n), m1(w1, n);
    int t0 = kReportBos, t1 = kReportBos;
    for (int pos = 0; pos < n; ++pos) {
      const float* a = m0.forward_token(t0, pos);
      t0 = int(std::max_element(a, a + vocab) - a);
      const float* b = m1.forward_token(t1, pos);
      t1 = int(std::max_element(b, b + vocab) - b);
      if (t0 != t1) break;
      ++r.common_prefix;
    }
  }
  r.done = true;
  return r;
}

nlohmann::json report_json(ImageDtype d, const StoredErrors& errors, const LogitCheck* lc) {
  nlohmann::json j;
  j["dtype"] = image_dtype_name(d);
  nlohmann::json rms = nlohmann::json::object();
  for (const auto& [kind, e] : errors) rms[kind] = e.rel_rms();
  j["relative_rms_error"] = std::move(rms);
  if (lc) {
    if (lc->done)
      j["logits"] = {{"prompt", "BOS (token 1) + the f32 model's " + std::to_string(lc->positions) + " greedy tokens"},
                     {"positions", lc->positions},
                     {"greedy_agree", lc->agree},
                     {"greedy_agreement", lc->positions ? double(lc->agree) / lc->positions : 0.0},
                     {"free_running_common_prefix", lc->common_prefix},
                     {"max_abs_logit_diff", lc->max_abs_diff},
                     {"computed_with", "f32 Model on the stored weights decoded to f32"}};
    else
      j["logits"] = {{"skipped", lc->skipped}};
  }
  return j;
}

void report_print(const GlobalOptions& g, ImageDtype d, const StoredErrors& errors, const LogitCheck* lc) {
  std::string line = std::string("storage error (") + image_dtype_name(d) + " vs f32 source), relative RMS:";
  char buf[96];
  for (const auto& [kind, e] : errors) {
    std::snprintf(buf, sizeof buf, " %s %.3g", kind.c_str(), e.rel_rms());
    line += buf;
  }
  info(g, line);
  if (!lc) return;
  if (!lc->done) {
    info(g, "logit check skipped: " + lc->skipped);
    return;
  }
  std::snprintf(buf, sizeof buf, "%d/%d (%.1f %%)", lc->agree, lc->positions,
                lc->positions ? std::floor(1000.0 * lc->agree / lc->positions) / 10 : 0.0);  // cut, never rounded up
  info(g, std::string("greedy tokens equal to f32 over BOS + ") + std::to_string(lc->positions) +
              " tokens (teacher-forced): " + buf + ", free-running common prefix " + std::to_string(lc->common_prefix) +
              ", max |logit difference| " + std::to_string(lc->max_abs_diff) +
              " (f32 Model on the stored weights; the runtime's kernels differ only by rounding)");
}

// The planner settings a layout was solved / evaluated for: the layout's own parameters where it records them
// (greedy+ls records gap, cache ratio, device name and admission), else nl-layout eval's defaults (the one
// definition: DeviceObjectiveArgs and default_device()). The device's fit comes from --device or the built-in
// profile; a layout solved for another device needs --device.
ImagePlanner planner_of(const Layout& lay, const std::string& layout_path, const std::string& device_path) {
  const DeviceObjectiveArgs eval_defaults;
  const DeviceModel dev = device_path.empty() ? default_device() : device_load(device_path);
  const nlohmann::json& p = lay.parameters;
  ImagePlanner r;
  const bool recorded = p.is_object() && p.contains("gap");
  r.from = recorded ? "layout" : "nl-layout eval defaults";
  r.gap = recorded && p["gap"].is_string() ? p["gap"].get<std::string>() : eval_defaults.gap;
  r.cache_ratio = recorded && p.contains("cache_ratio") && p["cache_ratio"].is_number() ? p["cache_ratio"].get<double>()
                                                                                        : eval_defaults.cache_ratio;
  try {
    GapPolicy::parse(r.gap);
  } catch (const UsageError&) {
    throw InputError(layout_path, "parameters.gap '" + r.gap + "' is not off, auto, auto-keep-runs or a bundle count");
  }
  if (!(r.cache_ratio >= 0 && r.cache_ratio <= 1))
    throw InputError(layout_path, "parameters.cache_ratio must be in [0, 1]");
  r.cache_admission = eval_defaults.plain_s3fifo ? CacheAdmission::kAll : CacheAdmission::kLinkingAligned;
  if (recorded && p.contains("admission") &&
      !(p["admission"].is_string() && cache_admission_parse(p["admission"].get<std::string>(), &r.cache_admission)))
    throw InputError(layout_path, std::string("parameters.admission must be ") + kCacheAdmissions);
  const std::string named =
      recorded && p.contains("device") && p["device"].is_string() ? p["device"].get<std::string>() : "";
  if (!named.empty() && named != dev.name)
    throw UsageError("the layout " + layout_path + " was solved for device '" + named + "', " +
                     (device_path.empty() ? "not the built-in '" + dev.name + "': pass its profile with --device"
                                          : "--device " + device_path + " is '" + dev.name + "'"));
  r.device = dev.name;
  r.read_latency_us = dev.cost.read_latency_us;
  r.bandwidth_MBps = dev.cost.bandwidth_MBps;
  return r;
}

void pack_main(const PackArgs& a, const GlobalOptions& g) {
  apply_global_options(g);
  if (a.model.empty() == a.synthetic_shape.empty()) throw UsageError("pack needs --model or --synthetic-shape");
  if (!a.device.empty() && a.layout.empty()) throw UsageError("--device names the layout's device: it needs --layout");
  if (!a.synthetic_act.empty() && a.synthetic_shape.empty())
    throw UsageError("--synthetic-act needs --synthetic-shape");
  const bool synthetic = !a.synthetic_shape.empty();
  const std::string dtype = !a.dtype.empty() ? a.dtype : synthetic ? "f16" : "f32";
  pack_check_paths(a);
  // Image, manifest, tokenizer copy and permuted model: renamed into place together at the end, after everything
  // was validated and written, or not at all (a failed pack leaves an existing bundle as it was).
  CommitGroup outputs;
  std::unique_ptr<ModelSource> src;  // streams the FFN layer by layer
  ImageSpec spec;
  if (!image_dtype_parse(dtype, &spec.dtype)) throw UsageError("unknown --dtype " + dtype);
  ModelWeights w;
  SyntheticFfnShape shape;
  const SyntheticModel* whole = nullptr;
  if (synthetic) {
    if (!a.export_permuted.empty()) throw UsageError("--export-permuted needs --model");
    if (auto it = synthetic_models().find(a.synthetic_shape); it != synthetic_models().end()) {
      whole = &it->second;
      w.config = whole->config;
      if (a.layers_opt && a.layers_opt->count() > 0) w.config.n_layers = a.synthetic_layers;
      if (!a.synthetic_act.empty()) w.config.act = a.synthetic_act == "silu" ? FfnAct::kSilu : FfnAct::kRelu;
    } else {
      if (!a.synthetic_act.empty())
        throw UsageError("--synthetic-act applies to whole synthetic models (" + a.synthetic_shape +
                         " is an FFN-only shape)");
      shape = synthetic_shape_parse(a.synthetic_shape);
      w.config = synthetic_config(shape, a.synthetic_layers);
    }
  } else {
    src = open_model_source(a.model);
  }
  // Refused before anything is read or written (exit 2: the dtype does not fit this model).
  const ModelConfig& cfg0 = synthetic ? w.config : src->config();
  if (std::string p = image_dtype_problem(cfg0, spec.dtype); !p.empty())
    throw UsageError("--dtype " + dtype + " cannot store " + (synthetic ? a.synthetic_shape : a.model) + ": " + p);
  refuse_impossible_pack(cfg0, synthetic, synthetic ? a.synthetic_shape : a.model);
  if (!synthetic) w = src->read_dense();
  if (!a.tokenizer.empty()) {
    // The tokenizer travels with the image (to a phone, say): copied beside it and recorded by its file name, which
    // nl-run resolves relative to the manifest's folder. Copied first, so a manifest never names a missing file.
    const std::string tok_out = a.out + ".tokenizer";
    write_file_atomic(tok_out, read_file(a.tokenizer, 256ull << 20));
    spec.tokenizer = tok_out.substr(tok_out.rfind('/') == std::string::npos ? 0 : tok_out.rfind('/') + 1);
  }
  spec.source = !synthetic ? a.model
                : whole
                    ? "synthetic:" + a.synthetic_shape + " seed " + std::to_string(a.seed) + " (" + kSyntheticNote + ")"
                    : "synthetic:" + a.synthetic_shape + " seed " + std::to_string(a.seed) + " (random weights)";
  spec.source_format = synthetic ? "" : is_llama2c(a.model) ? "llama2c" : "safetensors";
  if (!a.layout.empty()) {
    Layout lay = layout_load(a.layout);
    if (lay.layers.size() != size_t(w.config.n_layers))
      throw InputError(a.layout, "has " + std::to_string(lay.layers.size()) + " layers, the model has " +
                                     std::to_string(w.config.n_layers));
    for (size_t l = 0; l < lay.layers.size(); ++l) {
      // Flash replication: the order lists hidden_dim + replicas slots; the image holds every slot's bundle.
      if (lay.layers[l].order.size() != size_t(w.config.hidden_dim) + lay.layers[l].replicas)
        throw InputError(a.layout, "layer " + std::to_string(l) + " orders " +
                                       std::to_string(lay.layers[l].order.size() - lay.layers[l].replicas) +
                                       " neurons, the model has " + std::to_string(w.config.hidden_dim));
      spec.order.push_back(lay.layers[l].order);
    }
    spec.cache_policy = layout_cache_policy_slots(lay);  // pinned neurons -> slots (docs/formats.md)
    spec.planner = planner_of(lay, a.layout, a.device);
    // A greedy+ls layout records the bundle bytes its I/O objective priced (0: the solver's f16 default). Packed
    // into another bundle size it still works, but its cache and order were chosen for other reads: say so.
    if (const nlohmann::json& p = lay.parameters;
        p.is_object() && p.contains("bundle_bytes") && p["bundle_bytes"].is_number_unsigned()) {
      const uint64_t solved = p["bundle_bytes"].get<uint64_t>();
      const uint64_t here = image_bundle_bytes(spec.dtype, synthetic && !whole ? shape.kind : bundle_kind_of(w.config),
                                               size_t(w.config.dim));
      if (solved != 0 && solved != here)
        std::fprintf(stderr,
                     "nl-layout pack: warning: %s was solved for %llu-byte bundles, this %s image has %llu-byte "
                     "bundles (solve with --bundle-for MODEL --dtype %s for the reads this image pays)\n",
                     a.layout.c_str(), (unsigned long long)solved, image_dtype_name(spec.dtype),
                     (unsigned long long)here, image_dtype_name(spec.dtype));
    }
    spec.layout = a.layout;
    spec.layout_method = lay.method;
  }
  if (!a.act_threshold_from.empty()) spec.act_threshold = trace_act_thresholds(a.act_threshold_from, w.config.n_layers);
  std::unique_ptr<PredictorFile> predictor;
  const int random_rank = random_predictor_rank(a.predictor);
  if (random_rank > 0) {
    if (!whole) throw UsageError("--predictor random:R needs a whole synthetic model (--synthetic-shape NAME)");
    if (random_rank > w.config.dim + w.config.hidden_dim)
      throw UsageError("--predictor random:R: R is at most dim + hidden_dim (" +
                       std::to_string(w.config.dim + w.config.hidden_dim) + ")");
    spec.predictor_rank = random_rank;
    spec.predictor_source = a.predictor + " (synthetic random weights)";
  } else if (!a.predictor.empty()) {
    if (synthetic && !whole)
      throw UsageError("--predictor needs --model or a whole synthetic model (" + a.synthetic_shape +
                       " is an FFN-only shape)");
    predictor = std::make_unique<PredictorFile>(a.predictor, w.config);
    spec.predictor_rank = predictor->rank();
    spec.predictor_source = a.predictor;
  }
  if (!predictor_input_parse(a.predictor_input, &spec.predictor_input))
    throw InternalError("--predictor-input " + a.predictor_input);
  // The permuted model export has one copy of each neuron: a replicated layer exports its order without the replicas
  // (each neuron at its first copy's place), which computes the same.
  std::vector<std::vector<uint32_t>> order = spec.order;
  for (size_t l = 0; l < order.size(); ++l)
    if (order[l].size() != size_t(w.config.hidden_dim))
      order[l] = primary_order(order[l], uint32_t(w.config.hidden_dim));
  ImageManifest m;
  // f32 images store the source exactly: no report.
  const bool report = spec.dtype != ImageDtype::kF32;
  StoredErrors errors;
  {
    // Per FFN layer, as the image is written (the dense region comes first).
    Progress prog("pack", uint64_t(w.config.n_layers), !g.quiet, "layers");
    const ProgressFn on_layer = [&prog](uint64_t done, uint64_t) { prog.set(done); };
    StoredErrors* e = report ? &errors : nullptr;
    if (whole)
      m = write_synthetic_model(a.out, w.config, a.seed, std::move(spec), on_layer, e, predictor.get(), random_rank);
    else if (synthetic)
      m = write_synthetic(a.out, shape, a.synthetic_layers, a.seed, std::move(spec), on_layer, e);
    else
      m = image_write_source(a.out, *src, w, std::move(spec), on_layer, e, predictor.get());
    prog.finish();
  }
  w = ModelWeights{};  // the dense weights are not needed by the export, which streams
  info(g, "wrote " + a.out + " (" + std::to_string(m.image_bytes) + " bytes, " + std::to_string(m.regions.size()) +
              " regions, " + image_dtype_name(m.dtype) + ", bundle " + std::to_string(m.bundle_bytes) + " bytes) and " +
              manifest_path_for(a.out) + (m.cache_policy.empty() ? "" : " with the layout's cache policy"));
  if (!m.planner.empty())
    info(g, "planner settings for nl-run (" + m.planner.from + "): gap " + m.planner.gap + ", cache " +
                std::to_string(m.planner.cache_ratio) + " (" + cache_admission_name(m.planner.cache_admission) +
                "), device " + m.planner.device);
  if (whole) info(g, a.synthetic_shape + " (" + whole->what + "): " + kSyntheticNote);
  if (!a.export_permuted.empty()) {
    // Streams like the image: one FFN matrix in memory at a time, other tensors copied through in chunks.
    Progress prog("export", 3 * uint64_t(m.config.n_layers), !g.quiet, "FFN matrices");
    src->write_permuted(a.export_permuted, order, [&prog](uint64_t done, uint64_t) { prog.set(done); });
    prog.finish();
    info(g, "wrote the permuted model " + a.export_permuted);
  }
  outputs.commit();
  // The logit check reads the image back, so it runs once the outputs are in place (it writes nothing).
  LogitCheck lc;
  if (report && !synthetic) lc = logit_check(*src, a.out);
  if (report) report_print(g, m.dtype, errors, synthetic ? nullptr : &lc);
  if (g.json) {
    nlohmann::json j = {{"image", a.out},
                        {"manifest", manifest_path_for(a.out)},
                        {"image_bytes", m.image_bytes},
                        {"bundle_bytes", m.bundle_bytes},
                        {"regions", m.regions.size()},
                        {"layers", m.config.n_layers},
                        {"dtype", image_dtype_name(m.dtype)}};
    if (report) j["quantization"] = report_json(m.dtype, errors, synthetic ? nullptr : &lc);
    if (synthetic) j["synthetic"] = whole ? kSyntheticNote : "synthetic random FFN weights (I/O only)";
    if (!a.export_permuted.empty()) j["permuted_model"] = a.export_permuted;
    std::printf("%s\n", json_dump(j, 2).c_str());
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
