// The sparse FFN served from a flash image: per token and FFN layer, decide which neurons are needed, plan the reads
// with the shared planner (runtime/plan/read_plan.h) and cache (runtime/plan/slot_cache.h), issue them through an
// I/O engine, and compute the FFN over the loaded bundles only. Plugs into runtime/model as an FfnProvider.
// Selection modes: `gate` (exact: gate rows kept in DRAM; a neuron is read only when its gate fires, relu > 0;
// for SiLU every neuron fires), `replay` (the caller names the active neurons per layer; I/O only) and `lowrank`
// (ReLU models: a rank-R truncated SVD of each gate matrix predicts which gates fire, with a per-layer threshold
// calibrated to a target recall; the predicted bundles are read and their exact gate rows decide each neuron's
// contribution, so a missed neuron is the only error). Lowrank also keeps the full gate in DRAM, to measure
// recall and precision against the truth (measurement only: outside the timed compute).
// `trace` (benchmarks: the caller names each layer-token's active neurons, e.g. from a trace of the same shape; their
// bundles are read and computed for real, gate from the bundle's own gate row) and `threshold` (CATS: gate rows in
// DRAM as for gate; a neuron is read only when |act(gate x)| > t_l, the rest contribute nothing).
// I/O-compute overlap (--overlap, docs/runtime.md "I/O-compute overlap"): `layer` computes each bundle's gate/up as
// soon as its read completes (the engine's submit/wait_some; io_uring completions) and the down projection once, in
// slot order, so the tokens equal the non-overlapped run's; `cross` starts a layer's FFN reads at the layer's start,
// before its attention, from a predictor (lowrank: the low-rank gate on the layer input; otherwise the layer's
// previous token's set), then reads what the exact selection adds at once and computes only the exact set.
// Flash replication (image format 1.2): a layer's region holds some neurons twice; per token the exact active set goes
// through runtime/plan/replica_cover.h (the copy nl-layout eval picks), each neuron is read and computed once, the
// cache is keyed by the first copy, and the down projection sums in first-copy order, the order of the same layout
// without replicas, so the tokens do not depend on which copy was read. Selections gate, threshold, trace and replay;
// lowrank, dense and --overlap cross|both refuse replicated images.
// Not thread-safe: one instance per generating thread.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/ffn/bundle_store.h"
#include "runtime/ffn/options.h"
#include "runtime/flash_image.h"
#include "runtime/lowrank.h"
#include "runtime/memory.h"
#include "runtime/model/dense_bundles.h"
#include "runtime/model/model.h"
#include "runtime/model/typed_kernels.h"
#include "runtime/plan/read_plan.h"
#include "runtime/plan/replica_cover.h"
#include "runtime/plan/slot_cache.h"

namespace nl {

class FlashFfn : public FfnProvider {
 public:
  // Gate mode reads every FFN region once (checksummed) to keep the gate rows in DRAM.
  FlashFfn(FlashImage& image, const FlashFfnOptions& o);

  void ffn(int layer, int pos0, int n_tokens, const float* x, float* out, FfnObserver* observer) override;
  bool wants_layer_input() const override;
  void layer_start(int layer, int pos0, int n_tokens, const float* x) override;
  void reserve(int n_tokens) override;
  void set_residual(const float* x) override { resid_ = x; }
  const OverlapCounters& overlap() const { return ov_; }

  // Replay: plans, reads and accounts one layer-token whose active neurons (original indices) are given.
  void replay_layer(int layer, const std::vector<uint32_t>& active_neurons);
  // Trace: the active neurons (original indices) of `layer` for token `token` of the next forward pass (a prompt
  // block names each of its tokens' sets; a one-token pass uses token 0's).
  void set_trace_active(int layer, const std::vector<uint32_t>& active_neurons, int token = 0);
  // Threshold: replaces the per-layer thresholds and starts afresh (counters, caches), as set_phase does.
  // `topk` > 0: keep instead each layer-token's ceil(topk x hidden) largest |act| (--select topk:F).
  void set_thresholds(const std::vector<float>& t, double topk = 0);
  const ThresholdCounters& threshold_counters() const { return thr_; }
  // Marks the end of a token (per-token metrics); after a forward pass over several tokens, of each of them.
  void end_token();

  // Lowrank: switches phase and starts afresh (counters, caches). Leaving kCalibrate sets every layer's threshold
  // so that `target_recall` of the recorded firing neurons score at or above it.
  void set_phase(LowRankPhase p, double target_recall = 0.99);
  const PredictorCounters& predictor() const { return pred_; }
  const std::vector<float>& thresholds() const { return threshold_; }
  uint64_t calibration_samples() const { return calib_samples_; }

  const FlashCounters& totals() const { return total_; }
  const std::vector<FlashCounters>& per_token() const { return per_token_; }
  const ReadPlanner& planner(int layer) const { return planners_[size_t(layer)]; }
  // Pinned bundles held in DRAM (all layers) and the reads / bytes that loaded them at start-up (and again after
  // each set_phase); not part of the per-token figures.
  uint64_t pinned_bundles() const { return pinned_bundles_; }
  uint64_t pinned_reads() const { return pinned_reads_; }
  uint64_t pinned_bytes_read() const { return pinned_bytes_read_; }

 private:
  // --verify-reads: the bundles of pieces [p0, p1) of the batch now in place against sums_ (InputError on a mismatch).
  void verify_pieces(int layer, size_t p0, size_t p1);
  std::vector<std::vector<uint64_t>> sums_;  // --verify-reads: per layer, slot -> xxh3-64 of its bundle

  FlashImage& img_;
  FlashFfnOptions opt_;
  const ImageManifest& m_;
  std::vector<ReadPlanner> planners_;
  std::vector<std::unique_ptr<SlotCache>> caches_;
  std::vector<std::vector<uint32_t>> slot_of_;  // per layer: original neuron -> slot
  size_t row_bytes_ = 0;                        // one bundle part (gate row, up row or down column)
  size_t down_off_ = 0;                         // a bundle's down column: after its gate and up rows, or its one row
  // OPT: fc1's bias per layer, by gate row (gate_view_'s order: added to the gates) and by slot (bundles' own rows).
  std::vector<std::vector<float>> gate_bias_, slot_bias_;
  const float* cur_slot_bias_ = nullptr;  // the layer being computed's slot_bias_ (null: no biases)
  // g [n][hidden] (the gate rows' outputs) += the layer's gate_bias_.
  void add_gate_bias(int layer, float* g, int n) const;
  // Every layer's DRAM part of the FFN in one allocation (huge pages): the dense copies, or the gate rows ([slot] rows
  // per layer, stored dtype; gate / threshold / lowrank).
  AlignedBuffer ffn_dram_;
  std::vector<kernels::DenseBundles> dense_;  // dense: every FFN layer in DRAM, re-laid out
  std::vector<WeightView> gate_view_;         // per layer: the gate rows (in ffn_dram_)
  std::vector<WeightView> up_view_;           // per layer: the up rows (selection_keeps_up_rows), else empty
  kernels::PreparedX xq_;                     // the token's normalised input, as the kernels want it
  std::vector<float> h_;                      // per active neuron: act(gate)
  std::vector<const uint8_t*> bundles_;       // per active neuron: its bundle's bytes
  // Cached bundles' bytes (runtime/ffn/bundle_store.h), keyed by cache key (slab_key).
  BundleStore store_;
  const uint8_t* slab_find(int layer, uint32_t slot) const { return store_.find(layer, slab_key(layer, slot)); }
  void slab_put(int layer, uint32_t slot, const uint8_t* bytes) { store_.put(layer, slab_key(layer, slot), bytes); }
  // The layer-token is computed: evicted hits go, pooled bundles move into the layer's slab.
  void slab_settle(int layer) { store_.settle(layer, caches_[size_t(layer)].get()); }
  // Keeps the bytes of newly resident slots covered by pieces [p0, p1) (in the staging now).
  void slab_keep(int layer, size_t p0, size_t p1);
  TokenPlan plan_;
  // A layer-token's reads, split to fit the staging (memory.h kFfnReadBatchBytes) and grouped into batches that are
  // read, computed and released in slot order; `pos` is the piece's place in the staging buffer during its batch.
  static constexpr uint64_t kNotAhead = ~uint64_t(0);
  struct Piece {
    uint32_t slot_begin, slot_end;
    uint64_t offset, length, pos;
    // --overlap cross: where in pf_staging_ this exact-read piece starts when one read-ahead span covered it whole
    // (its bundles are computed and cached from there, not copied into the batch: a 7B f16 layer reads ahead ~25 MB
    // a token), kNotAhead otherwise.
    uint64_t ahead = kNotAhead;
  };
  std::vector<Piece> pieces_;
  std::vector<size_t> batch_end_;   // per batch: one past its last piece
  int cur_batch_ = -1;              // the batch in the staging now, -1 = none
  size_t cur_p0_ = 0, cur_p1_ = 0;  // its pieces
  uint64_t cur_off_ = 0;            // its buffer's offset in staging_ (overlapped reads use two buffers)
  // One batch's staging bytes (memory.h ffn_batch_staging_bytes of --read-batch), also every planner's
  // max_read_bytes: a piece always fits.
  uint64_t staging_cap_ = 0;
  // `reads` of `layer` as the device reads them (ReadPlanner::for_each_piece), grouped into batches of at most
  // staging_cap_ bytes.
  void make_pieces(int layer, const std::vector<ReadOp>& reads, std::vector<Piece>* pieces,
                   std::vector<size_t>* batch_end) const;
  AlignedBuffer staging_;
  std::vector<ReadSpan> spans_;
  std::vector<uint32_t> active_;
  std::vector<float> g_;
  std::vector<float> u_;  // selection_keeps_up_rows: the up outputs beside g_ (blk_u_ in ffn_block)
  const float* u_by_slot_ = nullptr;
  FlashCounters total_, token_;
  std::vector<FlashCounters> batch_;  // per token of a multi-token forward pass, until end_token()
  std::vector<FlashCounters> per_token_;

  // Where each bundle's gate value comes from: given (gate rows in DRAM), or the bundle's own gate row through the
  // model's activation (kBundleSparse: relu / fatrelu / drelu, h = 0 drops out; kBundleSmooth: SiLU / GeLU).
  enum class GateFrom { kGiven, kBundleSparse, kBundleSmooth };
  kernels::BundleAct bundle_act(GateFrom from) const;
  // Plans and reads `active_` (ascending slots) of `layer` batch by batch and, with `out`, computes the FFN into it as
  // each batch lands (down projection accumulated in slot order: the bits of one sum over the layer).
  void load_compute(int layer, float* out, GateFrom from);
  // Plans and reads active_ of `layer` batch by batch (one cache access); after each batch lands (its bundles in the
  // staging until the next), landed(one past its last slot, false); after the last, landed(0, true). The layer-token's
  // counters go to token_ (compute time only with `landed`).
  void load_batches(int layer, const std::function<void(uint32_t, bool)>& landed);
  // The bytes of `slot`: in the batch in the staging, else the slab.
  const uint8_t* bundle(int layer, uint32_t slot) const;
  // Active indices [k0, k1): coefficients then down projection into `out` (continuing its sums when `accumulate`).
  void compute_range(int layer, size_t k0, size_t k1, GateFrom from, float* out, bool accumulate);
  // kernels::ffn_bundles's h_k into h_[k] for the active indices k = ids[j] (or j without ids), j in [j0, j1).
  void coefficients(size_t j0, size_t j1, const uint32_t* ids, GateFrom from);
  // The same for k in [k0, k1), in chunks over the threads when the work pays for them.
  void coefficients_parallel(size_t k0, size_t k1, GateFrom from);
  int xrow_ = 0;  // the token of xq_ that coefficients() multiplies
  // Token `t` of a pass: its exact (or predicted) set into active_ and, for kGiven, g_by_slot_; `g` holds its gate
  // outputs when the mode has gate rows (computed by the caller; SiLU activations are applied in place).
  GateFrom select_token(int layer, int t, const float* xt, float* g);
  // A prompt block (n > 1 tokens, a layer without replicas): each token's set selected as one token's would be, the
  // union of the sets planned and read once (one cache access), batch by batch; each token's FFN is computed from
  // the staged and cached bundles in slot order, so its numbers are those of its own token-by-token pass.
  void ffn_block(int layer, int n, const float* x, float* out);
  std::vector<std::vector<uint32_t>> blk_active_;  // ffn_block: per token, its ascending slots
  std::vector<float> blk_g_;                       // ffn_block: per token, its gate outputs (hidden each)
  std::vector<float> blk_u_;                       // ffn_block: the up outputs (selection_keeps_up_rows)
  std::vector<size_t> blk_k_;                      // ffn_block: per token, its next active index to compute
  std::vector<float> hd_;                          // compute_range: the kept coefficients
  std::vector<const uint8_t*> downs_;              // compute_range: their down columns
  // Lowrank predictor.
  LowRankPhase phase_ = LowRankPhase::kExact;
  std::vector<LowRankFactors> lowrank_;    // per layer, rows in slot order
  std::vector<float> threshold_;           // per layer
  std::vector<std::vector<float>> calib_;  // per layer: scores of neurons that fired during calibration
  uint64_t calib_samples_ = 0;
  PredictorCounters pred_;
  std::vector<float> score_, tmp_;
  AlignedBuffer pred_buf_;                       // --select predictor: the predictor region as stored
  std::vector<WeightView> pred_fc1_, pred_fc2_;  // per layer: [rank][dim], [hidden][rank] (slot order)
  kernels::PreparedX pred_xq_, pred_hq_;
  bool pred_residual_ = false;    // the stored predictor reads the residual stream (manifest predictor.input)
  const float* resid_ = nullptr;  // the pass's residual stream (set_residual)
  // trace: per layer and token of the next forward pass, ascending slots
  std::vector<std::vector<std::vector<uint32_t>>> trace_active_;
  ThresholdCounters thr_;
  double topk_ = 0;  // --select topk:F: the share of neurons kept per layer-token (0: by threshold)

  uint64_t pinned_bundles_ = 0, pinned_reads_ = 0, pinned_bytes_read_ = 0;

  // Overlap.
  OverlapCounters ov_;
  std::vector<std::vector<uint32_t>> prev_needed_;  // cross: per layer, the previous token's exact set (predictor)
  int pf_layer_ = -1;                               // cross: the layer read ahead, -1 = none
  TokenPlan pf_plan_;
  AlignedBuffer pf_staging_;       // at most kFfnReadAheadBytes
  std::vector<Piece> pf_pieces_;   // the read-ahead reads (a prefix of the predicted set's, split as pieces_)
  uint64_t pf_first_id_ = 0;       // engine id of the first read-ahead span
  std::vector<uint8_t> pf_done_;   // per read-ahead span: completed
  std::vector<uint32_t> pf_pred_;  // cross: predicted slots, ascending
  std::chrono::steady_clock::time_point pf_t0_;
  // cross: per layer, the seconds from the end of layer_start() to the start of that layer's FFN on the previous
  // decode token (its attention: the window a read-ahead can hide in; 0 = not measured yet).
  std::vector<double> pf_window_;
  // cross: per layer, the share of the previous token's predicted slots that its exact selection needed (read
  // ahead beyond the window only when at least kReadAheadPrecision of them were); the layer predicted last, whose
  // window and precision are pending, and the start of that window.
  std::vector<double> pf_precision_;
  int pred_layer_ = -1;
  std::chrono::steady_clock::time_point win_t0_;
  struct Copy {  // a piece of an exact read served by a read-ahead span
    uint32_t pf_read, read;
    uint64_t src, dst, bytes;  // positions in pf_staging_ / staging_
  };
  std::vector<Copy> copies_;
  // The copies of read-ahead piece k (copies_ is grouped by read-ahead piece).
  std::pair<std::vector<Copy>::iterator, std::vector<Copy>::iterator> copies_of(size_t k);
  std::vector<uint32_t> outstanding_;                   // per piece: parts not yet in place
  std::vector<std::pair<size_t, size_t>> read_active_;  // per piece: its range of active_ indices
  std::vector<uint32_t> span_read_;                     // per late span: its piece
  std::vector<size_t> batch_span_;                      // per batch: its first late span (and one past the last)
  std::vector<uint64_t> batch_id_;                      // per batch: engine id of its first late span, once submitted
  // Plans the exact reads, serves them from the read-ahead and new reads, and computes the FFN into `out`, batch by
  // batch (per completed read when --overlap has layer, else after the batch's reads).
  void load_compute_overlapped(int layer, float* out, GateFrom from);
  // What the parts of one overlapped layer-token share.
  struct OverlapRun {
    int layer = 0;
    float* out = nullptr;
    GateFrom from = GateFrom::kGiven;
    bool per_read = false;    // --overlap layer|both: bundles computed as their reads complete
    bool pf = false;          // this layer was read ahead (cross)
    bool two = false;         // two batch buffers (more than one batch)
    bool ordered = false;     // replicated layer-token reading second copies: first-copy order
    bool first = true;        // no down projection yet
    bool io_started = false;  // a read was submitted (or read ahead): io busy from t_io0
    size_t k0 = 0, p0 = 0;    // the next batch's first active index and piece
    double wait = 0;          // seconds blocked on completions
    std::chrono::steady_clock::time_point tc, t_io0;
  };
  // One batch of it: its pieces [p0, p1), active indices up to k1, late spans [s0, s1) (the next batch's [n0, n1)
  // when they went out with it), the published / claimed active indices of --overlap layer's workers.
  struct OverlapBatch {
    int layer = 0;
    size_t bi = 0, p0 = 0, p1 = 0, k1 = 0, s0 = 0, s1 = 0, n0 = 0, n1 = 0;
    size_t left = 0;  // pieces not yet in place
    std::atomic<size_t> pub{0}, claim{0};
    std::atomic<bool> stop{false};
  };
  // Batch `batch`'s buffer: the two staging_cap_ halves of staging_ alternate (one when a layer-token has one batch).
  uint8_t* batch_base(size_t batch) { return staging_.data() + (batch % kFfnOverlapReadBuffers) * staging_cap_; }
  void overlap_plan(OverlapRun& r);             // plan, pieces, spans, counters, active indices per piece
  uint64_t overlap_spans(const OverlapRun& r);  // late spans and read-ahead copies per piece; returns late bytes
  void overlap_submit(OverlapRun& r, size_t b, bool ahead);
  void overlap_batch(OverlapRun& r, size_t bi);
  void overlap_publish(OverlapBatch& b, size_t lo, size_t hi);
  void overlap_ready(const OverlapRun& r, OverlapBatch& b, size_t ri);
  void overlap_work(const OverlapRun& r, OverlapBatch& b, bool all, double* idle);
  void overlap_io_loop(const OverlapRun& r, OverlapBatch& b, int threads, double* idle, double* bwait);
  void overlap_wait_batch(OverlapRun& r, OverlapBatch& b);
  void overlap_compute_batch(OverlapRun& r, const OverlapBatch& b);
  void overlap_finish(OverlapRun& r);
  // The arithmetic of kernels::ffn_bundles's first phase, for published bundles.
  void bundle_coefficients(size_t k0, size_t k1, GateFrom from);  // h_[idx_[k]] for k in [k0, k1)
  std::vector<std::pair<size_t, size_t>> hits_;                   // active index ranges served from DRAM
  std::vector<uint32_t> idx_;

  // Flash replication, per layer (null / empty when the layer has no replicas): the slot -> neuron map, its copy
  // chooser, the first copies ascending (rank -> slot: the gate rows in DRAM are theirs, one per neuron, in the order
  // of the layout without replicas) and each slot's cache key (its neuron's first copy).
  std::vector<std::unique_ptr<ReplicaMap>> rep_;
  std::vector<std::unique_ptr<ReplicaCover>> cover_;
  std::vector<std::vector<uint32_t>> first_slots_;
  std::vector<std::vector<uint32_t>> alias_;
  std::vector<uint32_t> neurons_;     // a token's active neurons, handed to the cover
  std::vector<float> g_slot_;         // replicated layers: the gate values by slot (both copies)
  const float* g_by_slot_ = nullptr;  // GateFrom::kGiven's gate values, indexed by slot
  uint32_t slab_key(int layer, uint32_t slot) const {
    return alias_[size_t(layer)].empty() ? slot : alias_[size_t(layer)][slot];
  }
  // active_ = the slots the cover picks for `neurons` of `layer` under its cache now (ascending, one per neuron);
  // seconds_ = how many of them are second copies.
  void choose_copies(int layer, const uint32_t* neurons, size_t n);
  size_t seconds_ = 0;
  // First-copy order of a layer-token that reads some second copies: ord_ (active indices by first copy), each
  // index's place in it, the next place to project, each index's down column (moved to stash_ while it waits).
  std::vector<size_t> ord_, ord_pos_;
  size_t ord_q_ = 0;
  bool ord_started_ = false;
  std::vector<const uint8_t*> down_of_;
  std::unique_ptr<uint8_t[]> stash_;
  size_t stash_cap_ = 0;
  // Starts the first-copy order for active_ of `layer`; false when active_ is in it already (no second copy read).
  bool begin_ordered(int layer);
  // Active indices [k0, k1) landed: their coefficients, then the down projection of every index whose turn came;
  // unless `last`, the landed down columns still waiting are copied to stash_ (the staging is reused).
  // `coefficients` false: --overlap layer computed them (and bundles_) as the reads completed.
  void compute_ordered(int layer, size_t k0, size_t k1, GateFrom from, float* out, bool last, bool coefficients = true);

  void make_caches();
  // --select predictor: the image's predictor region (checksummed) kept in DRAM as stored, fc1 / fc2 views per layer.
  void load_stored_predictor();
  // score_[s] for every slot s of `layer` from the predictor (lowrank_'s factors, or the stored fc2 relu(fc1 x)
  // through the matrix kernels) on the layer's normalised FFN input x of the pass's token t, or (a residual predictor)
  // on that token's row of the residual stream.
  void predict_scores(int layer, int t, const float* x);
  // A new run (set_phase, set_thresholds): caches and pinned bundles anew, counters and read-ahead state cleared.
  void start_afresh();
  // Reads the bundles the layer's cache pins (resident from the first token) into the slab.
  void load_pinned(int layer, const std::vector<uint32_t>& pinned);
  // Set while the constructor reads every FFN region anyway (gate rows): load_pinned only lists the slots to fill
  // (pinned_wait_), and fill_pinned puts them from the region's bytes instead of reading them a second time.
  bool pinned_from_regions_ = false;
  std::vector<std::vector<uint32_t>> pinned_wait_;
  void fill_pinned(int layer, const uint8_t* region, uint64_t region_bytes);
};

}  // namespace nl
