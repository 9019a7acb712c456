#include "runtime/plan/read_plan.h"

#include <cmath>
#include <cstdlib>

#include "formats/core/error.h"
#include "runtime/plan/slot_cache.h"

namespace nl {

GapPolicy GapPolicy::parse(const std::string& text) {
  GapPolicy g;
  if (text == "off") {
    g.mode = GapMode::Off;
    return g;
  }
  if (text == "auto" || text == "auto-keep-runs") {
    g.mode = GapMode::Auto;
    g.resident_gaps = text == "auto";
    return g;
  }
  char* end = nullptr;
  long v = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || v < 0 || v > (1 << 24))
    throw UsageError("gap must be off, auto, auto-keep-runs or a number of bundles >= 0, got '" + text + "'");
  g.mode = v == 0 ? GapMode::Off : GapMode::Fixed;
  g.bundles = static_cast<uint32_t>(v);
  return g;
}

std::string GapPolicy::to_string() const {
  switch (mode) {
    case GapMode::Off:
      return "off";
    case GapMode::Auto:
      return resident_gaps ? "auto" : "auto-keep-runs";
    case GapMode::Fixed:
      return std::to_string(bundles);
  }
  return "?";
}

void TokenPlan::clear() {
  reads.clear();
  hits.clear();
  active = needed = cached_in_reads = ops = 0;
  bytes_read = bundles_read = 0;
  planner = nullptr;
}

double TokenPlan::io_seconds(const CostFit& cost) const {
  return double(ops) * cost.read_latency_us * 1e-6 + double(bytes_read) / (cost.bandwidth_MBps * 1e6);
}

uint32_t auto_gap_bundles(const CostFit& cost, uint64_t bundle_bytes) {
  if (bundle_bytes == 0) return 0;
  double be = cost.break_even_bytes();
  // g * bundle_bytes < a*B, strictly: the largest such g.
  double g = std::ceil(be / double(bundle_bytes)) - 1.0;
  return g <= 0 ? 0u : static_cast<uint32_t>(std::min(g, double(1u << 24)));
}

ReadPlanner::ReadPlanner(const PlannerConfig& cfg) : cfg_(cfg) {
  if (cfg_.bundle_bytes == 0) throw UsageError("read planner: bundle size must be positive");
  if (cfg_.block_bytes == 0 || (cfg_.block_bytes & (cfg_.block_bytes - 1)))
    throw UsageError("read planner: block size must be a power of two");
  if (cfg_.max_read_bytes && cfg_.max_read_bytes < cfg_.bundle_bytes + 2 * uint64_t(cfg_.block_bytes))
    throw UsageError("read planner: a read limit of " + std::to_string(cfg_.max_read_bytes) +
                     " bytes does not hold one bundle of " + std::to_string(cfg_.bundle_bytes) +
                     " bytes and its two partial blocks");
  merge_below_bytes_ = cfg_.cost.break_even_bytes();
}

uint32_t ReadPlanner::merge_gap_bundles() const {
  switch (cfg_.gap.mode) {
    case GapMode::Off:
      return 0;
    case GapMode::Fixed:
      return cfg_.gap.bundles;
    case GapMode::Auto:
      return auto_gap_bundles(cfg_.cost, cfg_.bundle_bytes);
  }
  return 0;
}

uint64_t ReadPlanner::aligned_begin(uint32_t slot) const {
  uint64_t b = cfg_.region_offset + uint64_t(slot) * cfg_.bundle_bytes;
  return b & ~uint64_t(cfg_.block_bytes - 1);
}

uint64_t ReadPlanner::aligned_end(uint32_t slot_end) const {
  uint64_t e = cfg_.region_offset + uint64_t(slot_end) * cfg_.bundle_bytes;
  return (e + cfg_.block_bytes - 1) & ~uint64_t(cfg_.block_bytes - 1);
}

inline bool ReadPlanner::should_merge(uint32_t prev_end, uint32_t next_begin) const {
  switch (cfg_.gap.mode) {
    case GapMode::Off:
      return false;
    case GapMode::Fixed:
      return next_begin - prev_end <= cfg_.gap.bundles;
    case GapMode::Auto: {
      // Bytes the merged read transfers beyond the two separate aligned reads (negative: they share a block).
      double extra = double(aligned_begin(next_begin)) - double(aligned_end(prev_end));
      return extra < merge_below_bytes_;
    }
  }
  return false;
}

bool ReadPlanner::merges(uint32_t prev_end, uint32_t next_begin) const {
  return next_begin <= prev_end || should_merge(prev_end, next_begin);
}

void ReadPlanner::plan(const uint32_t* active, size_t n, SlotCache* cache, TokenPlan& out) const {
  out.clear();
  out.active = static_cast<uint32_t>(n);
  out.planner = this;
  for (size_t i = 0; i < n; ++i)
    if (active[i] >= cfg_.n_slots || (i && active[i] <= active[i - 1]))
      throw InternalError("read planner: active slots must be ascending, unique and < " + std::to_string(cfg_.n_slots));
  auto is_res = [&](uint32_t s) { return cache && cache->resident(s); };
  // Slots [sb, se) need reading: merged into the previous read when the gap policy says so, else a new read.
  auto add_read = [&](uint32_t sb, uint32_t se) {
    if (!out.reads.empty() && should_merge(out.reads.back().slot_end, sb))
      out.reads.back().slot_end = se;
    else
      out.reads.push_back(ReadOp{sb, se, 0, 0, 0});
  };

  if (cfg_.gap.mode == GapMode::Auto && cfg_.gap.resident_gaps && cache) {
    // Cost-based: a resident slot is not needed, so resident slots inside a run are a gap like inactive ones, and
    // the run is split around them exactly when skipping their bytes saves more than the extra read costs.
    // Classified in the same pass: every non-resident active slot is in a read; the resident ones met since the
    // last read's end are hits unless the next read is merged over them (then they are read anyway).
    size_t pending = 0;  // out.hits[pending..] lie after the last read's end
    size_t i = 0;
    while (i < n) {
      if (cache->resident(active[i])) {
        out.hits.push_back(active[i]);
        ++i;
        continue;
      }
      size_t j = i + 1;
      while (j < n && active[j] == active[j - 1] + 1 && !cache->resident(active[j])) ++j;
      const uint32_t sb = active[i], se = active[j - 1] + 1;
      if (!out.reads.empty() && should_merge(out.reads.back().slot_end, sb)) {
        out.cached_in_reads += uint32_t(out.hits.size() - pending);
        out.hits.resize(pending);
        out.reads.back().slot_end = se;
        out.reads.back().needed += se - sb;
      } else {
        out.reads.push_back(ReadOp{sb, se, se - sb, 0, 0});
      }
      out.needed += se - sb;
      pending = out.hits.size();
      i = j;
    }
  } else {
    // Maximal runs; resident slots at either end of a run are trimmed off (served from DRAM), resident slots
    // inside stay in the read so that a lookup never splits one read into two.
    size_t i = 0;
    while (i < n) {
      size_t j = i + 1;
      while (j < n && active[j] == active[j - 1] + 1) ++j;
      size_t b = i, e = j;  // [b, e) indices into active
      while (b < e && is_res(active[b])) ++b;
      while (e > b && is_res(active[e - 1])) --e;
      if (b < e) add_read(active[b], active[e - 1] + 1);
      i = j;
    }
    // Classify every active slot against the final reads (merging can swallow trimmed hits into a gap).
    size_t r = 0;
    for (size_t k = 0; k < n; ++k) {
      uint32_t s = active[k];
      while (r < out.reads.size() && out.reads[r].slot_end <= s) ++r;
      bool inside = r < out.reads.size() && out.reads[r].slot_begin <= s;
      if (!inside) {
        out.hits.push_back(s);
      } else if (is_res(s)) {
        ++out.cached_in_reads;
      } else {
        ++out.reads[r].needed;
        ++out.needed;
      }
    }
  }
  for (ReadOp& op : out.reads) {
    op.offset = aligned_begin(op.slot_begin);
    op.length = aligned_end(op.slot_end) - op.offset;
    for_each_piece(op, [&](uint32_t, uint32_t, uint64_t, uint64_t length) {
      ++out.ops;
      out.bytes_read += length;
    });
    out.bundles_read += op.bundles();
  }
  if (cache) cache->update(active, n, out);
}

}  // namespace nl
