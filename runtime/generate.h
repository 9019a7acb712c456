// Generation as a library: what `--select` names, the planner settings of a run, the one function that turns a memory
// budget into the neuron cache, staging and buffers, the token loop (prompt prefill in blocks, then sampled tokens
// with hooks for streaming, logits, progress and a stop flag) and incremental text. nl-run generate and the C API
// (runtime/include/nl_run.h, through runtime/session.h) both run on these. docs/runtime.md "Generation".
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runtime/flash_ffn.h"
#include "runtime/memory.h"
#include "runtime/model/model.h"
#include "runtime/sampler.h"
#include "runtime/tokenizer.h"

namespace nl {

// What `--select` names: gate | dense | lowrank:R | predictor | predictor:T | threshold | threshold:T | topk:F |
// trace:FILE | predictor+trace:FILE.
struct Selection {
  SelectMode mode = SelectMode::kGate;
  int rank = 0;         // lowrank:R, or the stored predictor's rank (predictor; filled by the Session)
  bool stored = false;  // predictor: the image's stored predictor in place of lowrank's SVD fit
  // predictor:T, deployment: a neuron is read when the stored predictor's score exceeds T (T = 0: sigmoid(score) >
  // 0.5, a binary classifier's decision), with no gate rows in DRAM, no calibration and no exact run (recall is not
  // measured).
  bool deploy = false;
  double predictor_threshold = 0;
  // predictor+trace:FILE (benchmarks): the trace names each token's neurons, as trace:FILE, and the stored predictor
  // runs as predictor:0 would (its products and scan timed as compute, its region in the memory plan), its choice
  // discarded: a run that pays for prediction while its I/O pattern stays the trace's.
  bool trace_pays_predictor = false;
  double threshold = -1;  // threshold:T (>= 0); -1 with kThreshold: the manifest's per-layer act_threshold
  double topk = 0;        // topk:F (kThreshold, F in (0, 1]): each layer-token's ceil(F x hidden) largest |act|
  std::string trace;      // trace:FILE (the caller names each forward pass's active sets: FlashFfn::set_trace_active)
};
// "" when `s` is one of the forms above (into *out), else what is wrong.
std::string selection_parse(const std::string& s, Selection* out);

// The planner and cache settings of a run (one default per field): unset fields follow the manifest's planner
// settings (the layout's, recorded by pack), else the defaults noted.
struct PlannerSettings {
  std::string gap;          // off | N bundles | auto | auto-keep-runs; "" = the manifest's, else off
  double cache_ratio = -1;  // of each layer's FFN bytes; < 0 = the manifest's, else 0
  std::string device;       // device profile (configs/devices/*.json) for gap auto; "" = the manifest's fit
  uint32_t cache_window = CacheConfig{}.window_tokens;
  double run_admit_prob = CacheConfig{}.run_admit_prob;
  CachePolicyMode cache_policy = CachePolicyMode::kManifest;
  uint64_t seed = 1;  // cache admission draws (nl-layout eval --seed's default)
  std::string effective_gap(const ImagePlanner& manifest) const;
  double effective_cache_ratio(const ImagePlanner& manifest) const;
};
// The FlashFfn options of `select` under these settings and the manifest's planner (UsageError: gap auto with no
// device anywhere; InputError: an unreadable device profile).
FlashFfnOptions flash_ffn_options(const PlannerSettings& s, const ImagePlanner& manifest, SelectMode select);

// What a run asks of DRAM.
struct MemoryRequest {
  uint64_t budget = 0;      // bytes for the whole process; 0 = no budget
  std::string budget_text;  // the budget as the user wrote it (quoted in messages)
  int context = 0;          // KV cache positions
  FfnResidency residency = FfnResidency::kGateRows;
  int threads = 1;
  uint64_t baseline = 0;  // the process before loading (current_rss_bytes())
  uint64_t read_batch = kFfnReadBatchBytes, read_ahead = 0;
  int prefill_block = kPrefillBlockTokens;
  int read_buffers = 1;           // kFfnOverlapReadBuffers under any --overlap but none
  int lowrank_rank = 0;           // lowrank:R: its factors in DRAM
  bool stored_predictor = false;  // predictor: the factors come from the image's predictor region
  bool verify_reads = false;
  double cache_ratio = 0;          // the ratio that runs without a budget
  bool cache_ratio_given = false;  // given explicitly: checked against the budget instead of sized by it
};
struct MemorySizing {
  MemoryPlan plan;         // fixed part and cache_bundles_per_layer
  double cache_ratio = 0;  // the neuron cache's share of each layer's FFN
  std::string cache_from;  // "--cache-ratio", "--memory-budget" or "none (--select dense)"
};
// The one function that turns a memory budget into the neuron cache, staging and buffers: the fixed part (baseline,
// dense weights, FFN rows in DRAM, KV cache, buffers) must fit the budget, and the cache gets the rest unless a ratio
// was given (then it must fit too). InputError naming `image_path` when it does not fit (nothing loaded yet).
MemorySizing size_memory(const ImageManifest& m, const std::string& image_path, const MemoryRequest& r);

struct Generation {
  std::vector<int> tokens;  // generated (the stop token included when one ended generation)
  bool stopped_at_eos = false;
  bool stopped_by_caller = false;  // on_token returned false or the stop flag was set
  int prompt_forwards = 0;         // forward passes over the prompt (its last one gives the first token's logits)
  double prefill_seconds = 0, first_token_seconds = 0, decode_seconds = 0;
};

// Every hook may be empty.
struct GenerateHooks {
  // Forward passes first .. first + n - 1 are about to run as one pass (a prompt block when n > 1): --select trace
  // names their active sets here.
  std::function<void(uint64_t first, int n)> before_forward;
  std::function<void(const float* logits)> on_logits;  // each generated token's logits, before it is sampled
  std::function<bool(int token)> on_token;             // each generated token; false stops generation after it
  std::function<void(uint64_t forwards)> on_progress;  // forward passes done (prompt tokens count one each)
  const std::atomic<bool>* stop = nullptr;             // set from any thread: no further token is generated
};

// Feeds the prompt (in passes of up to `block` tokens), then up to `steps` tokens from `sampler`, stopping after a
// token of `stop_tokens`. Ends each forward pass on `ffn` (may be null).
Generation generate(Model& model, FlashFfn* ffn, const std::vector<int>& prompt, int steps, Sampler& sampler,
                    const std::vector<int>& stop_tokens, int block, const GenerateHooks& hooks = {});

// Text as tokens come: the prompt's text first, then each token's new bytes (a byte token goes out as its byte, even
// where it leaves UTF-8 incomplete; a tokenizer that rewrote earlier text would wait, none we read does).
class TextStream {
 public:
  TextStream(const Tokenizer& tok, const std::vector<int>& prompt);
  const std::string& text() const { return shown_; }  // all text so far
  std::string push(int token);                        // the bytes `token` adds
 private:
  const Tokenizer& tok_;
  std::vector<int32_t> all_;
  std::string shown_;
};

}  // namespace nl
