// The neuron cache of one FFN layer, keyed by slot (position in the layout): S3-FIFO (small FIFO, main FIFO
// with reinsertion, ghost FIFO) with the paper's linking-aligned admission — a neuron read alone (a short
// read) is admitted normally, a neuron read inside a long read is admitted only with a lower probability,
// because caching it would not save a read. Options: a pinned hot set, and a sliding window of the neurons
// active in the last k tokens (LLM in a flash). Deterministic: admission draws from a seeded generator.
//
// Or (CacheConfig::value, the layout's admission "value") the value cache: after each token it holds the unpinned
// capacity's worth of bundles, among those it held and those the token read, that would save the most of the next
// token's read plan if the same neurons fired again (token-to-token persistence): an active slot whose neighbours on
// both sides are too far for the planner to merge (read alone: residency saves a whole read), then one linked on one
// side only (at a read's end: saves its bundle), then one inside a read (the planner reads through a lone resident
// slot: saves nothing), then slots not active this token; within a class the hotter first (CacheConfig::hot, the
// profile's frequency order), then the lower key. No draws; the planner's merge rule comes with the plan.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "formats/core/cache_admission.h"

namespace nl {

struct TokenPlan;

struct CacheConfig {
  uint32_t capacity = 0;              // bundles held by S3-FIFO + pinned (window residency is extra, reported)
  double small_fraction = 0.10;       // share of the S3-FIFO capacity given to the small FIFO
  bool linking_aligned = true;        // false: admit every miss (plain S3-FIFO)
  uint32_t isolated_max_bundles = 1;  // a miss fetched by a read of at most this many bundles counts as isolated
  double run_admit_prob = 0.125;      // admission probability for misses fetched by longer reads
  uint32_t window_tokens = 0;         // > 0: slots active in the last k tokens are resident (LLM in a flash)
  std::vector<uint32_t> pinned;       // always-resident slots (count against capacity)
  uint64_t seed = 0;                  // admission draws
  // slot -> cache key (flash replication: a neuron's first copy, so both copies share one entry; pinned slots are
  // keys); empty = the slot itself (runtime/plan/replica_cover.h)
  std::vector<uint32_t> alias = {};
  bool value = false;              // the value cache instead of S3-FIFO (admission "value"; small_fraction unused)
  std::vector<uint32_t> hot = {};  // value cache: slots hottest first (its order within a class); unlisted ones last
};

// Admission seed of layer `layer` in a run seeded with `seed`: nl-layout eval and nl-run draw the same numbers.
inline uint64_t cache_seed_for_layer(uint64_t seed, uint32_t layer) { return seed * 1000003ull + layer; }

// Applies a layer's recorded cache policy (layout `admission`/`pinned`, image manifest `cache_policy`) on top of `cc`:
// admission kAll or kLinkingAligned overrides cc.linking_aligned, kIsolated sets linking-aligned with a run
// admission probability of 0 (kUnset keeps cc as is), the pinned slots (hottest first) are appended to cc.pinned, and a
// small_fraction other than 0 replaces cc.small_fraction; kValue selects the value cache with `hot_slots` as its
// hotness order. The one place nl-layout eval and nl-run turn a policy into a cache configuration.
void cache_apply_policy(CacheConfig& cc, CacheAdmission admission, const std::vector<uint32_t>& pinned_slots,
                        double small_fraction = 0, const std::vector<uint32_t>& hot_slots = {});

// Capacity in bundles for a cache holding `ratio` of the layer's FFN bytes.
uint32_t cache_capacity_for_ratio(double ratio, uint32_t n_slots);

// A FIFO on a power-of-two ring that grows by doubling: what the S3-FIFO queues need (push at the back, pop at the
// front) without std::deque's block bookkeeping on every operation (the solve runs the cache for every candidate).
template <class T>
class RingFifo {
 public:
  void reserve(size_t n) {
    while (buf_.size() < n) grow();
  }
  bool empty() const { return head_ == tail_; }
  size_t size() const { return size_t(tail_ - head_); }
  const T& front() const { return buf_[size_t(head_) & mask_]; }
  void pop_front() { ++head_; }
  void push_back(const T& x) {
    if (size() == buf_.size()) grow();
    buf_[size_t(tail_++) & mask_] = x;
  }

 private:
  std::vector<T> buf_;
  uint64_t head_ = 0, tail_ = 0;
  size_t mask_ = 0;
  void grow() {
    const size_t n = size(), cap = buf_.empty() ? 16 : 2 * buf_.size();
    std::vector<T> nb(cap);
    for (size_t i = 0; i < n; ++i) nb[i] = buf_[size_t(head_ + i) & mask_];
    buf_.swap(nb);
    head_ = 0;
    tail_ = n;
    mask_ = cap - 1;
  }
};

// Not thread-safe: one cache per layer per runtime thread.
class SlotCache {
 public:
  SlotCache(uint32_t n_slots, const CacheConfig& cfg);

  bool resident(uint32_t slot) const {
    const uint32_t k = key(slot);
    return state_[k] != kNone ||
           (cfg_.window_tokens && last_active_[k] && last_active_[k] + cfg_.window_tokens >= now_);
  }
  // Records one token: hits raise S3-FIFO frequencies, misses fetched by `plan` are offered for admission,
  // the window advances. `active` is the same ascending slot list given to the planner.
  void update(const uint32_t* active, size_t n, const TokenPlan& plan);

  uint32_t size() const { return small_size_ + main_size_ + pinned_; }  // S3-FIFO (or value) + pinned bundles held
  uint32_t capacity() const { return cfg_.capacity; }
  // Every key pinned (a cache that holds the whole layer): residency never changes, nothing is admitted or evicted.
  bool all_pinned() const { return all_pinned_; }
  uint32_t window_resident() const;  // slots resident only through the window (O(n_slots))
  uint64_t admissions() const { return admissions_; }
  uint64_t rejections() const { return rejections_; }

 private:
  enum : uint8_t { kNone = 0, kSmall = 1, kMain = 2, kPinned = 3 };
  CacheConfig cfg_;
  uint32_t n_slots_;
  uint32_t small_cap_ = 0, main_cap_ = 0, pinned_ = 0;
  uint32_t small_size_ = 0, main_size_ = 0;
  bool all_pinned_ = false;
  std::vector<uint8_t> state_, freq_;
  std::vector<uint64_t> ghost_stamp_;  // insertion stamp of the slot's live ghost entry, 0 = not a ghost
  RingFifo<uint32_t> small_, main_;
  RingFifo<std::pair<uint32_t, uint64_t>> ghost_;
  uint64_t ghost_clock_ = 0;
  std::vector<uint64_t> last_active_;  // window: value of now_ at the slot's last activity (0 = never)
  uint64_t now_ = 1;                   // 1 + tokens seen so far (the current token's index + 1)
  uint64_t rng_;
  uint64_t admissions_ = 0, rejections_ = 0;
  // Value cache: the keys it holds (state kMain, main_size_ of them), each key's hotness rank, and scratch.
  std::vector<uint32_t> members_, rank_;
  std::vector<uint8_t> level_;  // per key, this token's class + 1 (0 = not active or not a candidate)
  struct Candidate {
    uint32_t level, rank, key;
  };
  std::vector<Candidate> cand_;
  void update_value(const uint32_t* active, size_t n, const TokenPlan& plan);
  void update_s3fifo(const uint32_t* active, size_t n, const TokenPlan& plan);

  uint32_t key(uint32_t slot) const { return cfg_.alias.empty() ? slot : cfg_.alias[slot]; }
  double next_uniform();
  void admit(uint32_t slot);
  void evict_one();
  void evict_small();
  void evict_main();
  void ghost_add(uint32_t slot);
};

}  // namespace nl
