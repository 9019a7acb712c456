#include "runtime/plan/slot_cache.h"

#include <algorithm>
#include <cmath>

#include "formats/core/error.h"
#include "formats/core/rng.h"
#include "runtime/plan/read_plan.h"

namespace nl {

uint32_t cache_capacity_for_ratio(double ratio, uint32_t n_slots) {
  if (!(ratio >= 0) || ratio > 1) throw UsageError("cache ratio must be in [0, 1]");
  return static_cast<uint32_t>(std::floor(ratio * double(n_slots) + 1e-9));
}

void cache_apply_policy(CacheConfig& cc, CacheAdmission admission, const std::vector<uint32_t>& pinned_slots,
                        double small_fraction, const std::vector<uint32_t>& hot_slots) {
  if (small_fraction != 0) {
    if (!(small_fraction > 0 && small_fraction < 1)) throw UsageError("cache: small_fraction must be in (0, 1)");
    cc.small_fraction = small_fraction;
  }
  switch (admission) {
    case CacheAdmission::kUnset:
      break;
    case CacheAdmission::kAll:
      cc.linking_aligned = false;
      break;
    case CacheAdmission::kLinkingAligned:
      cc.linking_aligned = true;
      break;
    case CacheAdmission::kIsolated:
      cc.linking_aligned = true;
      cc.run_admit_prob = 0;
      break;
    case CacheAdmission::kValue:
      cc.value = true;
      cc.hot = hot_slots;
      break;
  }
  cc.pinned.insert(cc.pinned.end(), pinned_slots.begin(), pinned_slots.end());
}

SlotCache::SlotCache(uint32_t n_slots, const CacheConfig& cfg)
    : cfg_(cfg),
      n_slots_(n_slots),
      state_(n_slots, kNone),
      freq_(n_slots, 0),
      ghost_stamp_(n_slots, 0),
      last_active_(cfg.window_tokens ? n_slots : 0, 0),
      rng_(cfg.seed ^ kSplitMixGamma) {
  if (!(cfg_.small_fraction > 0 && cfg_.small_fraction < 1))
    throw UsageError("cache: small_fraction must be in (0, 1)");
  if (!(cfg_.run_admit_prob >= 0 && cfg_.run_admit_prob <= 1))
    throw UsageError("cache: run_admit_prob must be in [0, 1]");
  cfg_.capacity = std::min(cfg_.capacity, n_slots);
  if (!cfg_.alias.empty() && cfg_.alias.size() != n_slots) throw UsageError("cache: alias size differs from the slots");
  for (uint32_t s : cfg_.alias)
    if (s >= n_slots) throw UsageError("cache: alias slot out of range");
  for (uint32_t s : cfg_.pinned) {
    if (s >= n_slots) throw UsageError("cache: pinned slot out of range");
    s = key(s);
    if (state_[s] == kPinned) continue;
    if (pinned_ >= cfg_.capacity) break;  // pinned beyond capacity are not held: capacity is a hard bound
    state_[s] = kPinned;
    ++pinned_;
  }
  // Every key fits: no admission can ever evict, so every miss is admitted (rejecting one only costs a later read;
  // a model whose FFN fits its cache reads each neuron once).
  uint32_t n_keys = n_slots;
  if (!cfg_.alias.empty()) {
    std::vector<uint8_t> seen(n_slots, 0);
    n_keys = 0;
    for (uint32_t s : cfg_.alias) n_keys += !seen[s], seen[s] = 1;
  }
  if (cfg_.capacity >= n_keys) cfg_.linking_aligned = false;
  all_pinned_ = pinned_ == n_keys;
  uint32_t rest = cfg_.capacity - pinned_;
  if (cfg_.value) {  // one set of `rest` bundles, no FIFOs
    main_cap_ = rest;
    rank_.assign(n_slots, n_slots);  // unlisted: after every listed key
    uint32_t r = 0;
    for (uint32_t s : cfg_.hot) {
      if (s >= n_slots) throw UsageError("cache: hot slot out of range");
      if (rank_[key(s)] == n_slots) rank_[key(s)] = r++;
    }
    level_.assign(n_slots, 0);
    members_.reserve(rest);
    return;
  }
  small_cap_ = rest ? std::max<uint32_t>(1, uint32_t(std::lround(cfg_.small_fraction * rest))) : 0;
  if (small_cap_ > rest) small_cap_ = rest;
  main_cap_ = rest - small_cap_;
  small_.reserve(small_cap_ + 1);
  main_.reserve(main_cap_ + 2);
  ghost_.reserve(main_cap_ + 2);
}

double SlotCache::next_uniform() { return unit_double(splitmix64_next(rng_)); }

uint32_t SlotCache::window_resident() const {
  if (!cfg_.window_tokens) return 0;
  uint32_t c = 0;
  for (uint32_t s = 0; s < n_slots_; ++s)
    if (state_[s] == kNone && last_active_[s] && last_active_[s] + cfg_.window_tokens >= now_) ++c;
  return c;
}

void SlotCache::ghost_add(uint32_t slot) {
  if (main_cap_ == 0) return;
  ghost_stamp_[slot] = ++ghost_clock_;
  ghost_.push_back({slot, ghost_clock_});
  while (ghost_.size() > main_cap_) {
    auto [s, st] = ghost_.front();
    ghost_.pop_front();
    if (ghost_stamp_[s] == st) ghost_stamp_[s] = 0;
  }
}

void SlotCache::evict_main() {
  while (!main_.empty()) {
    uint32_t s = main_.front();
    main_.pop_front();
    if (freq_[s] > 0) {  // reinsertion: recently used objects get another lap
      --freq_[s];
      main_.push_back(s);
    } else {
      state_[s] = kNone;
      --main_size_;
      return;
    }
  }
}

void SlotCache::evict_small() {
  while (!small_.empty()) {
    uint32_t s = small_.front();
    small_.pop_front();
    --small_size_;
    if (freq_[s] > 0 && main_cap_ > 0) {  // used again while in the small FIFO: promote
      freq_[s] = 0;
      state_[s] = kMain;
      main_.push_back(s);
      ++main_size_;
      while (main_size_ > main_cap_) evict_main();
    } else {  // one-hit wonder: remember it in the ghost FIFO only
      state_[s] = kNone;
      ghost_add(s);
      return;
    }
  }
}

void SlotCache::evict_one() {
  if (small_size_ >= small_cap_ || main_size_ == 0)
    evict_small();
  else
    evict_main();
}

void SlotCache::admit(uint32_t s) {
  uint32_t rest = small_cap_ + main_cap_;
  if (rest == 0) return;
  while (small_size_ + main_size_ >= rest) {
    uint32_t before = small_size_ + main_size_;
    evict_one();
    if (small_size_ + main_size_ == before) evict_main();  // small was all promotions; make room in main
  }
  freq_[s] = 0;
  if (ghost_stamp_[s] && main_cap_ > 0) {  // seen recently: straight into main
    ghost_stamp_[s] = 0;
    state_[s] = kMain;
    main_.push_back(s);
    ++main_size_;
  } else {
    state_[s] = kSmall;
    small_.push_back(s);
    ++small_size_;
  }
}

namespace {
// Whether `slot` lies in one of the plan's reads; `r` walks the reads along ascending slots (start it at 0).
bool in_read(const TokenPlan& plan, uint32_t slot, size_t& r) {
  while (r < plan.reads.size() && plan.reads[r].slot_end <= slot) ++r;
  return r < plan.reads.size() && plan.reads[r].slot_begin <= slot;
}
}  // namespace

void SlotCache::update_value(const uint32_t* active, size_t n, const TokenPlan& plan) {
  if (!plan.planner) throw InternalError("value cache: the plan does not name its planner");
  const ReadPlanner& pl = *plan.planner;
  // This token's active keys that are candidates (held, or fetched by a read), with their class: 3 read alone,
  // 2 at a read's end, 1 inside a read (what residency would save if the same slots fired again).
  cand_.clear();
  size_t r = 0;
  for (size_t k = 0; k < n; ++k) {
    const uint32_t slot = active[k], s = key(slot);
    if (state_[s] == kPinned) continue;
    if (state_[s] == kNone && !in_read(plan, slot, r)) continue;  // not fetched: no bytes to keep
    const bool left = k > 0 && pl.merges(active[k - 1] + 1, slot);
    const bool right = k + 1 < n && pl.merges(slot + 1, active[k + 1]);
    const uint8_t lv = uint8_t(2 + !left + !right);         // level = class + 1
    if (level_[s] == 0) cand_.push_back({0, rank_[s], s});  // a key active twice (two copies) counts once
    level_[s] = std::max(level_[s], lv);
  }
  for (Candidate& c : cand_) c.level = level_[c.key];
  for (uint32_t s : members_)
    if (level_[s] == 0) cand_.push_back({1, rank_[s], s});  // held, not active this token
  const size_t keep = std::min<size_t>(main_cap_, cand_.size());
  auto better = [](const Candidate& a, const Candidate& b) {
    if (a.level != b.level) return a.level > b.level;
    if (a.rank != b.rank) return a.rank < b.rank;
    return a.key < b.key;
  };
  if (keep < cand_.size()) std::nth_element(cand_.begin(), cand_.begin() + std::ptrdiff_t(keep), cand_.end(), better);
  constexpr uint8_t kKept = 0xFF;
  for (size_t i = 0; i < cand_.size(); ++i) {
    const uint32_t s = cand_[i].key;
    if (state_[s] == kNone) ++(i < keep ? admissions_ : rejections_);  // its bytes come from this token's reads
    level_[s] = i < keep ? kKept : 0;
  }
  for (uint32_t s : members_)
    if (level_[s] != kKept) state_[s] = kNone;  // evicted
  members_.clear();
  for (size_t i = 0; i < keep; ++i) {
    const uint32_t s = cand_[i].key;
    state_[s] = kMain;
    level_[s] = 0;
    members_.push_back(s);
  }
  main_size_ = uint32_t(members_.size());
}

void SlotCache::update(const uint32_t* active, size_t n, const TokenPlan& plan) {
  if (cfg_.value)
    update_value(active, n, plan);
  else
    update_s3fifo(active, n, plan);
  if (cfg_.window_tokens)
    for (size_t k = 0; k < n; ++k) last_active_[key(active[k])] = now_;
  ++now_;
}

void SlotCache::update_s3fifo(const uint32_t* active, size_t n, const TokenPlan& plan) {
  // Admission first looks at which read fetched each miss (the read's length decides the probability).
  size_t r = 0;
  for (size_t k = 0; k < n; ++k) {
    const uint32_t slot = active[k], s = key(slot);  // the read holds the slot; the cache entry is the key's
    uint8_t st = state_[s];
    if (st == kSmall || st == kMain) {
      if (freq_[s] < 3) ++freq_[s];
      continue;
    }
    if (st == kPinned) continue;
    if (!in_read(plan, slot, r)) continue;  // served by the window: nothing to admit
    double p = 1.0;
    if (cfg_.linking_aligned && plan.reads[r].bundles() > cfg_.isolated_max_bundles) p = cfg_.run_admit_prob;
    if (p >= 1.0 || next_uniform() < p) {
      admit(s);
      ++admissions_;
    } else {
      ++rejections_;
    }
  }
}

}  // namespace nl
