// FlashFfn, the non-overlapped loader: a layer-token's reads split into pieces that fit the staging, read batch by
// batch, verified (--verify-reads), kept in the cache's slab when admitted, computed as each batch lands.
#include <algorithm>

#include "formats/core/error.h"
#include "formats/core/image.h"
#include "runtime/ffn/internal.h"

namespace nl {
using namespace ffn_detail;

void FlashFfn::slab_keep(int layer, size_t p0, size_t p1) {
  const SlotCache* cache = caches_[size_t(layer)].get();
  if (!cache) return;
  // plan() has already recorded this token in the cache (hits, admissions, window): any slot the reads covered may
  // have been admitted, gap slots included.
  for (size_t p = p0; p < p1; ++p)
    for (uint32_t s = pieces_[p].slot_begin; s < pieces_[p].slot_end; ++s)
      if (cache->resident(s) && !slab_find(layer, s)) slab_put(layer, s, bundle(layer, s));
}

void FlashFfn::make_pieces(int layer, const std::vector<ReadOp>& reads, std::vector<Piece>* pieces,
                           std::vector<size_t>* batch_end) const {
  pieces->clear();
  for (const ReadOp& r : reads)
    planners_[size_t(layer)].for_each_piece(r, [&](uint32_t sb, uint32_t se, uint64_t offset, uint64_t length) {
      if (length > staging_cap_) throw InternalError("flash FFN: a read piece is longer than the staging");
      pieces->push_back({sb, se, offset, length, 0});
    });
  if (batch_end) batch_end->clear();
  uint64_t pos = 0;
  for (size_t p = 0; p < pieces->size(); ++p) {
    Piece& pc = (*pieces)[p];
    if (pos + pc.length > staging_cap_) {
      if (batch_end) batch_end->push_back(p);
      pos = 0;
    }
    pc.pos = pos;
    pos += pc.length;
  }
  if (batch_end && !pieces->empty()) batch_end->push_back(pieces->size());
}

const uint8_t* FlashFfn::bundle(int layer, uint32_t slot) const {
  // In the batch now in the staging?
  if (cur_batch_ >= 0) {
    auto it = std::upper_bound(pieces_.begin() + std::ptrdiff_t(cur_p0_), pieces_.begin() + std::ptrdiff_t(cur_p1_),
                               slot, [](uint32_t s, const Piece& p) { return s < p.slot_begin; });
    if (it != pieces_.begin() + std::ptrdiff_t(cur_p0_)) {
      const Piece& p = *(it - 1);
      if (slot < p.slot_end) {
        const uint64_t at = m_.ffn(layer).offset + uint64_t(slot) * m_.bundle_bytes - p.offset;
        if (p.ahead != kNotAhead) return pf_staging_.data() + p.ahead + at;
        return staging_.data() + cur_off_ + p.pos + at;
      }
    }
  }
  if (const uint8_t* b = slab_find(layer, slot)) return b;
  throw InternalError("slot " + std::to_string(slot) + " of layer " + std::to_string(layer) +
                      " neither read nor cached");
}

void FlashFfn::verify_pieces(int layer, size_t p0, size_t p1) {
  if (sums_.empty()) return;
  const auto t0 = Clock::now();
  const std::vector<uint64_t>& sums = sums_[size_t(layer)];
  for (size_t p = p0; p < p1; ++p)
    for (uint32_t s = pieces_[p].slot_begin; s < pieces_[p].slot_end; ++s) {
      const uint64_t got = xxh3_of(bundle(layer, s), m_.bundle_bytes);
      if (got != sums[s])
        throw InputError(img_.image_path(), "bundle slot " + std::to_string(s) + " of layer " + std::to_string(layer) +
                                                " read back as other bytes (xxh3 " + hex64(got) + ", " +
                                                hex64(sums[s]) +
                                                " at start-up): the storage returned corrupt data (--verify-reads)");
    }
  token_.verify_seconds += since(t0);
}

void FlashFfn::load_batches(int layer, const std::function<void(uint32_t, bool)>& landed) {
  SlotCache* cache = caches_[size_t(layer)].get();
  auto t0 = Clock::now();
  planners_[size_t(layer)].plan(active_.data(), active_.size(), cache, plan_);
  // Bytes of slots the cache no longer holds go (not before this token's plan: the previous token's FFN used them),
  // except this token's hits, served from the slab below.
  if (cache) store_.drop_evicted(layer, cache, plan_.hits);
  const uint64_t cap = staging_cap_;
  make_pieces(layer, plan_.reads, &pieces_, &batch_end_);
  staging_.resize(cap);
  double io = 0;
  uint64_t bytes = 0;
  size_t p0 = 0;
  for (size_t b = 0; b < batch_end_.size(); ++b) {
    const size_t p1 = batch_end_[b];
    spans_.clear();
    for (size_t p = p0; p < p1; ++p) {
      spans_.push_back({pieces_[p].offset, pieces_[p].length, staging_.data() + pieces_[p].pos});
      bytes += pieces_[p].length;
    }
    auto ti = Clock::now();
    img_.io().read(spans_.data(), spans_.size());
    io += since(ti);
    cur_batch_ = int(b), cur_p0_ = p0, cur_p1_ = p1;
    verify_pieces(layer, p0, p1);
    slab_keep(layer, p0, p1);
    if (landed) landed(pieces_[p1 - 1].slot_end, false);
    p0 = p1;
  }
  cur_batch_ = -1;
  if (landed) landed(0, true);
  slab_settle(layer);
  token_.io_seconds += io;
  token_.io_busy_seconds += io;
  if (landed) token_.compute_seconds += since(t0) - io;  // planning included, as the overlapped path counts it
  token_.active += plan_.active;
  token_.reads += pieces_.size();
  token_.bytes_read += bytes;
  token_.bytes_needed += uint64_t(plan_.needed) * m_.bundle_bytes;
  token_.cache_hits += plan_.hits.size();
}

void FlashFfn::load_compute(int layer, float* out, GateFrom from) {
  if (!out) {
    load_batches(layer, nullptr);
    return;
  }
  const size_t n = active_.size();
  bundles_.resize(n);
  h_.resize(n);
  size_t k0 = 0;
  bool first = true;
  const bool ordered = begin_ordered(layer);
  load_batches(layer, [&](uint32_t slot_end, bool last) {
    if (!last) {
      // This batch's neurons and the hits before its last piece, then the next batch into the same buffer.
      const size_t k1 =
          size_t(std::lower_bound(active_.begin() + std::ptrdiff_t(k0), active_.end(), slot_end) - active_.begin());
      if (ordered)
        compute_ordered(layer, k0, k1, from, out, false);
      else
        compute_range(layer, k0, k1, from, out, !first);
      first = false;
      k0 = k1;
    } else if (ordered) {
      compute_ordered(layer, k0, n, from, out, true);
    } else if (k0 < n || first) {
      compute_range(layer, k0, n, from, out, !first);  // the hits after the last read
    }
  });
}

}  // namespace nl
