// Typed views of a model's weights: a matrix is (dtype, bytes, rows, cols, row stride), so the forward pass reads
// f32, f16, bf16, q8_0 or q4_0 weights where they lie (an image's dense region in DRAM, a bundle's gate rows) with no
// f32 copy. view_of(ModelWeights) is the f32 view the profiler and the model readers use (no copy either).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "formats/core/image.h"
#include "formats/core/model_weights.h"

namespace nl {

// Row-major [rows][cols] in `dtype`, each row quantized along cols (GGUF's convention); row r starts at
// data + r * row_stride.
struct WeightView {
  ImageDtype dtype = ImageDtype::kF32;
  const uint8_t* data = nullptr;
  int rows = 0, cols = 0;
  size_t row_stride = 0;  // bytes
  // q8_0 rows stored interleaved by 8 blocks (kernels::q8_interleave: dense weights in DRAM, where the active kernel
  // path has a kernel for it); the numbers any kernel computes from it are the plain layout's, bit for bit.
  bool q8_x8 = false;

  const uint8_t* row(int r) const { return data + size_t(r) * row_stride; }
  bool empty() const { return data == nullptr; }
  static WeightView f32(const float* p, int rows, int cols) {
    return {ImageDtype::kF32, reinterpret_cast<const uint8_t*>(p), rows, cols, size_t(cols) * sizeof(float), false};
  }
};

struct LayerView {
  const float* rms_att = nullptr;  // [dim], always f32
  WeightView wq, wk, wv, wo;
  const float* rms_ffn = nullptr;  // [dim]
  // OPT (ModelConfig::has_biases; null otherwise), f32: the norms' biases, the attention biases, fc1's bias
  // ([hidden], neuron order) and fc2's.
  const float *att_norm_b = nullptr, *ffn_norm_b = nullptr, *bq = nullptr, *bk = nullptr, *bv = nullptr, *bo = nullptr,
              *b_up = nullptr, *b_down = nullptr;
};

// What Model needs besides the FFN. Borrowed pointers: the owner (ModelWeights, a DenseStore) outlives the view.
struct ModelView {
  ModelConfig config;
  std::string source;
  WeightView tok_embeddings;  // [vocab][dim]
  std::vector<LayerView> layers;
  const float* rms_final = nullptr;
  WeightView classifier;                // [vocab][dim] (the embedding when the classifier is shared)
  WeightView pos_embeddings;            // OPT: [seq_len + kOptPositionOffset][dim]
  const float* final_norm_b = nullptr;  // OPT, Phi
  const float* cls_b = nullptr;         // Phi: the classifier's bias [vocab]
};

// Points `v`'s field for the dense vector `t` (rows 1: a norm weight, OPT's / Phi's biases; dense_tensor_specs says
// which a config has) at `p`. The one map from those vectors to the view, for view_of and the image's dense store.
void set_view_vector(ModelView& v, const DenseTensorSpec& t, const float* p);

// The f32 view of ModelWeights (sizes must already be checked: model_weights_problem).
ModelView view_of(const ModelWeights& w);
// Checks a view's shapes against its config; returns "" or what is wrong.
std::string model_view_problem(const ModelView& v);

}  // namespace nl
