// GGUF model input (llama.cpp's file format, versions 2 and 3): `nl-layout pack --model model.gguf` and
// `nl-profile run --model model.gguf` read the Llama block from the files llama.cpp's converters write.
// Architectures: `llama` (gated SiLU FFN; llama.cpp writes Mistral and Llama checkpoints as it) and `smallthinker`
// with exactly one expert (llama.cpp's gated-ReLU block, the form scripts/gguf_from_image.py writes our ReLU
// models in). Tensor types F32, F16, BF16, Q8_0 and Q4_0, widened to f32 (a Q8_0 / Q4_0 image packed from them
// requantizes the dequantized values, which gives back the same blocks: checked by tests/check_gguf_in.py).
// docs/formats.md lists the keys and tensors read and what is refused.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "formats/model_source.h"

namespace nl {

// Parses the header (every key and tensor entry checked against the file size; InputError naming the file and the
// key or tensor); tensor data are read layer by layer later.
std::unique_ptr<ModelSource> open_gguf_source(const std::string& path);

// The tensors of any GGUF file (no model config implied): e.g. PowerInfer's predictor tensors blk.{l}.fc1 / fc2.
class GgufTensors {
 public:
  virtual ~GgufTensors() = default;
  // ne of tensor `name` (ne[0]: elements per row), empty when absent.
  virtual std::vector<uint64_t> tensor_ne(const std::string& name) const = 0;
  // Tensor `name` as f32 [rows][cols] (cols 0: a vector of `rows`): InputError naming it when absent, of another
  // shape, or of a type not read (F32, F16, BF16, Q8_0, Q4_0).
  virtual void load_tensor(const std::string& name, uint64_t rows, uint64_t cols, std::vector<float>& out) = 0;
};
std::unique_ptr<GgufTensors> open_gguf_tensors(const std::string& path);
// True when `path` is a regular file starting with GGUF's magic, or PowerInfer's PWRI (its sparse-model GGUFs).
bool is_gguf_file(const std::string& path);

}  // namespace nl
