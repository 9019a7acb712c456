// Trace format v1 (HDF5): per-layer activation bitmaps. The schema is a public contract, documented in
// docs/formats.md; readers refuse another format or a newer version with one clear message.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "formats/core/bitmask.h"

namespace nl {

inline constexpr const char* kTraceFormat = "neuralink-trace";
inline constexpr int64_t kTraceVersion = 1;

struct TraceInfo {
  std::string path;
  std::string model;
  std::string activation;  // the rule, e.g. "relu>0", "abs>0.0123", "synthetic"
  uint32_t n_layers = 0;
  uint64_t n_tokens = 0;
  std::vector<uint32_t> n_neurons;  // per layer
  std::vector<double> thresholds;   // per layer "threshold" attribute when present (empty otherwise)
  std::vector<int64_t> sequences;   // start token of each independent sequence; first is 0
  std::vector<int32_t> tokens;      // optional token ids (empty when absent)
};

struct TraceWriterOptions {
  std::string model;
  std::string activation;
  std::vector<uint32_t> n_neurons;  // per layer
  std::vector<double> thresholds;   // optional, per layer
  bool store_tokens = true;
  int deflate_level = 4;
  uint32_t block_tokens = 4096;  // tokens buffered in memory per flush (multiple of 64)
};

// Streams tokens into a trace file. Memory: n_neurons * block_tokens / 8 bytes per layer.
// The file is written under a temporary name and renamed into place by close(). Not thread-safe.
class TraceWriter {
 public:
  TraceWriter(const std::string& path, TraceWriterOptions opts);
  ~TraceWriter();
  TraceWriter(const TraceWriter&) = delete;
  TraceWriter& operator=(const TraceWriter&) = delete;

  // Marks the next token as the start of a new independent sequence (the first token always is).
  void begin_sequence();
  // Appends one token: active[l] lists the active neurons of layer l (any order, no duplicates needed).
  void add_token(const std::vector<std::vector<uint32_t>>& active, int32_t token_id = -1);
  // Appends whole layers of tokens at once (all layers must have the same n_tokens).
  void add_masks(const std::vector<LayerMask>& masks, const std::vector<int32_t>& token_ids = {});
  uint64_t n_tokens() const { return n_tokens_; }
  // Flushes, writes the token count and sequences, and renames the file into place.
  void close();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  uint64_t n_tokens_ = 0;
};

// Reads and validates a trace. Construction checks every attribute, the layer groups and the mask shapes;
// problems are InputError naming the file. Not thread-safe (HDF5 is serialised); share by reading layers first.
class TraceReader {
 public:
  explicit TraceReader(const std::string& path);
  ~TraceReader();
  TraceReader(const TraceReader&) = delete;
  TraceReader& operator=(const TraceReader&) = delete;

  const TraceInfo& info() const { return info_; }
  // The whole layer's mask.
  LayerMask read_layer(uint32_t layer) const;
  // Words [word_begin, word_begin + word_count) of every neuron row of `layer` (neuron-major, tightly packed),
  // for streaming over tokens in chunks. Bits past n_tokens in the last word are zero.
  std::vector<uint64_t> read_layer_words(uint32_t layer, uint64_t word_begin, uint64_t word_count) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  TraceInfo info_;
};

// Writes a complete trace in one call (synthetic generators, tests).
void trace_write(const std::string& path, const TraceWriterOptions& opts, const std::vector<LayerMask>& masks,
                 const std::vector<int64_t>& sequences, const std::vector<int32_t>& tokens = {});

}  // namespace nl
