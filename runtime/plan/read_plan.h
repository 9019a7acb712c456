// The read planner: one token's active slots of one FFN layer -> the reads to issue. Shared by nl-run (real
// reads) and nl-layout eval (simulated reads), so simulated and real read counts come from the same code.
//
// Steps: active slots (ascending positions in the layout) -> maximal runs of consecutive active slots ->
// cached slots at the ends of a run are served from DRAM (cache hits); cached slots inside a run are read with
// it under off and N (a lookup never fragments a run), and under auto they are a gap like inactive slots (the
// run is split around them when skipping their bytes costs less than one more read) -> runs are merged across
// small gaps (off | at most N bundles | auto from the device cost model) -> byte ranges aligned to the device
// block.
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/device.h"

namespace nl {

class SlotCache;
class ReadPlanner;

enum class GapMode : uint8_t {
  Off,    // never merge: one read per maximal run
  Fixed,  // merge two reads when at most `bundles` slots lie between them
  Auto,   // merge when the extra (block-aligned) bytes cost less than one more read: gap_bytes / B < a
};

struct GapPolicy {
  GapMode mode = GapMode::Auto;
  uint32_t bundles = 0;  // Fixed only
  // Auto only: resident (cached) slots inside a run are a gap like inactive slots, so the cost model decides
  // whether to read through them or to split the run around them ("auto"). false ("auto-keep-runs"): the paper's
  // rule, a cache lookup never splits a run (resident slots are trimmed off run ends only). Off and Fixed always
  // keep runs whole.
  bool resident_gaps = true;
  // "off", "auto", "auto-keep-runs" or a non-negative integer N (0 is the same as off). UsageError otherwise.
  static GapPolicy parse(const std::string& text);
  std::string to_string() const;
};

struct PlannerConfig {
  uint32_t n_slots = 0;         // neurons (bundles) in the layer
  uint64_t bundle_bytes = 0;    // bytes of one neuron bundle on flash
  uint64_t region_offset = 0;   // byte offset of slot 0 in the image (the layer region's start)
  uint32_t block_bytes = 4096;  // reads start and end on multiples of this (power of two)
  GapPolicy gap;
  CostFit cost;  // device cost model, used by GapMode::Auto
  // A read longer than this is issued as several device reads ("pieces") of whole bundles that each fit: the
  // runtime's staging holds one piece (memory.h ffn_batch_staging_bytes). 0: no limit.
  uint64_t max_read_bytes = 0;
};

// One read: slots [slot_begin, slot_end) and the block-aligned byte range that covers them.
struct ReadOp {
  uint32_t slot_begin = 0, slot_end = 0;
  uint32_t needed = 0;  // slots inside that are active and not served by the cache
  uint64_t offset = 0;  // aligned byte offset in the image
  uint64_t length = 0;  // aligned byte length
  uint32_t bundles() const { return slot_end - slot_begin; }
};

// What one token needs from one layer. Reused across calls (plan() clears it) to avoid allocations.
struct TokenPlan {
  std::vector<ReadOp> reads;             // ascending, non-overlapping in slots
  std::vector<uint32_t> hits;            // active slots served from the cache (inside no read), ascending
  uint32_t active = 0;                   // active slots this token
  uint32_t needed = 0;                   // active slots read from flash (= active - hits - cached_in_reads)
  uint32_t cached_in_reads = 0;          // active slots resident in the cache but read anyway (inside a read)
  uint32_t ops = 0;                      // device reads: each read, or its pieces when longer than max_read_bytes
  uint64_t bytes_read = 0;               // sum of aligned piece lengths (what the device transfers)
  uint64_t bundles_read = 0;             // sum of slot spans of the reads (unaligned)
  const ReadPlanner* planner = nullptr;  // the planner that made it (the value cache asks it what merges)

  void clear();
  // Estimated I/O seconds for this plan: ops * a + bytes / B (a and B at the device's queue depth).
  double io_seconds(const CostFit& cost) const;
};

// Plans reads for one layer. Holds only the configuration: thread-compatible (one planner per thread, or
// const use from many threads). The cache, when given, is consulted and then updated with this token.
class ReadPlanner {
 public:
  explicit ReadPlanner(const PlannerConfig& cfg);
  const PlannerConfig& config() const { return cfg_; }

  // active: ascending, unique slots < n_slots (InternalError otherwise). cache: may be null.
  void plan(const uint32_t* active, size_t n, SlotCache* cache, TokenPlan& out) const;
  void plan(const std::vector<uint32_t>& active, SlotCache* cache, TokenPlan& out) const {
    plan(active.data(), active.size(), cache, out);
  }
  // Largest gap (in slots) the policy would merge, ignoring block alignment; for reports and solvers.
  uint32_t merge_gap_bundles() const;
  // Whether a read ending at slot prev_end (exclusive) and one starting at next_begin > prev_end - 1 would be one
  // read under this policy (adjacent slots always are).
  bool merges(uint32_t prev_end, uint32_t next_begin) const;
  // The device reads that issue r: r itself, or, when it is longer than max_read_bytes, pieces of whole bundles
  // (each within max_read_bytes, block-aligned, clipped to r). fn(slot_begin, slot_end, offset, length) per piece,
  // in slot order. nl-run reads these and eval counts them, from this one function.
  template <class F>
  void for_each_piece(const ReadOp& r, F&& fn) const {
    const uint64_t cap = cfg_.max_read_bytes;
    if (cap == 0 || r.length <= cap) {
      fn(r.slot_begin, r.slot_end, r.offset, r.length);
      return;
    }
    // n bundles span at most n * bundle_bytes plus a partial block at each end; the constructor checked that cap
    // holds one bundle so.
    const uint64_t per = (cap - 2 * uint64_t(cfg_.block_bytes)) / cfg_.bundle_bytes;
    for (uint64_t s0 = r.slot_begin; s0 < r.slot_end; s0 += per) {
      const uint32_t s1 = uint32_t(std::min<uint64_t>(r.slot_end, s0 + per));
      const uint64_t lo = std::max(r.offset, aligned_begin(uint32_t(s0)));
      const uint64_t hi = std::min(r.offset + r.length, aligned_end(s1));
      fn(uint32_t(s0), s1, lo, hi - lo);
    }
  }

 private:
  PlannerConfig cfg_;
  double merge_below_bytes_ = 0;  // Auto: merge while aligned gap bytes < this (a * B)
  bool should_merge(uint32_t prev_end, uint32_t next_begin) const;
  uint64_t aligned_begin(uint32_t slot) const;
  uint64_t aligned_end(uint32_t slot_end) const;
};

// Largest gap g (in bundles) with g * bundle_bytes / B < a: what --gap auto merges when bundles fill blocks.
uint32_t auto_gap_bundles(const CostFit& cost, uint64_t bundle_bytes);

}  // namespace nl
