// FlashFfn, I/O-compute overlap (--overlap layer|cross|both): the read-ahead of a layer's predicted bundles at
// its start (cross) and the overlapped loader: exact reads planned against the read-ahead, submitted batch by batch,
// bundles computed as their reads complete (layer), the down projection in slot order.
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>

#include "formats/core/error.h"
#include "runtime/ffn/internal.h"
#include "runtime/memory.h"

namespace nl {
using namespace ffn_detail;

bool FlashFfn::wants_layer_input() const {
  return (opt_.overlap == OverlapMode::kCross || opt_.overlap == OverlapMode::kBoth) &&
         opt_.select != SelectMode::kDense && opt_.select != SelectMode::kReplay;
}

void FlashFfn::layer_start(int layer, int pos0, int n_tokens, const float* x) {
  (void)pos0;
  // Decode only: a prompt block's FFN reads are planned per token after its attention.
  if (!wants_layer_input() || n_tokens != 1) return;
  if (pf_layer_ >= 0) throw InternalError("read-ahead started while another layer's is pending");
  const SlotCache* cache = caches_[size_t(layer)].get();
  auto t0 = Clock::now();
  pf_pred_.clear();
  if (opt_.select == SelectMode::kLowRank && phase_ == LowRankPhase::kPredict) {
    // The low-rank gate on the layer input (normalised as the FFN's input), with the predict phase's threshold.
    predict_scores(layer, 0, x);  // a residual predictor: the layer's input (decode: one token)
    const float thr = threshold_[size_t(layer)];
    for (int s = 0; s < m_.config.hidden_dim; ++s)
      if (score_[size_t(s)] >= thr && !(cache && cache->resident(uint32_t(s)))) pf_pred_.push_back(uint32_t(s));
  } else {
    // No weight-based predictor in this mode: the layer's previous token's set (temporal locality).
    for (uint32_t s : prev_needed_[size_t(layer)])
      if (!(cache && cache->resident(s))) pf_pred_.push_back(s);
  }
  token_.compute_seconds += since(t0);
  pred_layer_ = layer;  // its window is measured from the end of this call (see the return paths below)
  win_t0_ = Clock::now();
  ++ov_.prefetches;
  ov_.predicted += pf_pred_.size();
  pf_plan_.clear();
  if (pf_pred_.empty()) return;
  planners_[size_t(layer)].plan(pf_pred_.data(), pf_pred_.size(), nullptr, pf_plan_);  // no cache: not a token
  // The first read_ahead_bytes of the predicted reads, in slot order (split as the exact reads are).
  make_pieces(layer, pf_plan_.reads, &pf_pieces_, nullptr);
  // At most read_ahead_bytes, and (with a device model) no more than the device reads, by that model, within the
  // window this layer's attention gave on the previous token, unless the prediction was mostly right then: reads
  // beyond the window are not hidden, and those the exact selection does not use cost the token their device time
  // (a small model's attention hides almost nothing).
  const double window = opt_.cost.bandwidth_MBps > 0 && pf_precision_[size_t(layer)] < kReadAheadPrecision
                            ? pf_window_[size_t(layer)]
                            : 0.0;
  uint64_t total = 0;
  double secs = 0;
  size_t k = 0;
  for (; k < pf_pieces_.size() && total + pf_pieces_[k].length <= opt_.read_ahead_bytes; ++k) {
    const double t = opt_.cost.seconds(double(pf_pieces_[k].length));
    if (window > 0 && secs + t > window) break;
    secs += t;
    pf_pieces_[k].pos = total;
    total += pf_pieces_[k].length;
  }
  pf_pieces_.resize(k);
  if (pf_pieces_.empty()) return;
  pf_staging_.resize(total);  // grows to at most read_ahead_bytes
  std::vector<ReadSpan> spans(pf_pieces_.size());
  for (size_t i = 0; i < spans.size(); ++i)
    spans[i] = {pf_pieces_[i].offset, pf_pieces_[i].length, pf_staging_.data() + pf_pieces_[i].pos};
  pf_done_.assign(spans.size(), 0);
  pf_t0_ = Clock::now();
  pf_first_id_ = img_.io().submit(spans.data(), spans.size());
  pf_layer_ = layer;
  win_t0_ = Clock::now();
  ov_.prefetch_bytes += total;
  token_.reads += spans.size();
  token_.bytes_read += total;
}

void FlashFfn::bundle_coefficients(size_t k0, size_t k1, GateFrom from) { coefficients(k0, k1, idx_.data(), from); }

void FlashFfn::load_compute_overlapped(int layer, float* out, GateFrom from) {
  OverlapRun r;
  r.layer = layer;
  r.out = out;
  r.from = from;
  r.per_read = opt_.overlap == OverlapMode::kLayer || opt_.overlap == OverlapMode::kBoth;
  r.pf = pf_layer_ == layer;
  if (pf_layer_ >= 0 && !r.pf) throw InternalError("read-ahead of another layer still pending");
  r.tc = Clock::now();
  overlap_plan(r);
  // Batch by batch: its late reads submitted, its bundles computed as their pieces complete (cache hits at once),
  // then its down projection added in slot order; the staging is then free for the next batch.
  r.ordered = begin_ordered(layer);  // a replicated layer-token reading second copies: first-copy order
  batch_id_.assign(batch_end_.size(), 0);
  for (size_t bi = 0; bi < batch_end_.size(); ++bi) overlap_batch(r, bi);
  overlap_finish(r);
}

void FlashFfn::overlap_plan(OverlapRun& r) {
  const int layer = r.layer;
  SlotCache* cache = caches_[size_t(layer)].get();
  // The layer's window and its prediction's precision on this token (whether or not anything was read ahead), and,
  // when something was (pf: always a layer just predicted), the read-ahead figures.
  if (pred_layer_ == layer) {
    pf_window_[size_t(layer)] = std::chrono::duration<double>(r.tc - win_t0_).count();
    size_t hit = 0;
    for (uint32_t s : active_) {
      const bool predicted = std::binary_search(pf_pred_.begin(), pf_pred_.end(), s);
      hit += predicted;
      if (r.pf && !(cache && cache->resident(s))) {
        ++ov_.needed;
        ov_.predicted_needed += predicted;
      }
    }
    pf_precision_[size_t(layer)] = pf_pred_.empty() ? 0.0 : double(hit) / double(pf_pred_.size());
  }
  pred_layer_ = -1;
  planners_[size_t(layer)].plan(active_.data(), active_.size(), cache, plan_);
  // As load_compute(): bytes of slots the cache no longer holds go, except this token's hits.
  if (cache) store_.drop_evicted(layer, cache, plan_.hits);
  make_pieces(layer, plan_.reads, &pieces_, &batch_end_);
  // Two batch buffers when there is more than one batch: batch b + 1's reads land in one while batch b is computed
  // from the other, so the device does not idle through each batch's down projection and cache admissions.
  r.two = batch_end_.size() > 1;
  staging_.resize(r.two ? kFfnOverlapReadBuffers * staging_cap_ : staging_cap_);
  const uint64_t late_bytes = overlap_spans(r);
  if (r.pf) ov_.late_bytes += late_bytes;
  token_.active += plan_.active;
  token_.bytes_needed += uint64_t(plan_.needed) * m_.bundle_bytes;
  token_.cache_hits += plan_.hits.size();
  token_.reads += spans_.size();
  token_.bytes_read += late_bytes;
  r.t_io0 = r.pf ? pf_t0_ : Clock::now();
  r.io_started = r.pf;
  // Active indices per piece (both ascending); the others are cache hits, in DRAM now.
  const size_t n = active_.size();
  h_.resize(n);
  bundles_.resize(n);
  idx_.resize(n);
  const size_t P = pieces_.size();
  read_active_.resize(P);
  size_t i = 0;
  for (size_t ri = 0; ri < P; ++ri) {
    while (i < n && active_[i] < pieces_[ri].slot_begin) ++i;
    const size_t lo = i;
    while (i < n && active_[i] < pieces_[ri].slot_end) ++i;
    read_active_[ri] = {lo, i};
  }
}

uint64_t FlashFfn::overlap_spans(const OverlapRun& r) {
  // Each piece: parts already read ahead (copied when their read-ahead piece lands) and late parts (read in its
  // batch). Late spans are listed in piece order, so each batch's are contiguous.
  const size_t P = pieces_.size();
  spans_.clear();
  span_read_.clear();
  copies_.clear();
  batch_span_.assign(1, 0);
  outstanding_.assign(P, 0);
  uint64_t late_bytes = 0;
  size_t pj = 0, b = 0;
  uint64_t used_hi = 0;
  const auto& pr = pf_pieces_;
  for (size_t ri = 0; ri < P; ++ri) {
    if (ri == batch_end_[b]) batch_span_.push_back(spans_.size()), ++b;
    const uint64_t a = pieces_[ri].offset, e = a + pieces_[ri].length, pos = pieces_[ri].pos;
    uint64_t cur = a;
    auto late = [&](uint64_t lo, uint64_t hi) {
      spans_.push_back({lo, hi - lo, batch_base(b) + pos + (lo - a)});
      span_read_.push_back(uint32_t(ri));
      ++outstanding_[ri];
      late_bytes += hi - lo;
    };
    if (r.pf) {
      // Pieces of one read may share a block with the next: the read-ahead scan restarts where this piece starts.
      while (pj > 0 && pr[pj - 1].offset + pr[pj - 1].length > a) --pj;
      while (pj < pr.size() && pr[pj].offset + pr[pj].length <= a) ++pj;
      for (size_t k = pj; k < pr.size() && pr[k].offset < e; ++k) {
        const uint64_t lo = std::max(cur, pr[k].offset), hi = std::min(e, pr[k].offset + pr[k].length);
        if (hi <= lo) continue;
        if (lo > cur) late(cur, lo);
        // A piece one read-ahead span covers whole is used where it landed (Piece::ahead, bundle()): its copy moves no
        // bytes and only waits for that span.
        const bool whole = lo == a && hi == e;
        if (whole) pieces_[ri].ahead = pr[k].pos + (lo - pr[k].offset);
        copies_.push_back(
            {uint32_t(k), uint32_t(ri), pr[k].pos + (lo - pr[k].offset), pos + (lo - a), whole ? 0 : hi - lo});
        ++outstanding_[ri];
        // Pieces of a split read share at most a block: each byte counts once.
        if (hi > used_hi) ov_.prefetch_used_bytes += hi - std::max(lo, used_hi), used_hi = hi;
        ++(whole ? ov_.pieces_in_place : ov_.pieces_copied);
        cur = hi;
      }
    }
    if (cur < e) late(cur, e);
  }
  while (batch_span_.size() <= batch_end_.size()) batch_span_.push_back(spans_.size());
  // Copies grouped by read-ahead piece.
  std::stable_sort(copies_.begin(), copies_.end(), [](const Copy& x, const Copy& y) { return x.pf_read < y.pf_read; });
  return late_bytes;
}

std::pair<std::vector<FlashFfn::Copy>::iterator, std::vector<FlashFfn::Copy>::iterator> FlashFfn::copies_of(size_t k) {
  auto lo =
      std::lower_bound(copies_.begin(), copies_.end(), k, [](const Copy& c, size_t kk) { return c.pf_read < kk; });
  auto hi = lo;
  while (hi != copies_.end() && hi->pf_read == k) ++hi;
  return {lo, hi};
}

void FlashFfn::overlap_submit(OverlapRun& r, size_t b, bool ahead) {
  // Batch b's late spans out; `ahead`: while batch b - 1 is read and computed.
  const size_t s0 = batch_span_[b], s1 = batch_span_[b + 1];
  if (s1 > s0) {
    if (!r.io_started) r.t_io0 = Clock::now(), r.io_started = true;
    batch_id_[b] = img_.io().submit(spans_.data() + s0, s1 - s0);
    ov_.batches_ahead += ahead;
  }
  ++ov_.batches;
}

void FlashFfn::overlap_publish(OverlapBatch& b, size_t lo, size_t hi) {
  size_t q = b.pub.load(std::memory_order_relaxed);
  for (size_t i = lo; i < hi; ++i) {
    bundles_[i] = bundle(b.layer, active_[i]);
    idx_[q++] = uint32_t(i);
  }
  b.pub.store(q, std::memory_order_release);
  if (img_.io().in_flight() > 0) ov_.bundles_in_flight += hi - lo;
  ov_.bundles_computed += hi - lo;
}

void FlashFfn::overlap_ready(const OverlapRun& r, OverlapBatch& b, size_t ri) {
  verify_pieces(r.layer, ri, ri + 1);
  --b.left;
  if (r.per_read) overlap_publish(b, read_active_[ri].first, read_active_[ri].second);
}

void FlashFfn::overlap_work(const OverlapRun& r, OverlapBatch& b, bool all, double* idle) {
  // Coefficients of published bundles, claimed kClaimChunk at a time; `all`: until the batch's last one is done.
  bool idling = false;
  Clock::time_point t_idle;
  for (;;) {
    size_t c = b.claim.load(std::memory_order_relaxed);
    const size_t q = b.pub.load(std::memory_order_acquire);
    if (c >= q) {
      if (!all || c >= b.k1 || b.stop.load(std::memory_order_relaxed)) {
        if (idling) *idle += since(t_idle);
        return;
      }
      if (!idling) idling = true, t_idle = Clock::now();
      std::this_thread::yield();
      continue;
    }
    if (idling) *idle += since(t_idle), idling = false;
    const size_t e = std::min(q, c + kClaimChunk);
    if (b.claim.compare_exchange_weak(c, e, std::memory_order_relaxed)) bundle_coefficients(c, e, r.from);
  }
}

void FlashFfn::overlap_io_loop(const OverlapRun& r, OverlapBatch& b, int threads, double* idle, double* bwait) {
  IoEngine& io = img_.io();
  const size_t bi = b.bi;
  std::vector<uint64_t> done;
  while (b.left > 0) {
    done.clear();
    auto tw = Clock::now();
    io.wait_some(&done);
    if (threads == 1) *bwait += since(tw);
    for (uint64_t id : done) {
      if (r.pf && id >= pf_first_id_ && id < pf_first_id_ + pf_pieces_.size()) {
        const size_t k = size_t(id - pf_first_id_);
        pf_done_[k] = 1;
        auto [c0, c1] = copies_of(k);
        for (auto c = c0; c != c1; ++c) {
          if (c->read < b.p0 || c->read >= b.p1) continue;  // a later batch copies it when its turn comes
          std::memcpy(batch_base(bi) + c->dst, pf_staging_.data() + c->src, c->bytes);
          if (--outstanding_[c->read] == 0) overlap_ready(r, b, c->read);
        }
      } else if (b.s1 > b.s0 && id >= batch_id_[bi] && id < batch_id_[bi] + (b.s1 - b.s0)) {
        const uint32_t ri = span_read_[b.s0 + size_t(id - batch_id_[bi])];
        if (--outstanding_[ri] == 0) overlap_ready(r, b, ri);
      } else if (b.n1 > b.n0 && id >= batch_id_[bi + 1] && id < batch_id_[bi + 1] + (b.n1 - b.n0)) {
        --outstanding_[span_read_[b.n0 + size_t(id - batch_id_[bi + 1])]];  // the next batch's: counted at its turn
      } else {
        throw InternalError("overlap: completion of a read this layer did not issue");
      }
    }
    if (threads == 1) overlap_work(r, b, false, idle);
  }
}

void FlashFfn::overlap_batch(OverlapRun& r, size_t bi) {
  const int layer = r.layer;
  const size_t p0 = r.p0, p1 = batch_end_[bi];
  OverlapBatch b;
  b.layer = layer;
  b.bi = bi, b.p0 = p0, b.p1 = p1;
  b.k1 = size_t(std::lower_bound(active_.begin() + std::ptrdiff_t(r.k0), active_.end(), pieces_[p1 - 1].slot_end) -
                active_.begin());
  b.pub.store(r.k0), b.claim.store(r.k0);
  cur_batch_ = int(bi), cur_p0_ = p0, cur_p1_ = p1, cur_off_ = uint64_t(batch_base(bi) - staging_.data());
  // Parts already read ahead are copied now; the late spans go out.
  for (const Copy& c : copies_)
    if (c.read >= p0 && c.read < p1 && pf_done_[c.pf_read]) {
      std::memcpy(batch_base(bi) + c.dst, pf_staging_.data() + c.src, c.bytes);
      --outstanding_[c.read];
    }
  // This batch's late spans (unless out already) and the next batch's, into the other buffer (free: the batch
  // before this one is done).
  if (bi == 0 || !r.two) overlap_submit(r, bi, false);
  const bool next = r.two && bi + 1 < batch_end_.size();  // the next batch's spans go out now too
  if (next) overlap_submit(r, bi + 1, true);
  b.s0 = batch_span_[bi], b.s1 = batch_span_[bi + 1];
  b.n0 = next ? batch_span_[bi + 1] : 0, b.n1 = next ? batch_span_[bi + 2] : 0;
  if (r.per_read) {
    // The batch's cache hits, then its pieces already in place.
    size_t i = r.k0;
    for (size_t ri = p0; ri < p1; ++ri) {
      if (read_active_[ri].first > i) overlap_publish(b, i, read_active_[ri].first);
      i = read_active_[ri].second;
    }
    if (b.k1 > i) overlap_publish(b, i, b.k1);
  }
  for (size_t ri = p0; ri < p1; ++ri)
    if (outstanding_[ri] > 0)
      ++b.left;
    else if (r.per_read)
      overlap_publish(b, read_active_[ri].first, read_active_[ri].second);
  overlap_wait_batch(r, b);
  overlap_compute_batch(r, b);
}

void FlashFfn::overlap_wait_batch(OverlapRun& r, OverlapBatch& b) {
  const int threads =
      r.per_read && long(b.k1 - r.k0) * m_.config.dim > kOverlapParallelWork ? omp_get_max_threads() : 1;
  std::vector<double> idle(size_t(threads), 0.0);
  double bwait = 0;
  if (threads > 1) {
    std::exception_ptr err;
#pragma omp parallel num_threads(threads)
    {
      if (omp_get_thread_num() == 0) {
        try {
          overlap_io_loop(r, b, threads, &idle[0], &bwait);
        } catch (...) {
          err = std::current_exception();
          b.stop.store(true);
        }
      }
      overlap_work(r, b, true, &idle[size_t(omp_get_thread_num())]);
    }
    if (err) std::rethrow_exception(err);
    bwait = *std::min_element(idle.begin() + 1, idle.end());
  } else {
    overlap_io_loop(r, b, threads, &idle[0], &bwait);
    if (r.per_read) overlap_work(r, b, true, &idle[0]);
  }
  r.wait += bwait;
  for (size_t ri = b.p0; ri < b.p1; ++ri)
    if (outstanding_[ri] != 0) throw InternalError("overlap: a read never completed");
}

void FlashFfn::overlap_compute_batch(OverlapRun& r, const OverlapBatch& b) {
  const int dim = m_.config.dim;
  if (r.per_read && r.ordered) {
    compute_ordered(r.layer, r.k0, b.k1, r.from, r.out, false, false);  // coefficients done as the reads completed
  } else if (r.per_read) {
    // The batch's down projection, in slot order, over the neurons ffn_bundles would keep: continuing the sums.
    hd_.clear();
    downs_.clear();
    for (size_t i = r.k0; i < b.k1; ++i)
      if (r.from != GateFrom::kBundleSparse || h_[i] != 0.0f) {
        hd_.push_back(h_[i]);
        downs_.push_back(bundles_[i] + down_off_);
      }
    kernels::down_project(m_.dtype, r.out, dim, hd_.data(), downs_.data(), int(hd_.size()), !r.first);
  } else {
    compute_range(r.layer, r.k0, b.k1, r.from, r.out, !r.first);
  }
  slab_keep(r.layer, b.p0, b.p1);
  r.first = false;
  r.k0 = b.k1;
  r.p0 = b.p1;
}

void FlashFfn::overlap_finish(OverlapRun& r) {
  const int layer = r.layer;
  const size_t n = active_.size();
  IoEngine& io = img_.io();
  cur_batch_ = -1, cur_off_ = 0;
  if (r.ordered) {
    if (r.per_read) ov_.bundles_computed += n - r.k0;
    compute_ordered(layer, r.k0, n, r.from, r.out, true);
  } else if (r.k0 < n || r.first) {
    // The hits after the last read (or a layer with nothing to read).
    if (r.per_read) ov_.bundles_computed += n - r.k0;
    compute_range(layer, r.k0, n, r.from, r.out, !r.first);
  }
  slab_settle(layer);
  // Read-ahead that no exact read used is collected before the next layer's.
  {
    std::vector<uint64_t> done;
    auto tw = Clock::now();
    while (io.pending() > 0) {
      done.clear();
      io.wait_some(&done);
    }
    r.wait += since(tw);
  }
  const double busy =
      io.async() ? (r.io_started ? since(r.t_io0) : 0.0) : r.wait;  // a synchronous engine reads only while waited on
  pf_layer_ = -1;
  ++ov_.layer_tokens;
  ov_.io_busy_seconds += busy;
  ov_.io_wait_seconds += r.wait;
  token_.io_seconds += r.wait;
  token_.io_busy_seconds += busy;
  token_.compute_seconds += since(r.tc) - r.wait;  // planning included, as load_compute() counts it
}

}  // namespace nl
