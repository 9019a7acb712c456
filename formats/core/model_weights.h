// Model configuration and dense fp32 weights as plain arrays (the Llama family and OPT). Every model reader (llama2.c
// `.bin`, safetensors, the flash image) fills this struct and runtime/model computes with it; it lives in formats/core
// so that both sides may include it without breaking the layering (docs/architecture.md).
//
// Conventions (canonical for the whole toolkit):
// - Row-major matrices, `[out][in]`: y = W x with W[o * in + i].
// - RoPE rotates interleaved pairs (2j, 2j+1) of each head, as llama2.c does. Readers of Hugging Face
//   checkpoints (rotate_half convention) un-permute the q/k rows at load; writers permute them back.
// - FFN: h = gate_act(gate x) * up_act(up x); out = down h. `gate` = llama2.c w1, `down` = w2, `up` = w3. The
//   activations (FfnAct): silu: gate_act = v / (1 + e^-v), up_act = identity; relu: gate_act = max(v, 0);
//   fatrelu (ProSparse): gate_act = v if v > t else 0 (t = ModelConfig::fatrelu_threshold >= 0); drelu (TurboSparse):
//   gate_act = up_act = max(v, 0). Every activation but silu gives exact zeros: a neuron fires (is needed) when its h
//   is not 0, which the gate alone decides except for drelu (gate x > 0 and up x > 0).
// - Phi (ModelArch::kPhi, modeling_phi.py): one LayerNorm (rms_att + att_norm_b) feeds attention and the FFN in
//   parallel, partial RoPE (rope_dims), q/k/v/o biases, a plain GeLU FFN h = gelu(up x + b_up) with b_down, a final
//   LayerNorm and a classifier with a bias (cls_b). GeLU never gives exact zeros: selection is CATS-style.
// - OPT (ModelArch::kOpt, Hugging Face modeling_opt.py with do_layer_norm_before): learned positions (row pos + 2 of
//   pos_embeddings added to the token's embedding), LayerNorm with a bias (weight in rms_*, bias in *_norm_b), q/k/v/o
//   with biases, no RoPE; a plain FFN h = relu(up x + b_up) (up = fc1), out = down h + b_down (down = fc2); w_gate
//   stays empty. A neuron fires when up x + b_up > 0; its bundle is the fc1 row and the fc2 column (two vectors).
#pragma once
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "formats/core/enum_names.h"

namespace nl {

// The block's architecture: Llama (RMSNorm, RoPE, gated FFN; Mistral, ProSparse, TurboSparse) or OPT.
enum class ModelArch : int { kLlama = 0, kOpt = 1, kPhi = 2 };
inline constexpr EnumName<ModelArch> kModelArchNames[] = {
    {ModelArch::kLlama, "llama"}, {ModelArch::kOpt, "opt"}, {ModelArch::kPhi, "phi"}};
inline const char* model_arch_name(ModelArch a) { return enum_name(kModelArchNames, a, "llama"); }
inline bool model_arch_parse(const std::string& s, ModelArch* out) { return enum_parse(kModelArchNames, s, out); }
// OPT's learned positions: position p uses row p + kOptPositionOffset of the table (Hugging Face's offset 2).
inline constexpr int kOptPositionOffset = 2;

enum class FfnAct : int { kSilu = 0, kRelu = 1, kFatRelu = 2, kDRelu = 3, kGelu = 4 };

// The manifest's and config.json's names (hidden_act): silu, relu, fatrelu, drelu; gelu is GeLU's tanh form (Phi's
// gelu_new, also called gelu_pytorch_tanh).
inline constexpr EnumName<FfnAct> kFfnActNames[] = {{FfnAct::kSilu, "silu"},
                                                    {FfnAct::kRelu, "relu"},
                                                    {FfnAct::kFatRelu, "fatrelu"},
                                                    {FfnAct::kDRelu, "drelu"},
                                                    {FfnAct::kGelu, "gelu"}};
inline const char* ffn_act_name(FfnAct a) { return enum_name(kFfnActNames, a, "silu"); }
// Parses ffn_act_name's names; false when `s` is none of them.
inline bool ffn_act_parse(const std::string& s, FfnAct* out) { return enum_parse(kFfnActNames, s, out); }
// True when the activation gives exact zeros (every one but SiLU and GeLU): a neuron with h = 0 adds nothing and is not
// read.
inline bool ffn_act_sparse(FfnAct a) { return a != FfnAct::kSilu && a != FfnAct::kGelu; }
// The smooth activations (never exactly zero): SiLU v / (1 + e^-v); GeLU 0.5 v (1 + tanh(sqrt(2/pi) (v + 0.044715
// v^3))) (transformers' NewGELUActivation). The one definition every path uses.
inline float ffn_act_smooth(FfnAct a, float v) {
  if (a == FfnAct::kGelu) return 0.5f * v * (1.0f + std::tanh(0.7978845608028654f * (v + 0.044715f * v * v * v)));
  return v / (1.0f + std::exp(-v));
}
// A plain (non-gated) FFN's activation of v = fc1 x + b1: OPT's relu, Phi's GeLU (only relu and the smooth ones are
// plain: model_config_problem refuses the others).
inline float ffn_act_plain(FfnAct a, float v) {
  return ffn_act_sparse(a) ? (v > 0.0f ? v : 0.0f) : ffn_act_smooth(a, v);
}

struct ModelConfig {
  ModelArch arch = ModelArch::kLlama;
  int dim = 0;         // model width
  int hidden_dim = 0;  // FFN width (neurons per layer)
  int n_layers = 0;
  int n_heads = 0;
  int n_kv_heads = 0;  // grouped-query attention: n_heads % n_kv_heads == 0
  int vocab_size = 0;
  int seq_len = 0;  // maximum context (KV cache length)
  float rope_theta = 10000.0f;
  float norm_eps = 1e-5f;
  FfnAct act = FfnAct::kSilu;
  float fatrelu_threshold = 0.0f;  // fatrelu's t (config.json hidden_act_param); 0 for every other activation
  bool shared_classifier = true;   // classifier = token embedding (tie_word_embeddings)
  // Sliding-window attention (Mistral): position i attends to positions j with i - window < j <= i; 0 = every
  // earlier position (Llama).
  int sliding_window = 0;
  // Partial rotary embeddings (Phi: head_dim x partial_rotary_factor): RoPE turns each head's first rope_dims
  // dimensions (pairs j < rope_dims / 2 at theta^(-2j / rope_dims)); 0 = the whole head.
  int rope_dims = 0;

  // The FFN has a gate (Llama family: gate row, up row, down column per neuron); OPT's and Phi's are plain (up row,
  // down column).
  bool ffn_gated() const { return arch == ModelArch::kLlama; }
  // OPT and Phi: LayerNorm with biases, attention and FFN biases (the tensors dense_tensor_specs adds).
  bool has_biases() const { return arch != ModelArch::kLlama; }
  // Rotary position embeddings (Llama family, Phi's partial ones); OPT adds learned positions to the embedding.
  bool rope() const { return arch != ModelArch::kOpt; }
  bool learned_positions() const { return arch == ModelArch::kOpt; }
  // Phi: attention and FFN read the same normalised input and both add to the residual (no FFN norm).
  bool parallel_block() const { return arch == ModelArch::kPhi; }
  // Phi: the classifier (lm_head) has a bias.
  bool classifier_bias() const { return arch == ModelArch::kPhi; }
  int rope_dim() const { return rope_dims > 0 ? rope_dims : head_dim(); }
  // The gate's zero threshold: gate_act(v) = 0 unless v > gate_floor() (relu / drelu 0, fatrelu t).
  float gate_floor() const { return act == FfnAct::kFatRelu ? fatrelu_threshold : 0.0f; }
  int head_dim() const { return n_heads ? dim / n_heads : 0; }
  int kv_dim() const { return n_heads ? dim / n_heads * n_kv_heads : 0; }
};

// One transformer block. FFN matrices may be left empty by a runtime that serves the FFN from flash.
struct LayerWeights {
  std::vector<float> rms_att;  // [dim]
  std::vector<float> wq;       // [dim][dim]
  std::vector<float> wk;       // [kv_dim][dim]
  std::vector<float> wv;       // [kv_dim][dim]
  std::vector<float> wo;       // [dim][dim]
  std::vector<float> rms_ffn;  // [dim]
  std::vector<float> w_gate;   // [hidden][dim]
  std::vector<float> w_up;     // [hidden][dim]
  std::vector<float> w_down;   // [dim][hidden]
  // OPT only (empty otherwise): the norms' biases, the attention biases, fc1's bias (one per neuron: stored with
  // the dense tensors, in neuron order) and fc2's.
  std::vector<float> att_norm_b, ffn_norm_b;  // [dim]
  std::vector<float> bq, bo;                  // [dim]
  std::vector<float> bk, bv;                  // [kv_dim]
  std::vector<float> b_up;                    // [hidden]
  std::vector<float> b_down;                  // [dim]
};

struct ModelWeights {
  ModelConfig config;
  std::string source;                 // file it was read from (for messages and trace metadata)
  std::vector<float> tok_embeddings;  // [vocab][dim]
  std::vector<LayerWeights> layers;
  std::vector<float> rms_final;       // [dim]
  std::vector<float> wcls;            // [vocab][dim]; empty when config.shared_classifier
  std::vector<float> pos_embeddings;  // OPT: [seq_len + kOptPositionOffset][dim]
  std::vector<float> final_norm_b;    // OPT, Phi: [dim]
  std::vector<float> cls_b;           // Phi: the classifier's bias [vocab]

  const float* classifier() const { return config.shared_classifier ? tok_embeddings.data() : wcls.data(); }
};

// Checks a config for values the math cannot handle; returns "" when fine, else what is wrong.
inline std::string model_config_problem(const ModelConfig& c) {
  if (c.dim <= 0 || c.hidden_dim <= 0 || c.n_layers <= 0 || c.n_heads <= 0 || c.n_kv_heads <= 0 || c.vocab_size <= 0 ||
      c.seq_len <= 0)
    return "dimensions must be positive";
  if (c.dim % c.n_heads != 0) return "dim is not a multiple of n_heads";
  if (c.n_heads % c.n_kv_heads != 0) return "n_heads is not a multiple of n_kv_heads";
  if (c.head_dim() % 2 != 0) return "head dimension is odd (RoPE needs pairs)";
  if (!(c.norm_eps > 0.0f) || !(c.rope_theta > 0.0f)) return "rms_norm_eps and rope_theta must be positive";
  if (c.act == FfnAct::kFatRelu ? !(c.fatrelu_threshold >= 0.0f && c.fatrelu_threshold < 1e30f)
                                : c.fatrelu_threshold != 0.0f)
    return "the activation threshold must be finite and >= 0, and set only for fatrelu";
  if (c.sliding_window < 0) return "sliding_window must be positive (or absent)";
  if (c.arch == ModelArch::kOpt && (c.act != FfnAct::kRelu || c.n_kv_heads != c.n_heads || c.sliding_window != 0))
    return "OPT models have a ReLU FFN, one key/value head per query head and no attention window";
  if ((c.arch == ModelArch::kPhi) != (c.act == FfnAct::kGelu) || (c.arch == ModelArch::kPhi && c.sliding_window))
    return "the GeLU FFN belongs to Phi models (and they have no attention window)";
  if (c.rope_dims != 0 &&
      (c.arch != ModelArch::kPhi || c.rope_dims < 2 || c.rope_dims % 2 != 0 || c.rope_dims > c.head_dim()))
    return "rope_dims (partial rotary) must be even, between 2 and the head dimension, and only for Phi";
  return "";
}

// One dense (non-FFN-matrix) tensor: its name in images, its shape ([rows][cols]; rows 1: a vector, stored f32) and
// where ModelWeights holds it. The one list of a model's dense tensors, in the image's order: the writer, the
// readers and the size checks all walk it.
struct DenseTensorSpec {
  std::string name;
  uint64_t rows = 0, cols = 0;
  int layer = -1;                                           // -1: a model-level tensor
  std::vector<float> ModelWeights::*model_field = nullptr;  // layer < 0
  std::vector<float> LayerWeights::*layer_field = nullptr;  // layer >= 0

  std::vector<float>& in(ModelWeights& w) const {
    return layer < 0 ? w.*model_field : w.layers[size_t(layer)].*layer_field;
  }
  const std::vector<float>& in(const ModelWeights& w) const {
    return layer < 0 ? w.*model_field : w.layers[size_t(layer)].*layer_field;
  }
  uint64_t elems() const { return rows * cols; }
};

inline std::vector<DenseTensorSpec> dense_tensor_specs(const ModelConfig& c) {
  const uint64_t dim = uint64_t(c.dim), kv = uint64_t(c.kv_dim()), vocab = uint64_t(c.vocab_size);
  const bool b = c.has_biases();
  std::vector<DenseTensorSpec> v;
  auto model = [&](const char* name, uint64_t rows, uint64_t cols, std::vector<float> ModelWeights::*f) {
    v.push_back({name, rows, cols, -1, f, nullptr});
  };
  model("tok_embeddings", vocab, dim, &ModelWeights::tok_embeddings);
  if (c.learned_positions())
    model("pos_embeddings", uint64_t(c.seq_len + kOptPositionOffset), dim, &ModelWeights::pos_embeddings);
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    auto layer = [&](const char* name, uint64_t rows, uint64_t cols, std::vector<float> LayerWeights::*f) {
      v.push_back({p + name, rows, cols, l, nullptr, f});
    };
    layer("rms_att", 1, dim, &LayerWeights::rms_att);
    if (b) layer("att_norm_b", 1, dim, &LayerWeights::att_norm_b);
    layer("wq", dim, dim, &LayerWeights::wq);
    if (b) layer("bq", 1, dim, &LayerWeights::bq);
    layer("wk", kv, dim, &LayerWeights::wk);
    if (b) layer("bk", 1, kv, &LayerWeights::bk);
    layer("wv", kv, dim, &LayerWeights::wv);
    if (b) layer("bv", 1, kv, &LayerWeights::bv);
    layer("wo", dim, dim, &LayerWeights::wo);
    if (b) layer("bo", 1, dim, &LayerWeights::bo);
    if (!c.parallel_block()) layer("rms_ffn", 1, dim, &LayerWeights::rms_ffn);
    if (b) {
      if (!c.parallel_block()) layer("ffn_norm_b", 1, dim, &LayerWeights::ffn_norm_b);
      layer("b_up", 1, uint64_t(c.hidden_dim), &LayerWeights::b_up);
      layer("b_down", 1, dim, &LayerWeights::b_down);
    }
  }
  model("rms_final", 1, dim, &ModelWeights::rms_final);
  if (b) model("final_norm_b", 1, dim, &ModelWeights::final_norm_b);
  if (!c.shared_classifier) model("wcls", vocab, dim, &ModelWeights::wcls);
  if (c.classifier_bias()) model("cls_b", 1, vocab, &ModelWeights::cls_b);
  return v;
}

}  // namespace nl
