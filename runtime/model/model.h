// The forward pass of the Llama family (RMSNorm, RoPE, grouped-query attention with a KV cache, gated FFN) and of OPT
// (LayerNorm, learned positions, biases, plain ReLU FFN; formats/core/model_weights.h), fp32 activations over weights
// in their stored dtype (runtime/model/weights_view.h), OpenMP. Two paths with identical arithmetic: forward_token()
// for generation and forward_sequence() for profiling, which runs whole sequences through matrix-matrix products.
//
// The FFN is pluggable: an FfnProvider computes a layer's FFN (the default is the dense one over the weights in
// DRAM; the flash runtime substitutes a sparse one), and an FfnObserver sees the gate activations that decide
// which neurons fire. Weights are a plain struct (formats/core/model_weights.h) filled by any reader.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "formats/core/model_weights.h"
#include "runtime/model/weights_view.h"

namespace nl {
namespace kernels {
class PreparedX;
}

// Sees each layer's FFN activations. `gate_act` is act(gate x), `h` is act(gate x) * (up x) (a plain FFN, OPT: both
// are relu(up x + b_up)),
// [n_tokens][hidden_dim] row-major; `pos0` is the position of the first token. A neuron with gate_act == 0
// contributes nothing (exact ReLU sparsity); CATS-style rules threshold |gate_act|. Called from the forward's
// thread, never concurrently.
class FfnObserver {
 public:
  virtual ~FfnObserver() = default;
  virtual void on_ffn(int layer, int pos0, int n_tokens, const float* gate_act, const float* h) = 0;
};

// Computes one layer's FFN for a block of tokens. `x` is the normalised input [n_tokens][dim]; the result goes
// to `out` [n_tokens][dim] (overwritten; the caller adds the residual and, OPT, fc2's bias). Providers may call
// `observer` (may be null) with their activations. Called from the forward's thread; implementations may use OpenMP
// inside.
class FfnProvider {
 public:
  virtual ~FfnProvider() = default;
  virtual void ffn(int layer, int pos0, int n_tokens, const float* x, float* out, FfnObserver* observer) = 0;
  // Read-ahead (nl-run --overlap cross): when wants_layer_input(), layer_start gets each layer's input before its
  // attention, normalised with the layer's FFN norm as the FFN input will be, so reads can start early.
  virtual bool wants_layer_input() const { return false; }
  virtual void layer_start(int layer, int pos0, int n_tokens, const float* x) {
    (void)layer, (void)pos0, (void)n_tokens, (void)x;
  }
  // The pass's residual stream x [n_tokens][dim] (one buffer for the whole pass, given before it starts): the layer's
  // input while layer_start() runs, the residual entering the FFN, before its norm, while ffn() runs (what
  // PowerInfer's and TurboSparse's predictors read).
  virtual void set_residual(const float* x) { (void)x; }
  // Sizes (and touches) the scratch of passes of up to n_tokens tokens ahead of them (Model::reserve).
  virtual void reserve(int n_tokens) { (void)n_tokens; }
};

// The dense FFN over ModelWeights (w_gate (gated FFNs), w_up, w_down, and OPT's b_up, of every layer must be present).
// The down projection sums over neurons with double accumulators (kernels::matmul_acc64), so the neuron order does not
// matter.
class DenseFfn : public FfnProvider {
 public:
  explicit DenseFfn(const ModelWeights& w) : w_(w) {}
  void ffn(int layer, int pos0, int n_tokens, const float* x, float* out, FfnObserver* observer) override;

 private:
  const ModelWeights& w_;
  std::vector<float> gate_, up_;
};

// Checks that every array has the size the config implies; returns "" or what is wrong.
// `need_ffn` = false accepts empty FFN matrices (a runtime serving the FFN from flash).
std::string model_weights_problem(const ModelWeights& w, bool need_ffn = true);

// A model instance: weights (borrowed, must outlive it), KV cache and scratch buffers.
// Not thread-safe: one instance per generating thread; the math inside uses OpenMP.
class Model {
 public:
  // f32 weights with the dense FFN (when present). Throws InputError (naming w.source) when the weights do not match
  // the config. `max_seq` bounds the KV cache (0 = config.seq_len).
  explicit Model(const ModelWeights& w, int max_seq = 0);
  // Typed weights (an image's dense region): no FFN of its own, set_ffn() must provide one.
  explicit Model(const ModelView& v, int max_seq = 0);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const { return v_.config; }
  int max_seq() const { return max_seq_; }

  // nullptr restores the dense FFN. The provider must outlive its use.
  void set_ffn(FfnProvider* ffn) { ffn_ = ffn ? ffn : dense_.get(); }
  void set_observer(FfnObserver* obs) { observer_ = obs; }

  // One token at position `pos` (0 <= pos < max_seq; positions before it must be in the KV cache).
  // Returns the logits [vocab], valid until the next call.
  const float* forward_token(int token, int pos);

  // `n` tokens at positions pos0 .. pos0+n-1 in one pass (matrix-matrix products, causal attention).
  // Writes logits [n][vocab] into `logits` when it is non-null (profiling passes null and skips the classifier).
  // Arithmetic per token is identical to forward_token(), so both paths give the same numbers.
  void forward_sequence(const int* tokens, int n, int pos0, float* logits);

  // A prompt's `n` tokens in one pass as forward_sequence, with the classifier run for the last token only: returns
  // its logits [vocab] (valid until the next call), the numbers forward_token() would give it.
  const float* forward_prompt(const int* tokens, int n, int pos0);

  // Allocates and touches the scratch of passes of up to `n` tokens (and the FFN provider's), so a timed pass pays
  // no page faults for it; numbers are unchanged.
  void reserve(int n);

 private:
  ModelView v_;
  int max_seq_ = 0;
  std::unique_ptr<DenseFfn> dense_;  // only over f32 ModelWeights with FFN matrices
  FfnProvider* ffn_ = nullptr;
  FfnObserver* observer_ = nullptr;
  std::vector<float> att_;                      // attention scores, one row per OpenMP thread
  std::vector<float> key_cache_, value_cache_;  // [layer][max_seq][kv_dim]
  std::vector<float> x_, xb_, q_, k_, vv_, att_out_, tmp_, logits_;
  std::vector<float> rope_cos_, rope_sin_;  // [max_seq][head_dim/2]
  std::unique_ptr<kernels::PreparedX> xq_;  // quantized activations of a pass (q / k / v share one, wo another)

  void init(int max_seq);
  void ensure_scratch(int n);
  void pass(const int* tokens, int n, int pos0, float* logits, bool last_only);
  void check_token(int token) const;
};

// Low-level kernels shared by the model and the sparse runtime (runtime/model/kernels.cpp).
namespace kernels {
// y[t][o] = sum_i x[t][i] * w[o][i] for t < n, o < out. Same summation order for every n (bitwise stable).
void matmul(float* y, const float* x, const float* w, int n, int in, int out);
// As matmul, but every product (exact) and sum in double, rounded to fp32 once. Reordering the `in` dimension then
// changes y only when the double sums straddle an fp32 rounding boundary (rarely, by one ulp), instead of by
// fp32 rounding at every step: the dense FFN's down projection uses it, so permuting a layer's neurons (a layout)
// leaves the forward pass unchanged in practice.
void matmul_acc64(float* y, const float* x, const float* w, int n, int in, int out);
// matmul_acc64 without the x86 AVX2+FMA path (what other CPUs run); bitwise equal to it (tests check).
void matmul_acc64_portable(float* y, const float* x, const float* w, int n, int in, int out);
// Dot product with the fixed summation order matmul uses.
float dot(const float* a, const float* b, int n);
// out[i] = x[i] / rms(x) * g[i].
void rmsnorm(float* out, const float* x, const float* g, int n, float eps);
// LayerNorm (OPT): out[i] = (x[i] - mean) / sqrt(var + eps) * g[i] + b[i], var the biased variance.
void layernorm(float* out, const float* x, const float* g, const float* b, int n, float eps);
void softmax(float* x, int n);
// One query's attention over n_pos cached positions (keys k and values v, row p at p * stride): att[p] =
// dot(q, k[p], hd) * scale, softmax(att), o = sum_p att[p] * v[p] accumulated position by position from zero.
// `att` holds n_pos floats of scratch.
void attend(float* o, const float* q, const float* k, const float* v, size_t stride, int n_pos, int hd, float scale,
            float* att);
}  // namespace kernels

}  // namespace nl
