// The FFN of `nl-run --select dense`: one layer's bundles ([gate row | up row | down column] per neuron, as the
// image stores them) re-laid out once at load into a contiguous gate matrix, a contiguous up matrix and the down
// columns blocked by output chunk ([chunk][neuron][the chunk's outputs]), so every pass streams memory sequentially
// (the hardware prefetchers do not follow 1/3-bundle runs at a bundle stride) and each thread's share of the down
// projection is one contiguous range. Same bytes, same kernels (runtime/model/typed_kernels.h), same summation
// order as the gated path: h_i = act(gate_i . x) * (up_i . x) and out[o] = the sum over neurons in slot order of
// h_i * down_i[o], each output summed by one thread, so tokens equal --select gate's for any thread count.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "formats/core/model_weights.h"
#include "runtime/io/file.h"
#include "runtime/model/typed_kernels.h"

namespace nl::kernels {

class DenseBundles {
 public:
  // `bundles`: `hidden` bundles of dtype dt, `bundle_bytes` apart (copied; the caller may free them). The copy goes
  // to `storage` (bytes_for(dt, dim, hidden) bytes, 64-byte aligned, kept by the caller while this lives) or, when
  // null, to a buffer of its own.
  // Plain bundles (kind kPlain, OPT: [up row | down column]): h_i = relu(up_i . x + bias[i]), `bias` one per bundle
  // (copied; null: none); gate() then holds the up rows and up() is empty.
  DenseBundles(ImageDtype dt, int dim, int hidden, const uint8_t* bundles, size_t bundle_bytes,
               uint8_t* storage = nullptr, BundleKind kind = BundleKind::kGated, const float* bias = nullptr);
  static size_t bytes_for(ImageDtype dt, int dim, int hidden, BundleKind kind = BundleKind::kGated) {
    return size_t(bundle_parts(kind)) * size_t(hidden) * image_row_bytes(dt, size_t(dim));
  }

  // The gate rows as a matrix ([hidden][dim]).
  WeightView gate() const { return {dt_, data_, hidden_, dim_, rb_, x8_}; }
  WeightView up() const {
    return plain() ? WeightView{} : WeightView{dt_, data_ + size_t(hidden_) * rb_, hidden_, dim_, rb_, x8_};
  }

  // out [n][dim] = the gated FFN of x [n][dim] (f32, normalised) with c's activation (model_weights.h), for n
  // tokens at once (each token's numbers are those of the same token alone).
  void ffn(const float* x, int n, const ModelConfig& c, float* out);
  // Sizes and touches the calling thread's scratch (shared by every layer) for passes of up to n tokens.
  void reserve(int n) const;

  size_t bytes() const { return bytes_for(dt_, dim_, hidden_, kind_); }
  bool plain() const { return kind_ == BundleKind::kPlain; }

 private:
  ImageDtype dt_;
  int dim_, hidden_;
  BundleKind kind_;
  std::vector<float> bias_;  // plain: one per neuron (empty: none)
  size_t rb_;                // bytes of one gate / up row (= one whole down column)
  bool x8_ = false;          // gate and up rows interleaved (q8_interleave)
  AlignedBuffer own_;        // the storage when the caller gives none
  uint8_t* data_ = nullptr;  // gate rows, up rows, then the down chunks: bytes() (every byte copied in: not zeroed)
  int chunk_ = 0;            // outputs per down chunk (the last one may have fewer)
  std::vector<size_t> chunk_off_;  // per down chunk: its offset in data_ ([hidden][its outputs' bytes])
  std::vector<size_t> chunk_cb_;   // per down chunk: bytes of one neuron's slice
};

}  // namespace nl::kernels
