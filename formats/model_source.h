// Streaming model input for packing: the config and dense tensors first, then one FFN layer at a time, each read
// with pread of just that layer's tensors, so a model larger than RAM packs while holding one layer's FFN; and the
// permuted export in the source's own format, streamed the same way.
// llama2.c `.bin` (formats/llama2c.h) and Hugging Face safetensors folders (formats/safetensors.h).
// Not thread-safe (one open file per source).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "formats/core/image_writer.h"
#include "formats/core/model_weights.h"

namespace nl {

class ModelSource {
 public:
  virtual ~ModelSource() = default;
  const ModelConfig& config() const { return config_; }
  const std::string& path() const { return path_; }
  // Every weight except the FFN matrices (w_gate, w_up, w_down left empty), fp32.
  virtual ModelWeights read_dense() = 0;
  // Layer `layer`'s w_gate [hidden][dim], w_up [hidden][dim], w_down [dim][hidden], fp32, original neuron order.
  virtual void read_ffn(int layer, LayerWeights* lw) = 0;
  // Writes the model in this source's format with each FFN layer's neurons in `order` (order[l][slot] = original
  // neuron; empty = identity): gate/up rows and down columns move together, so the model computes the same
  // function. llama2.c: a `.bin` file; safetensors: a folder (config.json + model.safetensors, f32). Streams: one
  // FFN matrix in memory at a time, every other tensor copied through in chunks. The bytes equal write_llama2c /
  // write_safetensors_model of the whole model permuted in memory. Atomic. progress(done, total) counts FFN
  // matrices written (3 per layer). Throws UsageError when `order` is not one permutation per layer.
  virtual void write_permuted(const std::string& out, const std::vector<std::vector<uint32_t>>& order,
                              const ProgressFn& progress = {}) = 0;

 protected:
  ModelConfig config_;
  std::string path_;
};

// Header checks happen here (InputError naming the file); nothing large is read yet.
std::unique_ptr<ModelSource> open_llama2c_source(const std::string& path);
std::unique_ptr<ModelSource> open_safetensors_source(const std::string& path);
// By path: a `.bin` file is llama2.c, anything else a Hugging Face folder / config.json / model.safetensors.
std::unique_ptr<ModelSource> open_model_source(const std::string& path);

// Weights must be finite: a NaN or Inf packs into an image that generates <unk> forever. InputError naming the file,
// `what` (a tensor) and the first bad element. Every model reader calls it on what it reads.
void check_finite(const std::string& path, const std::string& what, const float* v, uint64_t n, uint64_t first = 0);

// All of it in memory (readers built on the sources).
ModelWeights read_model_source(ModelSource& src);

// Writes the flash image + manifest from `src`: the dense tensors of `dense` (src.read_dense()), then one FFN layer
// at a time read from `src`, so peak memory is the dense weights plus one layer's FFN. spec.config is src's.
// progress(done, total) counts FFN layers written.
// errors: when given, the storage error of every tensor against the source is added (ImageWriter::set_error_stats).
// predictor: a stored activation predictor written after the FFN (spec.predictor_rank must be its rank).
class PredictorFile;
ImageManifest image_write_source(const std::string& image_path, ModelSource& src, const ModelWeights& dense,
                                 ImageSpec spec, const ProgressFn& progress = {}, StoredErrors* errors = nullptr,
                                 const PredictorFile* predictor = nullptr);

// The in-memory counterpart of write_permuted (every FFN matrix present), for tests and benchmarks:
// write_llama2c / write_safetensors_model of its result give write_permuted's bytes.
void ffn_permute(ModelWeights& w, const std::vector<std::vector<uint32_t>>& order);

// The Llama block's dense tensors (everything but the FFN), f32, by a source's own tensor names: name(role, layer)
// names the tensor of a role (embed, attn_norm, q, k, v, o, ffn_norm for layer >= 0; final_norm, output for -1) and
// load(name, rows, cols, out) reads it (cols 0: a vector). rotate_half_qk: q/k rows stored in rotate_half order
// (Hugging Face, llama.cpp's NEOX architectures), un-permuted to the canonical pairs.
using TensorLoad = std::function<void(const std::string& name, uint64_t rows, uint64_t cols, std::vector<float>& out)>;
ModelWeights read_llama_dense(const ModelConfig& c, const std::string& source,
                              const std::function<std::string(const char* role, int layer)>& name,
                              const TensorLoad& load, bool rotate_half_qk);

// q/k rows in rotate_half order (Hugging Face, and llama.cpp's NEOX-RoPE architectures: head h, half s, pair j at row
// h*hd + s*hd/2 + j) <-> the canonical interleaved rows (h*hd + 2j + s). to_hf = false un-permutes (reading), true
// permutes (writing). Partial rotary (Phi): only each head's first `rot` rows rotate (hd/2 above becomes rot/2), the
// rest stay; rot 0 = head_dim. A bias vector is rows of one column.
std::vector<float> permute_rope_rows(const std::vector<float>& w, int n_heads, int head_dim, int cols, bool to_hf,
                                     int rot = 0);

// Reads exactly n bytes at `offset` of `fd` (the file `path`): IoError on a read error, InputError when the file ends
// first. Every model reader's pread loop.
void pread_exact(int fd, const std::string& path, uint64_t offset, void* dst, uint64_t n);

// Shared by the sources' write_permuted (formats/ internals).
// Throws UsageError unless `order` is empty or holds one permutation of 0..hidden_dim-1 per layer.
void ffn_order_check(const std::vector<std::vector<uint32_t>>& order, const ModelConfig& c);
// Appends m [rows][cols] (fp32) to `out` with its rows in `order` (row s of the output = row order[s]; empty
// order = unchanged): gate and up matrices.
void write_rows_permuted(AtomicWriter& out, const std::vector<float>& m, size_t cols,
                         const std::vector<uint32_t>& order);
// Appends m [rows][cols] with its columns in `order` (output [r][s] = m[r][order[s]]): down matrices.
void write_cols_permuted(AtomicWriter& out, const std::vector<float>& m, size_t cols,
                         const std::vector<uint32_t>& order);

}  // namespace nl
