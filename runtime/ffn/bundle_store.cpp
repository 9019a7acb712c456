// Cached bundles' bytes (runtime/ffn/bundle_store.h).
#include "runtime/ffn/bundle_store.h"

#include <algorithm>
#include <cstring>

namespace nl {

void BundleStore::Slab::grow(uint32_t n) {
  // One allocation per call (huge pages from 2 MiB on: AlignedBuffer); its pages become resident only as bundles are
  // kept.
  chunks.emplace_back();
  chunks.back().resize_uninit(size_t(n) * bundle_bytes);
  for (uint32_t e = 0; e < n; ++e) {
    entry.push_back(chunks.back().data() + size_t(e) * bundle_bytes);
    held.push_back(kNone);
  }
  for (uint32_t e = n; e-- > 0;) free.push_back(uint32_t(entry.size()) - n + e);  // the front taken first
}

uint32_t BundleStore::Slab::take(uint32_t key) {
  if (free.empty()) grow(std::max<uint32_t>(64, uint32_t(entry.size() / 16)));
  const uint32_t e = free.back();
  free.pop_back();
  held[e] = key;
  return e;
}

void BundleStore::reset(int n_layers, uint64_t bundle_bytes) {
  bundle_bytes_ = bundle_bytes;
  slab_.clear();
  slab_.resize(size_t(n_layers));
  pool_ = Slab{};
  pool_.bundle_bytes = bundle_bytes;
}

void BundleStore::enable(int layer, uint32_t n_keys, uint32_t capacity) {
  Slab& sl = slab_[size_t(layer)];
  sl.bundle_bytes = bundle_bytes_;
  sl.of_slot.assign(n_keys, Slab::kNone);
  if (capacity > 0) sl.grow(capacity);
}

const uint8_t* BundleStore::find(int layer, uint32_t key) const {
  const uint32_t e = slab_[size_t(layer)].of_slot[key];
  if (e == Slab::kNone) return nullptr;
  return e & kPool ? pool_.entry[e & ~kPool] : slab_[size_t(layer)].entry[e];
}

void BundleStore::put(int layer, uint32_t key, const uint8_t* bytes) {
  Slab& sl = slab_[size_t(layer)];
  if (sl.of_slot[key] != Slab::kNone) return;
  uint32_t code;
  uint8_t* dst;
  if (!sl.free.empty()) {
    code = sl.take(key);
    dst = sl.entry[code];
  } else {
    const uint32_t e = pool_.take(key);
    code = e | kPool;
    dst = pool_.entry[e];
  }
  std::memcpy(dst, bytes, bundle_bytes_);
  sl.of_slot[key] = code;
}

void BundleStore::drop(int layer, uint32_t key) {
  Slab& sl = slab_[size_t(layer)];
  const uint32_t e = sl.of_slot[key];
  if (e == Slab::kNone) return;
  Slab& from = e & kPool ? pool_ : sl;
  from.held[e & ~kPool] = Slab::kNone;
  from.free.push_back(e & ~kPool);
  sl.of_slot[key] = Slab::kNone;
}

void BundleStore::drop_evicted(int layer, const SlotCache* cache, const std::vector<uint32_t>& keep) {
  if (cache && cache->all_pinned()) return;  // nothing ever leaves (a per-token scan of every slab entry otherwise)
  Slab& sl = slab_[size_t(layer)];
  for (uint32_t s : sl.held)
    if (s != Slab::kNone && !(cache && cache->resident(s)) && !std::binary_search(keep.begin(), keep.end(), s))
      drop(layer, s);
}

void BundleStore::settle(int layer, const SlotCache* cache) {
  if (!cache) return;
  Slab& sl = slab_[size_t(layer)];
  // Every key pinned: the slab holds each one since load, the pool nothing (nothing is ever read into it).
  if (cache->all_pinned() && pool_.free.size() == pool_.entry.size()) return;
  for (uint32_t s : sl.held)
    if (s != Slab::kNone && !cache->resident(s)) drop(layer, s);
  // The pool holds only this layer's bundles now (every layer-token settles).
  for (uint32_t e = 0; e < pool_.held.size(); ++e) {
    const uint32_t s = pool_.held[e];
    if (s == Slab::kNone) continue;
    if (cache->resident(s)) {
      const uint32_t e2 = sl.take(s);
      std::memcpy(sl.entry[e2], pool_.entry[e], bundle_bytes_);
      sl.of_slot[s] = e2;
    } else {
      sl.of_slot[s] = Slab::kNone;
    }
    pool_.held[e] = Slab::kNone;
    pool_.free.push_back(e);
  }
}

}  // namespace nl
