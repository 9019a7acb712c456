// Reference Q8_0 / Q4_0 quantizers and dequantizers, written as ggml's *_ref functions compute them.
#include "formats/core/quant.h"

#include <algorithm>
#include <cmath>

#include "formats/core/half.h"

namespace nl {

void quantize_row_q8_0(const float* x, BlockQ8_0* y, size_t n) {
  for (size_t b = 0; b < n / kQuantBlock; ++b, x += kQuantBlock) {
    float amax = 0.0f;
    for (int j = 0; j < kQuantBlock; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[b].d = f32_to_f16(d);
    if (amax * id <= 128.0f) {
      // Every |x_j * id| <= 128 (rounding is monotonic): roundf's half-away-from-zero rounding in integer steps,
      // equal to it on every such float (checked on all of them) and vectorizable (roundf is a library call).
      for (int j = 0; j < kQuantBlock; ++j) {
        const float v = x[j] * id;
        int q = int(v);
        const float r = v - float(q);  // exact
        q += int(r >= 0.5f) - int(r <= -0.5f);
        y[b].qs[j] = int8_t(q);
      }
    } else {
      for (int j = 0; j < kQuantBlock; ++j) y[b].qs[j] = int8_t(std::roundf(x[j] * id));
    }
  }
}

void quantize_row_q4_0(const float* x, BlockQ4_0* y, size_t n) {
  for (size_t b = 0; b < n / kQuantBlock; ++b, x += kQuantBlock) {
    float amax = 0.0f, max = 0.0f;  // the value of largest magnitude, with its sign
    for (int j = 0; j < kQuantBlock; ++j)
      if (amax < std::fabs(x[j])) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    const float d = max / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[b].d = f32_to_f16(d);
    for (int j = 0; j < kQuantBlock / 2; ++j) {
      const uint8_t lo = uint8_t(std::min(15, int(int8_t(x[j] * id + 8.5f))));
      const uint8_t hi = uint8_t(std::min(15, int(int8_t(x[j + kQuantBlock / 2] * id + 8.5f))));
      y[b].qs[j] = uint8_t(lo | (hi << 4));
    }
  }
}

void dequantize_row_q8_0(const BlockQ8_0* x, float* y, size_t n) {
  for (size_t b = 0; b < n / kQuantBlock; ++b, y += kQuantBlock) {
    const float d = f16_to_f32(x[b].d);
    for (int j = 0; j < kQuantBlock; ++j) y[j] = float(x[b].qs[j]) * d;
  }
}

void dequantize_row_q4_0(const BlockQ4_0* x, float* y, size_t n) {
  for (size_t b = 0; b < n / kQuantBlock; ++b, y += kQuantBlock) {
    const float d = f16_to_f32(x[b].d);
    for (int j = 0; j < kQuantBlock / 2; ++j) {
      y[j] = float(int(x[b].qs[j] & 15) - 8) * d;
      y[j + kQuantBlock / 2] = float(int(x[b].qs[j] >> 4) - 8) * d;
    }
  }
}

}  // namespace nl
