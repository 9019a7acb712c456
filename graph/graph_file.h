// Co-activation graph file, HDF5, format "neuralink-graph" version 1 (docs/formats.md): per counted layer the
// per-neuron counts, top-k neighbour lists and optionally the full upper triangle. Lives in graph/ because its
// content is a LayerGraph. Readers validate every attribute and shape and refuse newer versions.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "graph/coactivation.h"

namespace nl {

inline constexpr const char* kGraphFormat = "neuralink-graph";
inline constexpr int64_t kGraphVersion = 1;

// The trace a graph counts (optional attributes; solve --graph records them in the layout as solve --trace does):
// its sha256 and model, and the token slice [token_begin, token_end) counted. A merge of slices of one trace keeps
// the sha256, and the slice when the inputs tile one contiguous range; a merge of different traces keeps neither.
struct GraphTraceRef {
  std::string sha256, model;
  bool has_range = false;
  uint64_t token_begin = 0, token_end = 0;
  // Layers the trace holds (0 = not recorded: files written before the attribute): solve --graph refuses files that
  // hold fewer layers than this instead of writing a partial layout.
  uint32_t n_layers = 0;
};

struct GraphFileInfo {
  std::string path;
  std::string source;     // what was counted (trace path, or "merge of ...")
  uint64_t n_tokens = 0;  // tokens counted (same for every layer)
  uint32_t top_k = 0;
  bool full = false;                // every layer stores its upper triangle (merging needs it)
  std::vector<uint32_t> layers;     // trace layer index of each stored layer, ascending
  std::vector<uint32_t> n_neurons;  // per stored layer
  GraphTraceRef trace;              // what was counted (empty for files written before these attributes)
};

// Writes layers one at a time (a full 16,384-neuron matrix is 512 MiB; nothing else is held). All layers must
// share n_tokens, k and whether the full matrix is present. The file appears only after close().
class GraphFileWriter {
 public:
  GraphFileWriter(const std::string& path, const std::string& source);
  ~GraphFileWriter();
  GraphFileWriter(const GraphFileWriter&) = delete;
  GraphFileWriter& operator=(const GraphFileWriter&) = delete;
  void add_layer(uint32_t layer, const LayerGraph& g);
  void set_trace(const GraphTraceRef& t);  // written at close()
  void close();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Opens and validates a graph file (attributes, layer groups, dataset shapes); read_layer() validates the
// lists' content. Problems are InputError naming the file. Not thread-safe.
class GraphFileReader {
 public:
  explicit GraphFileReader(const std::string& path);
  ~GraphFileReader();
  GraphFileReader(const GraphFileReader&) = delete;
  GraphFileReader& operator=(const GraphFileReader&) = delete;
  const GraphFileInfo& info() const { return info_; }
  // The i-th stored layer (not the trace layer index; see info().layers).
  LayerGraph read_layer(size_t i) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  GraphFileInfo info_;
};

// Sums graph files counted from disjoint token shards of one trace (or from trace shards of one model: the inputs'
// models must agree; slices of one trace must not overlap): n_tokens, freq and the full upper
// triangles add, and the top-k lists are rebuilt from the summed matrix (exact). Every input must store the
// full matrix (top-k lists alone cannot be merged exactly) and have the same layers and neuron counts.
// top_k: the output's k (default: the inputs' k, which must then agree). The output stores the full matrix.
// on_layer (optional) is called after each merged layer.
void graph_file_merge(const std::vector<std::string>& inputs, const std::string& out, std::optional<uint32_t> top_k,
                      const std::function<void()>& on_layer = {});

}  // namespace nl
