// The DRAM bytes of cached bundles (FlashFfn's neuron cache holds keys; this holds their bytes), per layer: one
// allocation sized by the cache's capacity, entries reused through a free list (grown by further chunks only when the
// cache's window keeps more). A token's admissions can evict slots that are hits of the same token, still to be
// computed: until the layer-token ends, admitted bundles that find no free entry go to one pool shared by all layers
// (at most one layer's capacity), and move into the layer's slab when it settles. Keys are cache keys (a replica's
// bytes are its first copy's: the caller maps slots to keys).
#pragma once
#include <cstdint>
#include <vector>

#include "runtime/io/file.h"  // AlignedBuffer
#include "runtime/plan/slot_cache.h"

namespace nl {

class BundleStore {
 public:
  // Forgets everything: `n_layers` layers without a slab, bundles of `bundle_bytes`.
  void reset(int n_layers, uint64_t bundle_bytes);
  // Gives `layer` a slab for keys [0, n_keys), with room for `capacity` bundles up front.
  void enable(int layer, uint32_t n_keys, uint32_t capacity);
  // The bytes held for `key`, or null.
  const uint8_t* find(int layer, uint32_t key) const;
  // Keeps a copy of `bytes` for `key` (nothing when held already): the slab, else the pool.
  void put(int layer, uint32_t key, const uint8_t* bytes);
  void drop(int layer, uint32_t key);
  // Drops the layer's held keys the cache no longer has, except `keep` (this token's hits, ascending).
  void drop_evicted(int layer, const SlotCache* cache, const std::vector<uint32_t>& keep);
  // The layer-token is computed: evicted keys go, pooled bundles the cache kept move into the layer's slab.
  void settle(int layer, const SlotCache* cache);

 private:
  struct Slab {
    static constexpr uint32_t kNone = ~0u;
    uint64_t bundle_bytes = 0;
    std::vector<AlignedBuffer> chunks;
    std::vector<uint8_t*> entry;    // entry -> its bytes
    std::vector<uint32_t> held;     // entry -> key, kNone when free
    std::vector<uint32_t> free;     // free entries
    std::vector<uint32_t> of_slot;  // key -> entry (kPool set: an entry of pool_), kNone when not held
    void grow(uint32_t n);
    uint32_t take(uint32_t key);  // a free entry (grown when none), now holding `key`
  };
  static constexpr uint32_t kPool = 1u << 31;
  uint64_t bundle_bytes_ = 0;
  std::vector<Slab> slab_;
  Slab pool_;
};

}  // namespace nl
