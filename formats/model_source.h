// Streaming model input for packing: the config and dense tensors first, then one FFN layer at a time, each read
// with pread of just that layer's tensors, so a model larger than RAM packs while holding one layer's FFN.
// llama2.c `.bin` (formats/llama2c.h) and Hugging Face safetensors folders (formats/safetensors.h).
// Not thread-safe (one open file per source).
#pragma once
#include <memory>
#include <string>

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

 protected:
  ModelConfig config_;
  std::string path_;
};

// Header checks happen here (InputError naming the file); nothing large is read yet.
std::unique_ptr<ModelSource> open_llama2c_source(const std::string& path);
std::unique_ptr<ModelSource> open_safetensors_source(const std::string& path);
// By path: a `.bin` file is llama2.c, anything else a Hugging Face folder / config.json / model.safetensors.
std::unique_ptr<ModelSource> open_model_source(const std::string& path);

// All of it in memory (readers built on the sources).
ModelWeights read_model_source(ModelSource& src);

// Writes the flash image + manifest from `src`: the dense tensors of `dense` (src.read_dense()), then one FFN layer
// at a time read from `src`, so peak memory is the dense weights plus one layer's FFN. spec.config is src's.
ImageManifest image_write_source(const std::string& image_path, ModelSource& src, const ModelWeights& dense,
                                 ImageSpec spec);

}  // namespace nl
