// The flash FFN's options and counters (runtime/flash_ffn.h runs them): which neurons are selected, how reads overlap
// compute, which cache policy runs, and the figures a run reports.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/io/engine.h"
#include "runtime/memory.h"
#include "runtime/plan/read_plan.h"
#include "runtime/plan/slot_cache.h"

namespace nl {

// kDense: the whole FFN in DRAM in the stored dtype (every region read and checksummed at start-up), computed with
// exactly gate mode's arithmetic (same kernels, same neuron order), so gate = dense token for token; no I/O per token.
// kTrace: the active neurons come from a trace (set_trace_active); kThreshold: CATS, |act(gate x)| > t per layer.
enum class SelectMode { kGate, kReplay, kLowRank, kDense, kTrace, kThreshold };

// Whether a selection keeps the gate rows in DRAM (gate, threshold, lowrank and the calibrated stored predictor; not
// dense, trace, replay or the deployed predictor).
inline bool selection_keeps_gate_rows(SelectMode s, bool predictor_only) {
  return s == SelectMode::kGate || s == SelectMode::kThreshold || (s == SelectMode::kLowRank && !predictor_only);
}

// dReLU fires when gate x > 0 and up x > 0: --select gate / threshold keep the up rows in DRAM beside the gate rows,
// so that they select (and read) only the neurons that fire, instead of every gate-positive one.
inline bool selection_keeps_up_rows(SelectMode s, FfnAct a) {
  return a == FfnAct::kDRelu && (s == SelectMode::kGate || s == SelectMode::kThreshold);
}

// Lowrank phases: exact (as gate: the reference run), calibrate (exact, and records the predictor's scores of the
// neurons that really fire), predict (reads what the predictor selects).
enum class LowRankPhase { kExact, kCalibrate, kPredict };

// Predictor quality, summed over layer-tokens of the predict phase.
struct PredictorCounters {
  uint64_t truly_active = 0, predicted = 0, true_positive = 0;
  double recall() const { return truly_active ? double(true_positive) / double(truly_active) : 1.0; }
  double precision() const { return predicted ? double(true_positive) / double(predicted) : 1.0; }
};

// --overlap: none | layer | cross | both.
enum class OverlapMode { kNone, kLayer, kCross, kBoth };
bool overlap_mode_parse(const std::string& s, OverlapMode* out);
const char* overlap_mode_name(OverlapMode m);

// Overlap figures, summed over layer-tokens.
struct OverlapCounters {
  uint64_t layer_tokens = 0;         // layer-tokens whose reads went through the overlapped path
  uint64_t bundles_in_flight = 0;    // bundles computed while other reads of the layer were still in the kernel
  uint64_t bundles_computed = 0;     // bundles computed on the overlapped path
  uint64_t prefetches = 0;           // cross: layer-tokens read ahead
  uint64_t predicted = 0;            // cross: bundles the predictor chose (not resident in the cache)
  uint64_t needed = 0;               // cross: bundles the exact selection needed from flash (not resident)
  uint64_t predicted_needed = 0;     // cross: both
  uint64_t prefetch_bytes = 0;       // cross: bytes read ahead
  uint64_t prefetch_used_bytes = 0;  // cross: of them, bytes inside the exact plan's reads
  uint64_t pieces_in_place = 0;      // cross: exact-read pieces one read-ahead span covered whole (computed there)
  uint64_t pieces_copied = 0;        // cross: exact-read pieces read ahead in part (those parts copied)
  uint64_t late_bytes = 0;           // cross: bytes read after the exact selection (what the prediction missed)
  uint64_t batches = 0;              // read batches of the overlapped path (--read-batch bytes of staging each)
  uint64_t batches_ahead = 0;        // of them, read into the second buffer while the batch before was computed
  double io_busy_seconds = 0;        // from a layer's first submit to its last completion
  double io_wait_seconds = 0;        // of that, blocked waiting for completions
  // Share of the I/O time hidden behind compute.
  double overlap_share() const { return io_busy_seconds > 0 ? 1.0 - io_wait_seconds / io_busy_seconds : 0.0; }
  double extra_bytes() const { return double(prefetch_bytes) - double(prefetch_used_bytes); }
};

// Which cache policy each layer runs: the manifest's `cache_policy` (admission and pinned slots recorded by pack from
// the layout; layers without one run linking-aligned S3-FIFO), or one admission rule for every layer with no pinning.
enum class CachePolicyMode { kManifest, kLinkingAligned, kAll };
// "manifest" | "linking-aligned" | "all"; returns false for anything else.
bool cache_policy_mode_parse(const std::string& s, CachePolicyMode* out);
const char* cache_policy_mode_name(CachePolicyMode m);

struct FlashFfnOptions {
  SelectMode select = SelectMode::kGate;
  GapPolicy gap{GapMode::Off, 0};
  CostFit cost;            // device cost model (--gap auto)
  double cache_ratio = 0;  // fraction of each layer's FFN bytes held in DRAM
  CacheConfig cache;       // admission parameters, window, seed (capacity and per-layer seed are derived)
  CachePolicyMode cache_policy = CachePolicyMode::kManifest;
  int lowrank_rank = 0;           // lowrank: R
  bool stored_predictor = false;  // lowrank phases with the image's predictor (--select predictor), no SVD fit
  // --select predictor:T: the stored predictor alone (no gate rows, no calibration): predict from the start, every
  // layer's threshold T.
  bool predictor_only = false;
  float predictor_threshold = 0;
  // --select predictor+trace: the trace's sets, and the stored predictor run (timed, its choice discarded).
  bool trace_pays_predictor = false;
  std::vector<float> act_threshold;  // threshold: t per layer (|act(gate x)| > t fires; ReLU models: act > t)
  OverlapMode overlap = OverlapMode::kNone;
  uint64_t read_batch_bytes = kFfnReadBatchBytes;  // the FFN read staging (memory.h)
  uint64_t read_ahead_bytes = kFfnReadAheadBytes;  // cross: the read-ahead bound (memory.h)
  // --verify-reads: every bundle read from the image after start-up is hashed (xxh3-64) and compared with the table
  // FlashImage::bundle_sums() built at start-up from checksummed regions; a mismatch is InputError (exit 3).
  bool verify_reads = false;
  // OPT (ModelConfig::has_biases): per layer fc1's bias [hidden] in neuron order (LayerView::b_up; borrowed for the
  // constructor only). Every mode that computes needs it; replay does not.
  std::vector<const float*> neuron_bias;
};

// Threshold selection: the |act(gate x)| mass and the neuron count the threshold keeps against all neurons (gate
// rows in DRAM give every activation), summed over layer-tokens.
struct ThresholdCounters {
  double mass_kept = 0, mass_total = 0;
  uint64_t kept = 0, total = 0;
  double mass_recall() const { return mass_total > 0 ? mass_kept / mass_total : 1.0; }
};

// Totals (and, per token, the same figures summed over layers).
struct FlashCounters {
  uint64_t tokens = 0;
  uint64_t active = 0;         // active neurons (layer-tokens summed)
  uint64_t reads = 0;          // planned reads issued
  uint64_t bytes_read = 0;     // aligned bytes read from the image
  uint64_t bytes_needed = 0;   // bundle bytes of active neurons not served by the cache
  uint64_t cache_hits = 0;     // active neurons served from DRAM
  double io_seconds = 0;       // wall time inside the I/O engine
  double compute_seconds = 0;  // wall time of the sparse FFN arithmetic (gate, up, down)
  // --overlap: io_seconds is the time blocked waiting for reads; io_busy_seconds the time reads were outstanding
  // (first submit to last completion). Without overlap both are the read time.
  double io_busy_seconds = 0;
  uint64_t replica_reads = 0;  // flash replication: active neurons read from their second copy
  double verify_seconds = 0;   // --verify-reads: hashing the bundles read (inside io_seconds or compute_seconds)
};

}  // namespace nl
