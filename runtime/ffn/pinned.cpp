// FlashFfn, the caches: one per layer (capacity from the cache ratio, the manifest's or the chosen policy, the
// pinned hot set) and the pinned bundles' bytes, read at start-up or taken from the regions read for the gate rows.
#include <algorithm>

#include "formats/core/error.h"
#include "runtime/ffn/internal.h"

namespace nl {
using namespace ffn_detail;

void FlashFfn::make_caches() {
  const ModelConfig& c = m_.config;
  const uint32_t hidden = uint32_t(c.hidden_dim);
  caches_.clear();
  store_.reset(c.n_layers, m_.bundle_bytes);
  pinned_bundles_ = pinned_reads_ = pinned_bytes_read_ = 0;
  for (int l = 0; l < c.n_layers; ++l) {
    CacheConfig cc = opt_.cache;
    cc.capacity = cache_capacity_for_ratio(opt_.cache_ratio, hidden);
    cc.alias = alias_[size_t(l)];  // both copies of a neuron share its first copy's entry, as in nl-layout eval
    cc.seed = cache_seed_for_layer(opt_.cache.seed, uint32_t(l));
    switch (opt_.cache_policy) {
      case CachePolicyMode::kManifest:
        if (!m_.cache_policy.empty()) {
          const ImageCachePolicy& p = m_.cache_policy[size_t(l)];
          cache_apply_policy(cc, p.admission, p.pinned, p.small_fraction, p.hot);
        }
        break;
      case CachePolicyMode::kLinkingAligned:
        cc.linking_aligned = true;
        break;
      case CachePolicyMode::kAll:
        cc.linking_aligned = false;
        break;
    }
    const uint32_t n_slots = m_.n_slots(l);
    // A cache that holds every neuron of the layer (a --memory-budget above the whole FFN, --cache-ratio 1) holds
    // them from the start: the layer is read once at load in long reads, as llama.cpp's mmap pages the whole model
    // in on its first token, instead of neuron by neuron in short reads while tokens wait (small-relu with its e2e
    // cap as --memory-budget, 2 threads: 5.8-7.3 ms for each of the first 16 decoded tokens, about 1.2 afterwards).
    if (cc.capacity >= hidden && cc.window_tokens == 0) {
      cc.pinned.clear();
      for (uint32_t s = 0; s < n_slots; ++s)
        if (cc.alias.empty() || cc.alias[s] == s) cc.pinned.push_back(s);
    }
    caches_.push_back(cc.capacity > 0 || cc.window_tokens > 0 ? std::make_unique<SlotCache>(n_slots, cc) : nullptr);
    if (caches_.back()) store_.enable(l, n_slots, cc.capacity);  // indexed by cache key (slab_key)
    load_pinned(l, cc.pinned);
  }
}

void FlashFfn::load_pinned(int layer, const std::vector<uint32_t>& pinned) {
  SlotCache* cache = caches_[size_t(layer)].get();
  if (!cache || pinned.empty()) return;
  // The cache holds the listed slots that fit its capacity (hottest first); nothing else is resident yet.
  active_.clear();
  for (uint32_t s : pinned)
    if (cache->resident(s) && !slab_find(layer, s)) active_.push_back(s);
  if (active_.empty()) return;
  std::sort(active_.begin(), active_.end());
  active_.erase(std::unique(active_.begin(), active_.end()), active_.end());
  if (pinned_from_regions_) {
    pinned_wait_.resize(size_t(m_.config.n_layers));
    pinned_wait_[size_t(layer)] = active_;
    return;
  }
  planners_[size_t(layer)].plan(active_.data(), active_.size(), nullptr, plan_);  // no cache: not a token
  const uint64_t cap = staging_cap_;
  make_pieces(layer, plan_.reads, &pieces_, &batch_end_);
  staging_.resize(cap);
  size_t p0 = 0, k = 0;
  for (size_t b = 0; b < batch_end_.size(); ++b) {
    const size_t p1 = batch_end_[b];
    spans_.clear();
    for (size_t p = p0; p < p1; ++p)
      spans_.push_back({pieces_[p].offset, pieces_[p].length, staging_.data() + pieces_[p].pos});
    img_.io().read(spans_.data(), spans_.size());
    cur_batch_ = int(b), cur_p0_ = p0, cur_p1_ = p1;
    verify_pieces(layer, p0, p1);
    for (; k < active_.size() && active_[k] < pieces_[p1 - 1].slot_end; ++k)
      slab_put(layer, active_[k], bundle(layer, active_[k]));
    pinned_bytes_read_ += [&] {
      uint64_t t = 0;
      for (size_t p = p0; p < p1; ++p) t += pieces_[p].length;
      return t;
    }();
    p0 = p1;
  }
  cur_batch_ = -1;
  slab_settle(layer);
  pinned_bundles_ += active_.size();
  pinned_reads_ += pieces_.size();
  plan_.clear();
}

void FlashFfn::fill_pinned(int layer, const uint8_t* region, uint64_t region_bytes) {
  if (size_t(layer) >= pinned_wait_.size() || pinned_wait_[size_t(layer)].empty()) return;
  const std::vector<uint32_t>& slots = pinned_wait_[size_t(layer)];
  for (uint32_t s : slots) slab_put(layer, s, region + uint64_t(s) * m_.bundle_bytes);
  slab_settle(layer);
  pinned_bundles_ += slots.size();
  pinned_reads_ += 1;  // the region's one read, shared with the gate rows
  pinned_bytes_read_ += region_bytes;
  pinned_wait_[size_t(layer)].clear();
}

}  // namespace nl
