// GGUF model input (llama.cpp's file format, versions 2 and 3): `nl-layout pack --model model.gguf` and
// `nl-profile run --model model.gguf` read the Llama block from the files llama.cpp's converters write.
// Architectures: `llama` (gated SiLU FFN; llama.cpp writes Mistral and Llama checkpoints as it) and `smallthinker`
// with exactly one expert (llama.cpp's gated-ReLU block, the form scripts/gguf_from_image.py writes our ReLU
// models in). Tensor types F32, F16, BF16, Q8_0 and Q4_0, widened to f32 (a Q8_0 / Q4_0 image packed from them
// requantizes the dequantized values, which gives back the same blocks: checked by tests/check_gguf_in.py).
// docs/formats.md lists the keys and tensors read and what is refused.
#pragma once
#include <memory>
#include <string>

#include "formats/model_source.h"

namespace nl {

// Parses the header (every key and tensor entry checked against the file size; InputError naming the file and the
// key or tensor); tensor data are read layer by layer later.
std::unique_ptr<ModelSource> open_gguf_source(const std::string& path);

}  // namespace nl
