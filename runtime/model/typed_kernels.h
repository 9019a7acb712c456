// Kernels over typed weights (runtime/model/weights_view.h): row dot products, matrix-vector / matrix-matrix
// products and the sparse FFN's down-projection accumulation, for f32, f16, bf16, q8_0 and q4_0 weights, with a
// portable C++ reference and x86 AVX2 (+F16C), AVX-VNNI, AVX-512 (+VNNI) and aarch64 NEON (+dotprod) paths
// chosen at run time.
//
// Determinism: every kernel has one canonical summation order that each ISA path reproduces bit for bit (this code is
// built with -ffp-contract=off, so a fused multiply-add happens only where written out):
// - f32 rows: kernels::dot's order (8 lanes, element i into lane i % 8, reduce8 tree, then the scalar tail), products
//   and sums rounded separately.
// - f16 / bf16 rows (exactly widened to f32): 32 lanes, element i of the first 32*floor(n/32) into lane i % 32, each
//   step one fused multiply-add (lane = fma(w, x, lane): one rounding, std::fma in the portable path, the FMA
//   instructions in the others); the lanes are folded as ((l0-7 + l8-15) + (l16-23 + l24-31)) lane-wise, then
//   reduce8, then the scalar tail (also fused: tail = fma(w, x, tail)). Fused because the f16 prefill tile is bound
//   by its vector operations (one instruction instead of a multiply and an add: 1.24x the 187M f16 prefill here).
// - q8_0 / q4_0 rows against activations quantized to q8_0 (quantize_row_q8_0, one rounding rule everywhere): per
//   block an exact int32 dot, v_b = float(isum_b) * (d_w * d_x); block b of the first 8*floor(nb/8) into lane b % 8,
//   reduce8, then the remaining blocks summed in order.
// - down accumulation: out[o] = sum over the listed neurons, in list order, of h_i * w_i[o] (quantized:
//   (h_i * d_block) * q; f16 / bf16: out[o] = fma(h_i, w_i[o], out[o])); each output is its own sum, so any split of
//   the outputs over threads gives the same bits.
// Thread count never changes a result: matrix products split over output rows, each computed by one thread.
// Token tiles (prefill: matmul with n > 1, down_tokens) share weight loads between tokens and reorder only the loops:
// every (row, token) output gets the one-token path's operations in its order.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "formats/core/quant.h"
#include "runtime/model/weights_view.h"

namespace nl::kernels {

// Weight bytes a pass reads (rows x row bytes x tokens) from which a matrix product, a loop of row dots or a down
// projection splits over threads; below it, it stays on the calling thread (no region: runtime/parallel.h). A
// shape-only rule, so the thread count never decides anything but speed. In bytes, not multiply-adds, because the
// time a pass takes (against a region's fixed cost, ~3.3 us at 2 threads on an Intel development host) follows its
// bytes: small-relu (dim 384) at 2 threads, alternated runs, 256 KiB against the former 32 Ki multiply-adds there:
// dense q8_0 0.838 -> 0.619 ms/token, f16 0.997 -> 0.869, f32 1.367 -> 1.329. On an AMD EPYC (Zen 4) host 128 KiB
// against 256 KiB (7 alternated runs): dense q8_0 0.729 -> 0.663, f16 1.212 -> 1.145, f32 1.881 -> 1.838; the
// budget path within noise (f32 1.743 -> 1.669, q8_0 0.675 -> 0.654, f16 1.096 -> 1.115). At 128 KiB small-relu's
// q8_0 Q and O (157 KB) split, its K and V (52 KB) do not.
// Shared by the typed kernels and the dense FFN passes.
constexpr long kParallelBytes = 128L << 10;
// Rows per multi-row dot (matmul, row_dots): independent accumulator chains, x loaded once.
constexpr int kRowBlock = 4;

enum class Isa { kPortable, kAvx2, kAvxVnni, kAvx512, kNeon, kNeonDot };
const char* isa_name(Isa isa);
// The paths this CPU can run, the portable one first.
std::vector<Isa> available_isas();
// The path in use (the best available unless set_isa chose another).
Isa active_isa();
// Tests and benchmarks: run `isa` from now on (must be available). Not thread-safe against running kernels.
void set_isa(Isa isa);

// Activations prepared for a weight dtype: f32 as given, or one q8_0 row per token for q8_0 / q4_0 weights (with
// each block's integer sum, which the VNNI paths need).
// Reused buffers: prepare once per input, then dot many rows.
class PreparedX {
 public:
  void prepare(ImageDtype w_dtype, const float* x, int n, int cols);
  // Token t's row in the form row_dot wants.
  const void* row(int t) const;
  // Token t's q8_0 record interleaved by 8 blocks (q8_interleave's layout, then the per-block sums, scales as f32 and
  // sums times -128), for rows stored that way; only for q8_0 weights of at least 256 columns.
  const void* row_x8(int t) const;
  // Bytes from token t's row (row or row_x8) to token t + 1's.
  size_t row_bytes() const;
  size_t row_x8_bytes() const { return rec8_; }
  ImageDtype dtype() const { return dtype_; }

 private:
  ImageDtype dtype_ = ImageDtype::kF32;
  const float* x_ = nullptr;
  int cols_ = 0;
  size_t rec_ = 0;            // bytes per token's quantized record (blocks, then per-block sums)
  size_t rec8_ = 0;           // bytes per token's interleaved record (row_x8: rec_'s bytes, then per-block f32 scales
                              // and sums times -128, for the token-tiled kernels)
  std::vector<uint32_t> q_;   // the records (uint32_t: 4-byte aligned sums)
  std::vector<uint32_t> q8_;  // the interleaved records (row_x8), same size
};

// Interleaved q8_0 ("x8"): each group of 8 blocks of a row (272 bytes) becomes its 8 f16 scales (16 bytes), then 8
// steps of 32 bytes, step s holding quants 4s..4s+3 of blocks 0..7 in turn. The same bytes, so the same size; a
// SIMD dot then accumulates each block's exact integer sum in its own lane (no per-block horizontal sum). Only
// rows of at least 8 blocks: the last (blocks % 8) stay plain after the groups (a 384-column row: one group, then 4
// plain blocks); the embedding table (dequantize_row) is never interleaved.
// Whether the active path has an interleaved kernel (the loader interleaves only then; any path computes it).
bool q8_interleave_pays();
// Whether `w` can be interleaved: q8_0, at least 256 columns, rows packed at their own size, not yet interleaved.
bool q8_interleavable(const WeightView& w);
// Interleaves w's rows in place (w.data must be writable: the caller owns the bytes) and sets w->q8_x8.
void q8_interleave(WeightView* w);
// q8_interleave when the active path has an interleaved kernel and `w` can be interleaved (the loaders' rule for
// matrices only matrix products read, whose bytes they own); whether it did.
bool q8_interleave_if_pays(WeightView* w);

// One weight row (`n` = cols, a multiple of 32 for q8_0 / q4_0) against one prepared activation row (x =
// PreparedX::row(t), nothing else).
float row_dot(ImageDtype dt, const uint8_t* w, const void* x, int n);
// Rows at listed addresses (bundles scattered in the neuron cache) against one prepared activation row:
// y[i] = row_dot(dt, w[i], x, cols) for i < n, bit for bit; a few rows at a time share each activation load and
// overlap their add chains.
void row_dots(ImageDtype dt, const uint8_t* const* w, int n, const void* x, int cols, float* y);
// y[t][o] = row_dot(w.row(o), x_t) for t < n, o < w.rows; x [n][w.cols] f32. Same numbers for any n, any thread count.
void matmul(float* y, const float* x, const WeightView& w, int n);
void matmul(float* y, const PreparedX& x, const WeightView& w, int n);
// Row r of w widened to f32 (embedding lookups).
void dequantize_row(const WeightView& w, int r, float* out);

// out[o] for o in [o0, o1) = sum over i < n_active (in that order) of h[i] * col_i[o], where col_i = cols[i] is a
// down-projection column of `dim` weights in dtype `dt` (quantized in blocks of 32 along dim: o0 and o1 multiples
// of 32, or o1 = dim). Overwrites out[o0..o1), or with `accumulate` continues its sums: a list split into pieces,
// projected piece by piece in order, gives the same bits as the whole list at once.
void down_accum(ImageDtype dt, float* out, int o0, int o1, const float* h, const uint8_t* const* cols, int n_active,
                bool accumulate = false);
// down_accum over all `dim` outputs, split over threads in blocks of 32 outputs.
void down_project(ImageDtype dt, float* out, int dim, const float* h, const uint8_t* const* cols, int n_active,
                  bool accumulate = false);

// The down coefficients of n tokens (h [n][hidden], row t at h + t * h_stride), prepared once for down_tokens and
// shared by every output range of a pass: token t sums the neurons with h != 0, in slot order.
constexpr int kDownTokenTile = 8;  // tokens per down tile (each weight block widened once for all of them)
class DownCoeffs {
 public:
  void prepare(const float* h, size_t h_stride, int hidden, int n);
  int tokens() const { return n_; }
  int hidden() const { return hidden_; }
  int count(int t) const { return count_[size_t(t)]; }  // neurons token t sums
  const float* tile_h(int tile) const { return th_.data() + size_t(tile) * size_t(hidden_) * kDownTokenTile; }
  const uint8_t* tile_mask(int tile) const { return mask_.data() + size_t(tile) * size_t(hidden_); }
  const uint32_t* idx(int t) const { return idx_.data() + size_t(t) * size_t(hidden_); }
  const float* hk(int t) const { return hk_.data() + size_t(t) * size_t(hidden_); }

 private:
  int n_ = 0, hidden_ = 0;
  std::vector<float> th_;      // per tile of kDownTokenTile tokens: [hidden][kDownTokenTile], token-minor
  std::vector<uint8_t> mask_;  // per tile: [hidden], bit t = the tile's token t sums the neuron
  std::vector<uint32_t> idx_;  // [n][hidden]: each token's neurons in slot order (count(t) of them)
  std::vector<float> hk_;      // [n][hidden]: their h
  std::vector<int> count_;     // [n]
};

// The down projection of the prepared tokens over `hidden` neuron slices of `len` outputs each (down columns cut to
// one output range, slice s at base + s * slice_bytes; len a multiple of 32 for quantized dtypes, or the range's end):
// out[t * out_stride + o] (o < len) = down_accum over token t's list (overwriting). Several tokens share each weight
// block's load (kDownTokenTile per tile, on paths with a tile kernel).
void down_tokens(ImageDtype dt, float* out, size_t out_stride, int len, const DownCoeffs& h, const uint8_t* base,
                 size_t slice_bytes);

// The first phase of the gated FFN over bundles ([gate row | up row | down column], each image_row_bytes(dt, dim)
// bytes): h[i] = g_i * u_i for i < n, 0 where g_i is 0, with g_i = g[i] (kGiven) or the bundle's own gate row dotted
// with x through the gate activation (g unused): kRelu keeps v when v > floor (ReLU: floor 0; FATReLU: floor t), kSilu
// and kGelu give ffn_act_smooth (formats/core/model_weights.h); u_i = up_i . x, through max(., 0) when up_relu (dReLU).
// x = PreparedX::row(t). Rows go kRowBlock at a time through row_dots in chunks of kBundleChunk neurons: the same
// numbers as row_dot one neuron at a time.
enum class BundleGate { kGiven, kRelu, kSilu, kGelu };
struct BundleAct {
  BundleGate gate = BundleGate::kRelu;
  float floor = 0.0f;    // kRelu: the gate's zero threshold (ModelConfig::gate_floor)
  bool up_relu = false;  // dReLU: the up dot through max(., 0)
  // Plain bundles ([row | down column], OPT): h_i = the activation of row_i . x + bias[i] itself (no up row); kGiven:
  // h_i = g[i]. `bias`: one per listed bundle (null: none).
  bool plain = false;
  const float* bias = nullptr;
};
constexpr int kBundleChunk = 16;
void bundle_coefficients(ImageDtype dt, int dim, const void* x, const BundleAct& act, const float* g,
                         const uint8_t* const* bundles, int n, float* h);
// Requests the bytes bundle_coefficients reads first from `bundles` (the first kRowBlock bundles' up rows, with their
// gate rows unless kGiven): a caller that goes chunk by chunk names the next chunk's before computing this one.
void prefetch_bundles(ImageDtype dt, int dim, BundleGate gate, const uint8_t* const* bundles, int n);

// One token's gated FFN over bundles ([gate row | up row | down column], each image_row_bytes(dt, dim) bytes) of the
// listed neurons, in list order: h_i = g[i] * u_i; when g is null, g_i = the gate activation of act (kRelu with its
// floor) of the bundle's own gate row and neurons with h_i = 0 drop out; u_i as bundle_coefficients (act.up_relu).
// Plain bundles (act.plain: [row | down column]): h_i as bundle_coefficients gives it. out[dim] = sum_i h_i * down_i
// (down_project). The up dots run in parallel over neurons; every number is independent of the thread count.
void ffn_bundles(ImageDtype dt, int dim, const PreparedX& x, const float* g, const uint8_t* const* bundles, int n,
                 float* out, const BundleAct& act = {});

}  // namespace nl::kernels
