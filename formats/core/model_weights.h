// Llama-family model configuration and dense fp32 weights as plain arrays. Every model reader (llama2.c `.bin`,
// safetensors, the flash image) fills this struct and runtime/model computes with it; it lives in formats/core
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
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "formats/core/enum_names.h"

namespace nl {

enum class FfnAct : int { kSilu = 0, kRelu = 1, kFatRelu = 2, kDRelu = 3 };

// The manifest's and config.json's names (hidden_act): silu, relu, fatrelu, drelu.
inline constexpr EnumName<FfnAct> kFfnActNames[] = {
    {FfnAct::kSilu, "silu"}, {FfnAct::kRelu, "relu"}, {FfnAct::kFatRelu, "fatrelu"}, {FfnAct::kDRelu, "drelu"}};
inline const char* ffn_act_name(FfnAct a) { return enum_name(kFfnActNames, a, "silu"); }
// Parses ffn_act_name's names; false when `s` is none of them.
inline bool ffn_act_parse(const std::string& s, FfnAct* out) { return enum_parse(kFfnActNames, s, out); }
// True when the activation gives exact zeros (every one but SiLU): a neuron with h = 0 adds nothing and is not read.
inline bool ffn_act_sparse(FfnAct a) { return a != FfnAct::kSilu; }

struct ModelConfig {
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
};

struct ModelWeights {
  ModelConfig config;
  std::string source;                 // file it was read from (for messages and trace metadata)
  std::vector<float> tok_embeddings;  // [vocab][dim]
  std::vector<LayerWeights> layers;
  std::vector<float> rms_final;  // [dim]
  std::vector<float> wcls;       // [vocab][dim]; empty when config.shared_classifier

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
  return "";
}

}  // namespace nl
