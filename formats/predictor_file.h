// Activation predictors for `nl-layout pack --predictor FILE` (nl-run --select predictor): PowerInfer's form, per
// layer a two-layer ReLU MLP on the FFN input, score = fc2 relu(fc1 x), fc1 [rank][dim], fc2 [hidden][rank] (rows in
// the original neuron order). Read from PowerInfer's GGUF tensors `blk.{l}.fc1.weight` (ne [dim, rank]) and
// `blk.{l}.fc2.weight` (ne [rank, hidden]) in a GGUF file (their sparse-model GGUFs hold them beside the model), or
// from a safetensors file with the same names ([rank][dim], [hidden][rank]; F32, F16 or BF16); every layer the same
// rank.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "formats/core/image_writer.h"
#include "formats/core/model_weights.h"
#include "formats/safetensors.h"

namespace nl {

class GgufTensors;

class PredictorFile {
 public:
  // Checks every layer's two tensors against `c` (InputError naming the file and the tensor).
  PredictorFile(const std::string& path, const ModelConfig& c);
  ~PredictorFile();
  int rank() const { return rank_; }
  // Layer `layer`'s fc1 [rank][dim] and fc2 [hidden][rank] as f32.
  void read_layer(int layer, std::vector<float>* fc1, std::vector<float>* fc2) const;
  // Every layer into the image being written (after its FFN layers; spec.predictor_rank must be rank()).
  void write_to(ImageWriter& iw) const;

 private:
  std::string path_;
  ModelConfig c_;
  int rank_ = 0;
  // A safetensors file: its entries per layer and its descriptor (opened once every entry passed its checks).
  uint64_t data_start_ = 0;
  std::vector<SafetensorsEntry> fc1_, fc2_;
  int fd_ = -1;
  std::unique_ptr<GgufTensors> gguf_;  // a GGUF file: its tensors by name (fc1_ / fc2_ unused)
  void check_shape(const std::string& name, bool fc2, uint64_t rows, uint64_t cols, int layer);
  void read(const SafetensorsEntry& e, uint64_t n, std::vector<float>* out) const;
};

}  // namespace nl
