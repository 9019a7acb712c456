// Streaming writer of a flash image + manifest (format in formats/core/image.h, docs/formats.md). The caller hands
// it the dense tensors and then one FFN layer at a time, so a model larger than RAM packs while holding only one
// layer's FFN. Both outputs are atomic (temporary file, fsync, rename); the image is renamed first and the manifest
// second, so a crash in between leaves a pair whose image id disagrees, which readers refuse. Same inputs give
// byte-identical outputs (no timestamps, sorted JSON keys). Not thread-safe.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "formats/core/atomic_file.h"
#include "formats/core/image.h"

namespace nl {

// Progress of a long write: `done` of `total` units (the function that takes it says which), called from the
// writing thread after each unit (nl-layout pack shows it with nl::Progress).
using ProgressFn = std::function<void(uint64_t done, uint64_t total)>;

struct ImageSpec {
  ModelConfig config;
  ImageDtype dtype = ImageDtype::kF32;
  BundleKind bundle_kind = BundleKind::kGated;
  std::string tokenizer, source, source_format, layout, layout_method;
  std::vector<std::vector<uint32_t>> order;    // per layer slot -> original neuron; empty = identity everywhere
  std::vector<ImageCachePolicy> cache_policy;  // per layer (pinned as slots of `order`); empty = none recorded
  ImagePlanner planner;                        // the layout's planner settings; empty = none recorded
  std::vector<double> act_threshold;           // per layer CATS threshold; empty = none recorded
  int predictor_rank = 0;                      // a stored predictor (add_predictor_layer); 0 = none
  std::string predictor_source;
  PredictorInput predictor_input = PredictorInput::kFfnNorm;  // what it reads (residual: format 1.8)
};

// Why `d` cannot store a model of config `c` ("" when it can): quantized images need dim % 32 == 0 (every
// quantized row -- dense matrix rows, gate/up rows, down columns -- is `dim` long). Pack checks it before writing.
std::string image_dtype_problem(const ModelConfig& c, ImageDtype d);

// Storage error of an image against its fp32 source, per tensor kind ("embeddings", "attention.wq", "attention.wk",
// "attention.wv", "attention.wo", "norms", "classifier", "ffn.gate", "ffn.up", "ffn.down"): what pack reports.
struct StoredError {
  double err2 = 0, ref2 = 0;  // sums of (stored - source)^2 and source^2
  uint64_t elems = 0;
  // Relative RMS error: sqrt(err2 / ref2) (0 for an all-zero source stored exactly).
  double rel_rms() const;
};
using StoredErrors = std::map<std::string, StoredError>;
// The kind a dense tensor's name belongs to (see StoredError).
std::string dense_tensor_kind(const std::string& name);

class ImageWriter {
 public:
  // Manifest goes to manifest_path_for(image_path). Throws UsageError on a bad spec (config, order).
  ImageWriter(const std::string& image_path, ImageSpec spec);
  ~ImageWriter();

  // Dense tensors, fp32, exactly in image_dense_tensor_list(config) order.
  void add_dense(const std::string& name, const float* data, size_t elems);
  // FFN layer `layer` (layers in order 0, 1, ...), original neuron order, fp32, row-major:
  // gate [hidden][dim] (nullptr for plain bundles), up [hidden][dim], down [dim][hidden].
  void add_layer(int layer, const float* gate, const float* up, const float* down);
  // The stored predictor of layer `layer` (layers in order, after every FFN layer; spec.predictor_rank > 0): fc1
  // [rank][dim], fc2 [hidden][rank], fp32, original neuron order (fc2's rows are written in slot order).
  void add_predictor_layer(int layer, const float* fc1, const float* fc2);
  // Writes the header and the manifest and renames both into place. Returns the manifest written.
  ImageManifest commit();
  // Called after each FFN layer with (layers written, layers in the model).
  void set_progress(ProgressFn progress) { progress_ = std::move(progress); }
  // When set, every element written is decoded again and its error against the fp32 input added to `errors`.
  void set_error_stats(StoredErrors* errors) { errors_ = errors; }

 private:
  std::string image_path_;
  ImageManifest m_;
  std::unique_ptr<AtomicWriter> out_;
  size_t next_tensor_ = 0;
  int next_layer_ = 0;
  int next_predictor_ = 0;
  std::unique_ptr<Xxh64> predictor_hash_;
  Xxh64* dense_hash_ = nullptr;
  std::vector<char> scratch_;
  ProgressFn progress_;
  StoredErrors* errors_ = nullptr;
  std::vector<float> decoded_;

  void account(const std::string& kind, ImageDtype d, const float* src, const void* stored, size_t n);
};

// Adds w's dense tensors (embeddings, attention, norms, classifier) in the image's fixed order.
void image_add_dense_weights(ImageWriter& iw, const ModelWeights& w);

// Packs weights already in memory (every FFN matrix present): dense tensors, then each layer. spec.config is
// taken from `w`. Used by tests and by pack for models that fit in RAM.
ImageManifest image_write_model(const std::string& image_path, const ModelWeights& w, ImageSpec spec,
                                const ProgressFn& progress = {});

}  // namespace nl
