// DRAM accounting and the memory budget (runtime/memory.h).
#include "runtime/memory.h"

#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "formats/core/error.h"
#include "runtime/io/file.h"

namespace nl {

namespace {

// A "Key:   123 kB" line of a /proc file, in bytes; 0 when absent.
uint64_t proc_kb(const char* file, const char* key) {
  std::ifstream f(file);
  std::string line;
  const size_t n = std::strlen(key);
  while (std::getline(f, line))
    if (line.compare(0, n, key) == 0 && line.size() > n && line[n] == ':')
      return uint64_t(std::strtoull(line.c_str() + n + 1, nullptr, 10)) * 1024;
  return 0;
}

// The largest layer's FFN region: what one layer-token can read at most (staging) and the gate-row load's buffer.
uint64_t largest_ffn_region(const ImageManifest& m) {
  uint64_t r = 0;
  for (int l = 0; l < m.config.n_layers; ++l) r = std::max(r, m.ffn(l).bytes);
  return r;
}

uint64_t maxrss_bytes() {
  rusage ru{};
  return ::getrusage(RUSAGE_SELF, &ru) == 0 ? uint64_t(ru.ru_maxrss) * 1024 : 0;  // Linux: KiB
}

constexpr uint64_t kF32 = 4;
// Bookkeeping of one cached bundle beside its bytes in the layer's slab (FlashFfn::Slab): its entry's pointer, slot
// and free-list place.
constexpr uint64_t kCacheEntryOverhead = 16;
// Per layer and neuron: slot maps, the cache's state, the planner's arrays (a generous bound).
constexpr uint64_t kPerNeuronBookkeeping = 32;
// Per forward pass: the per-token counters and their metrics / JSON report at the end.
constexpr uint64_t kPerTokenReport = 1024;
// Allocator slack, the I/O engine, the report: a fixed allowance, plus per thread the touched stack and arena.
constexpr uint64_t kRuntimeAllowance = 1 << 20, kPerThreadAllowance = 256 << 10;

}  // namespace

uint64_t parse_memory_size(const std::string& s, const std::string& option) {
  auto bad = [&]() { return UsageError(option + ": '" + s + "' is not a size (e.g. 6GiB, 512MiB, 2GB, 80%)"); };
  if (s.empty()) throw bad();
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    throw bad();
  }
  if (!(v > 0) || !std::isfinite(v)) throw bad();
  std::string unit = s.substr(used);
  for (char& ch : unit) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  double mult = 0;
  if (unit.empty() || unit == "b")
    mult = 1;
  else if (unit == "k" || unit == "kib")
    mult = 1024.0;
  else if (unit == "m" || unit == "mib")
    mult = 1024.0 * 1024;
  else if (unit == "g" || unit == "gib")
    mult = 1024.0 * 1024 * 1024;
  else if (unit == "t" || unit == "tib")
    mult = 1024.0 * 1024 * 1024 * 1024;
  else if (unit == "kb")
    mult = 1e3;
  else if (unit == "mb")
    mult = 1e6;
  else if (unit == "gb")
    mult = 1e9;
  else if (unit == "tb")
    mult = 1e12;
  else if (unit == "%") {
    if (v > 100) throw UsageError(option + ": '" + s + "' is more than 100% of the available memory");
    const uint64_t avail = mem_available_bytes();
    if (!avail) throw UsageError(option + ": '" + s + "' needs MemAvailable from /proc/meminfo, which is unreadable");
    const double b = std::floor(double(avail) * v / 100.0);
    if (b < 1) throw UsageError(option + ": '" + s + "' of MemAvailable is less than one byte");
    return uint64_t(b);
  } else {
    throw bad();
  }
  const double b = std::floor(v * mult);
  if (b >= 1.8e19) throw bad();
  // A budget that rounds to nothing would read as "no budget" to callers: refused, never ignored.
  if (b < 1) throw UsageError(option + ": '" + s + "' is less than one byte");
  return uint64_t(b);
}

uint64_t mem_available_bytes() { return proc_kb("/proc/meminfo", "MemAvailable"); }

uint64_t current_rss_bytes() { return proc_kb("/proc/self/status", "VmRSS"); }

uint64_t peak_rss_bytes() {
  const uint64_t hwm = proc_kb("/proc/self/status", "VmHWM");
  return hwm ? hwm : maxrss_bytes();
}

uint64_t dense_dram_bytes(const ImageManifest& m) {
  // FlashImage::load_dense_store keeps the dense region as stored and widens the norm vectors to f32.
  uint64_t norms = 0;
  for (const DenseTensor& t : m.dense_tensors)
    if (image_dense_is_norm(t.rows)) norms += t.elems() * kF32;
  return io_align_up(m.dense().bytes) + norms;  // read_region pads the buffer to the I/O alignment
}

// --select gate / threshold / lowrank keep each layer's gate rows in the stored dtype (FlashFfn).
uint64_t gate_row_dram_bytes(const ImageManifest& m) { return image_row_bytes(m.dtype, size_t(m.config.dim)); }

// --select dense keeps every FFN region in DRAM as stored.
uint64_t ffn_dense_dram_bytes(const ImageManifest& m) {
  uint64_t b = 0;
  for (int l = 0; l < m.config.n_layers; ++l) b += io_align_up(m.ffn(l).bytes);
  return b;
}

uint64_t kv_cache_bytes(const ModelConfig& c, int context) {
  return 2 * uint64_t(c.n_layers) * uint64_t(context) * uint64_t(c.kv_dim()) * kF32;
}

uint64_t ffn_batch_staging_bytes(uint64_t bundle_bytes, uint64_t batch) {
  // A one-bundle read spans the bundle and at most one partial I/O block at each end.
  return io_align_up(std::max(batch, bundle_bytes + 2 * kIoBlock));
}

FfnStaging ffn_staging(const ImageManifest& m, uint64_t batch, uint64_t read_ahead) {
  // A layer-token's reads lie inside its region's blocks; a region need not start on a block.
  const uint64_t most = io_align_up(largest_ffn_region(m)) + 2 * kIoBlock;
  FfnStaging s;
  s.batch = std::min(ffn_batch_staging_bytes(m.bundle_bytes, batch), most);  // most >= one bundle's piece
  s.read_ahead = std::min(read_ahead, most);
  return s;
}

MemoryPlan memory_plan(const ImageManifest& m, int context, FfnResidency ffn, int threads, uint64_t baseline,
                       uint64_t read_batch, uint64_t read_ahead, int prefill_block, int read_buffers) {
  const ModelConfig& c = m.config;
  const uint64_t dim = uint64_t(c.dim), hid = uint64_t(c.hidden_dim), L = uint64_t(c.n_layers);
  const uint64_t ctx = uint64_t(context), vocab = uint64_t(c.vocab_size);
  MemoryPlan p;
  p.baseline = baseline;
  p.dense = dense_dram_bytes(m);
  if (ffn == FfnResidency::kGateRows) p.ffn_resident = L * hid * gate_row_dram_bytes(m);
  if (ffn == FfnResidency::kGateUpRows) p.ffn_resident = 2 * L * hid * gate_row_dram_bytes(m);
  if (ffn == FfnResidency::kAll) p.ffn_resident = ffn_dense_dram_bytes(m);
  // OPT: FlashFfn's copies of fc1's bias by slot and by gate row, and DenseBundles' under --select dense.
  if (c.has_biases())
    for (int l = 0; l < c.n_layers; ++l)
      p.ffn_resident += (uint64_t(m.n_slots(l)) + hid + (ffn == FfnResidency::kAll ? hid : 0)) * kF32;
  p.kv = kv_cache_bytes(c, context);
  // Model activations (x, xb, q, attention out, tmp; k, v), logits, RoPE tables, one attention row per thread,
  // the FFN's gate/up rows, the sampler's candidate list (token, double), the FFN read staging (one batch buffer,
  // two under --overlap, and the read-ahead buffer under --overlap cross|both) and per active neuron its pointer and
  // coefficient.
  const FfnStaging fs = ffn_staging(m, read_batch, read_ahead);
  const uint64_t staging =
      ffn == FfnResidency::kAll ? 0 : uint64_t(std::max(1, read_buffers)) * fs.batch + io_align_up(fs.read_ahead);
  p.scratch = kF32 * (5 * dim + 2 * uint64_t(c.kv_dim()) + vocab + ctx * uint64_t(c.head_dim()) +
                      uint64_t(std::max(1, threads)) * ctx + 4 * hid + 3 * dim) +
              16 * vocab + staging + 16 * hid + L * hid * kPerNeuronBookkeeping + ctx * kPerTokenReport +
              kRuntimeAllowance + uint64_t(std::max(1, threads)) * kPerThreadAllowance;
  // A prefill pass's further tokens: their activations (as above), each one's gate outputs and active list.
  const uint64_t block = uint64_t(std::min(std::max(1, prefill_block), std::max(1, context)));
  p.scratch += kF32 * (block - 1) * (5 * dim + 2 * uint64_t(c.kv_dim()) + 2 * hid);
  // The dense region is read straight into its store (counted in `dense`); gate-row modes read one FFN region at a
  // time to copy its gate rows out, --select dense keeps its regions (counted in `ffn_resident`).
  p.load_transient = ffn == FfnResidency::kGateRows || ffn == FfnResidency::kGateUpRows ? largest_ffn_region(m) : 0;
  p.cache_bundle_cost = m.bundle_bytes + kCacheEntryOverhead;
  return p;
}

uint32_t cache_bundles_for_budget(const MemoryPlan& plan, const ImageManifest& m, uint64_t budget) {
  if (budget <= plan.fixed()) return 0;
  // One more layer's worth: the pool that holds a token's admissions while evicted hits of the same token wait to be
  // computed (FlashFfn::pool_, at most one layer's capacity).
  const uint64_t per_layer = (budget - plan.fixed()) / uint64_t(std::max(1, m.config.n_layers) + 1);
  return uint32_t(std::min<uint64_t>(per_layer / plan.cache_bundle_cost, uint64_t(m.config.hidden_dim)));
}

}  // namespace nl
