// DRAM accounting for nl-run: what the process holds (dense weights, FFN rows kept in DRAM, KV cache, scratch and
// I/O staging, the neuron cache), a budget parsed from the command line, and the process's resident set as the
// kernel reports it (/proc/self/status VmRSS / VmHWM). The runtime sizes its neuron cache from the budget and
// refuses to start when the fixed part alone does not fit (docs/runtime.md "Generation").
#pragma once
#include <cstdint>
#include <string>

#include "formats/core/atomic_file.h"  // format_bytes
#include "formats/core/image.h"

namespace nl {

// "6GiB", "512MiB", "64KiB", "2GB" (decimal), "123456" (bytes), or "80%" of MemAvailable (/proc/meminfo).
// Throws UsageError naming `option` on anything else.
uint64_t parse_memory_size(const std::string& s, const std::string& option = "--memory-budget");

// MemAvailable from /proc/meminfo (0 when unreadable).
uint64_t mem_available_bytes();
// This process's resident set now (VmRSS) and its peak (VmHWM); getrusage's ru_maxrss when /proc is not mounted.
uint64_t current_rss_bytes();
uint64_t peak_rss_bytes();

// Bytes the dense weights (embeddings, attention, norms, classifier) occupy in DRAM once loaded. The one place
// that knows how FlashImage::load_dense_store holds them: the dense region as stored, norm vectors widened to f32.
uint64_t dense_dram_bytes(const ImageManifest& m);
// FFN bytes kept in DRAM: per neuron, the gate row in the stored dtype for gate-style selection (as FlashFfn keeps
// it); for --select dense every FFN region as stored.
uint64_t gate_row_dram_bytes(const ImageManifest& m);
uint64_t ffn_dense_dram_bytes(const ImageManifest& m);
// The KV cache of `context` positions (keys and values, f32, every layer).
uint64_t kv_cache_bytes(const ModelConfig& c, int context);

// FlashFfn's FFN read staging (one source of truth for the runtime and its accounting; nl-run --read-batch and
// --read-ahead change them): a layer's reads are staged and computed this many bytes at a time in one reused buffer,
// so the staging never grows with a layer's density (a read longer than this is split at bundle boundaries; a bundle
// larger than this gets a buffer of its own size).
constexpr uint64_t kFfnReadBatchBytes = uint64_t(16) << 20;
// Under --overlap (any mode but none) a layer-token of several batches alternates this many batch buffers: the next
// batch is read while one is computed.
constexpr int kFfnOverlapReadBuffers = 2;
// --overlap cross|both: at most this many bytes of a layer's predicted bundles are read ahead, into one buffer of
// this size (the rest is read after the exact selection; a prediction that was mostly wrong is cut to what the layer's
// attention hides). 32 MiB holds most of a 7B f16 layer's predicted set, so the device stays busy through attention
// (docs/runtime.md, "Read staging sized for the device": 8 MiB left it idle for a third of a Llama-2-7B token).
constexpr uint64_t kFfnReadAheadBytes = uint64_t(32) << 20;
// nl-run generate's prompt is prefilled in passes of at most this many tokens by default (--prefill-block; a flash
// FFN reads the union of a pass's active sets once per layer); the activations of one pass are in the memory plan.
constexpr int kPrefillBlockTokens = 64;
// The staging buffer FlashFfn holds for bundles of `bundle_bytes` bytes and batches of `batch` bytes.
uint64_t ffn_batch_staging_bytes(uint64_t bundle_bytes, uint64_t batch = kFfnReadBatchBytes);
// What FlashFfn holds for this image: one batch buffer (`batch`: ffn_batch_staging_bytes, never more than a layer-token
// can read: the largest FFN region padded by an I/O block at each end) and the read-ahead bound (`read_ahead`, cut the
// same way). memory_plan charges exactly these.
struct FfnStaging {
  uint64_t batch = 0;
  uint64_t read_ahead = 0;
};
FfnStaging ffn_staging(const ImageManifest& m, uint64_t batch, uint64_t read_ahead);

// What a generate run will hold, in bytes. `fixed()` must fit the budget; the rest goes to the neuron cache.
struct MemoryPlan {
  uint64_t baseline = 0;           // the process before loading anything (code, libraries, heap): measured
  uint64_t dense = 0;              // dense_dram_bytes
  uint64_t ffn_resident = 0;       // gate rows (gate / threshold / lowrank) or the whole FFN (dense)
  uint64_t kv = 0;                 // kv_cache_bytes
  uint64_t scratch = 0;            // activations, logits, RoPE tables, attention rows, the FFN read staging
  uint64_t load_transient = 0;     // the largest region buffer held while loading (one FFN region, gate-row modes)
  uint64_t cache_bundle_cost = 0;  // DRAM per cached bundle (bytes + bookkeeping)
  uint32_t cache_bundles_per_layer = 0;
  uint64_t fixed() const { return baseline + dense + ffn_resident + kv + scratch + load_transient; }
  uint64_t cache_bytes(int n_layers) const {
    return uint64_t(cache_bundles_per_layer) * uint64_t(n_layers) * cache_bundle_cost;
  }
};

// kGateUpRows: the gate and the up rows (dReLU's exact selection: selection_keeps_up_rows).
enum class FfnResidency { kNone, kGateRows, kGateUpRows, kAll };

// The fixed part for this image, context and threads; the cache left at zero. `read_batch`: the FFN read batch,
// `read_ahead`: the read-ahead buffer (--overlap cross|both; 0 otherwise), `prefill_block`: tokens per prefill pass,
// `read_buffers`: batch buffers (kFfnOverlapReadBuffers under any --overlap but none, else 1).
MemoryPlan memory_plan(const ImageManifest& m, int context, FfnResidency ffn, int threads, uint64_t baseline,
                       uint64_t read_batch = kFfnReadBatchBytes, uint64_t read_ahead = 0,
                       int prefill_block = kPrefillBlockTokens, int read_buffers = 1);
// Neuron-cache bundles per layer that fit in `budget - plan.fixed()` (0 when nothing is left), at most hidden_dim.
uint32_t cache_bundles_for_budget(const MemoryPlan& plan, const ImageManifest& m, uint64_t budget);

}  // namespace nl
