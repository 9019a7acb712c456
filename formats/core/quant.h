// GGUF-compatible block quantization (Q8_0, Q4_0): block layouts, row sizes, and the reference quantizers and
// dequantizers. Byte for byte the layouts of ggml's block_q8_0 / block_q4_0, and the same rounding as ggml's
// quantize_row_q8_0_ref / quantize_row_q4_0_ref, so a row we write is the row llama.cpp would write and a GGUF
// tensor can be copied from our bytes. Header-only apart from the row loops in quant.cpp; the packer, the runtime
// kernels and the tests all use this one definition.
#pragma once
#include <cstddef>
#include <cstdint>

namespace nl {

inline constexpr int kQuantBlock = 32;  // weights per block, both formats (ggml QK8_0 = QK4_0 = 32)

// One f16 scale d, then 32 signed 8-bit weights: w[j] = d * qs[j].
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[kQuantBlock];
};
// One f16 scale d, then 16 bytes of 4-bit weights: byte j holds weight j (low nibble) and weight j + 16
// (high nibble), each stored + 8: w[j] = d * ((qs[j] & 15) - 8), w[j + 16] = d * ((qs[j] >> 4) - 8).
struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[kQuantBlock / 2];
};
static_assert(sizeof(BlockQ8_0) == 34, "ggml block_q8_0 layout");
static_assert(sizeof(BlockQ4_0) == 18, "ggml block_q4_0 layout");

// Bytes of one quantized row of n weights (n must be a multiple of kQuantBlock).
inline constexpr size_t q8_0_row_bytes(size_t n) { return n / kQuantBlock * sizeof(BlockQ8_0); }
inline constexpr size_t q4_0_row_bytes(size_t n) { return n / kQuantBlock * sizeof(BlockQ4_0); }

// n % kQuantBlock == 0 (callers check and report; these assume it).
void quantize_row_q8_0(const float* x, BlockQ8_0* y, size_t n);
void quantize_row_q4_0(const float* x, BlockQ4_0* y, size_t n);
void dequantize_row_q8_0(const BlockQ8_0* x, float* y, size_t n);
void dequantize_row_q4_0(const BlockQ4_0* x, float* y, size_t n);

}  // namespace nl
