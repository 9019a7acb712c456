// What FlashFfn's implementation files (runtime/flash_ffn.cpp, runtime/ffn/*.cpp) share: the clock, the overlapped
// loader's tuning constants and the per-token counters swap of multi-token passes. Not part of the runtime's API.
#pragma once
#include <chrono>
#include <cstddef>
#include <utility>

#include "runtime/flash_ffn.h"

namespace nl::ffn_detail {

using Clock = std::chrono::steady_clock;
inline double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// --overlap layer: bundles a computing thread claims at a time.
constexpr size_t kClaimChunk = 8;
// --overlap layer: below this many multiply-adds (bundles x dim) a layer's bundles are computed on the waiting thread
// alone; a region whose workers idle through the I/O costs more than it saves on small layers.
constexpr long kOverlapParallelWork = 1L << 18;
// --overlap cross: reads ahead beyond what the layer's attention hides only when at least this share of the
// previous token's predicted slots were needed (a read-ahead beyond the window costs its unused share's device time).
// Measured (docs/runtime.md): real small-relu, about a third needed, cross went from 1.29x to 1.17x of none's time;
// synthetic Mistral-7B, 85-88 % needed, waited 3-5 % longer for reads when every layer was cut at the window.
constexpr double kReadAheadPrecision = 0.5;

// Token t of a multi-token pass accounts into its own counters: they stand in for the current token's meanwhile.
struct CountersSwap {
  FlashCounters* cur;
  FlashCounters* other;  // null: a one-token pass, nothing to swap
  CountersSwap(FlashCounters* c, FlashCounters* o) : cur(c), other(o) {
    if (other) std::swap(*cur, *other);
  }
  ~CountersSwap() {
    if (other) std::swap(*cur, *other);
  }
  CountersSwap(const CountersSwap&) = delete;
  CountersSwap& operator=(const CountersSwap&) = delete;
};

}  // namespace nl::ffn_detail
