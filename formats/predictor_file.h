// Activation predictors for `nl-layout pack --predictor FILE` (nl-run --select predictor): PowerInfer's form, per
// layer a two-layer ReLU MLP on the FFN input, score = fc2 relu(fc1 x), fc1 [rank][dim], fc2 [hidden][rank] (rows in
// the original neuron order). Read from PowerInfer's GGUF tensors `blk.{l}.fc1.weight` (ne [dim, rank]) and
// `blk.{l}.fc2.weight` (ne [rank, hidden]) in a GGUF file (their sparse-model GGUFs hold them beside the model), or
// from a safetensors file with the same names ([rank][dim], [hidden][rank]; F32, F16 or BF16), or from a TurboSparse
// checkpoint (its folder, one file or sharded), whose BambooMLP holds the predictor as
// model.layers.{l}.mlp.predictor.fc1.weight / fc2.weight (its mask is round(sigmoid(score)), i.e. score > 0: nl-run
// --select predictor:0); every layer the same rank. Both projects feed the predictor the residual stream before the
// FFN's norm (PredictorInput::kResidual, `pack --predictor-input`).
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
class SafetensorsTensors;

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
  bool turbosparse_ = false;  // names model.layers.{l}.mlp.predictor.fc1/fc2.weight, else blk.{l}.fc1/fc2.weight
  std::unique_ptr<SafetensorsTensors> st_;  // a safetensors file or checkpoint: its tensors by name
  std::unique_ptr<GgufTensors> gguf_;       // a GGUF file: its tensors by name
  std::string name_of(int layer, bool fc2) const;
  const char* naming() const;  // the naming found, for messages
  void check_shape(const std::string& name, bool fc2, uint64_t rows, uint64_t cols, int layer);
};

}  // namespace nl
