// Hugging Face checkpoints of the Llama family and OPT: a folder with `config.json` and `model.safetensors` (f32, f16
// or bf16). The reader converts to fp32 ModelWeights in the toolkit's canonical convention: HF applies RoPE with
// rotate_half (pair j with j + head_dim/2), llama2.c and runtime/model rotate interleaved pairs (2j, 2j+1), so
// the q/k projection rows are un-permuted at load, exactly inverting HF's convert_llama_weights_to_hf permute.
// The writer does the opposite, so llama2.c -> safetensors -> toolkit is lossless for f32.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "formats/core/model_weights.h"

namespace nl {

enum class TensorDtype { kF32, kF16, kBF16 };
// "f32" / "f16" / "bf16" (the CLI spelling); throws UsageError otherwise.
TensorDtype tensor_dtype_from_name(const std::string& name);

// One entry of a safetensors header, offsets relative to the start of the data section.
struct SafetensorsEntry {
  std::string name;
  std::string dtype;  // as stored: "F32", "F16", "BF16", ...
  std::vector<uint64_t> shape;
  uint64_t begin = 0, end = 0;
};

// Parses and validates a safetensors header: header length within the file, JSON well formed, every entry with a
// known dtype, offsets in range and matching its shape. Throws InputError naming the file.
std::vector<SafetensorsEntry> safetensors_header(const std::string& path, uint64_t* data_start = nullptr);
// Elements [first, first + n) of tensor `e` (F32, F16 or BF16) of the file `path` open as `fd`, whose data section
// starts at `data_start`, widened to fp32 and checked finite (InputError naming the file and the tensor).
void safetensors_read_f32(int fd, const std::string& path, uint64_t data_start, const SafetensorsEntry& e,
                          uint64_t first, uint64_t n, float* dst);

// The tensors of a safetensors file, or of a checkpoint's model.safetensors or model.safetensors.index.json and its
// shards (each shard must hold exactly the tensors the index places in it), by name, read as fp32 on demand. No model
// config implied: e.g. TurboSparse's predictor tensors (model.layers.{l}.mlp.predictor.fc1/fc2.weight) inside its
// checkpoint. Errors: InputError naming the file.
class SafetensorsTensors {
 public:
  // `tensors`: a .safetensors file, or (sharded) the index, whose folder holds the shards.
  SafetensorsTensors(const std::string& tensors, bool sharded);
  ~SafetensorsTensors();
  SafetensorsTensors(const SafetensorsTensors&) = delete;
  SafetensorsTensors& operator=(const SafetensorsTensors&) = delete;
  const std::string& path() const;  // the file, or the index of a sharded checkpoint (as messages name it)
  const SafetensorsEntry* find(const std::string& name) const;  // null when absent
  const std::string& file_of(const SafetensorsEntry& e) const;  // the file holding `e` (a shard when sharded)
  std::vector<std::string> names() const;                       // every tensor, sorted
  // Elements [first, first + n) of `e` as fp32 (checked finite).
  void read_f32(const SafetensorsEntry& e, uint64_t first, uint64_t n, float* dst) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};
// A .safetensors file alone, or a checkpoint (its folder, config.json or model.safetensors.index.json) as
// read_safetensors_model finds its tensors.
std::unique_ptr<SafetensorsTensors> open_safetensors_tensors(const std::string& path);

// Reads a checkpoint. `path` is the folder, its config.json, or its model.safetensors (config.json must sit
// beside it). Supported: model_type llama|mistral|bamboo (sliding_window; bamboo: TurboSparse, dReLU), hidden_act
// silu|relu|fatrelu (hidden_act_param)|drelu, num_key_value_heads, tie_word_embeddings, rope_theta, rms_norm_eps; no
// rope_scaling, no attention/MLP biases; and model_type opt (pre-LayerNorm, ReLU, with biases: docs/formats.md).
// Errors: InputError naming the file.
ModelWeights read_safetensors_model(const std::string& path);

// Writes `w` as a Hugging Face folder `dir` (created if missing): config.json + model.safetensors with HF tensor
// names (model.embed_tokens.weight, model.layers.{i}.self_attn.{q,k,v,o}_proj.weight, ...mlp.{gate,up,down}_proj
// .weight, ...input_layernorm.weight, ...post_attention_layernorm.weight, model.norm.weight, lm_head.weight
// unless tied). Both files are written atomically; the output is deterministic.
void write_safetensors_model(const std::string& dir, const ModelWeights& w, TensorDtype dtype = TensorDtype::kF32);

// Reads any supported model: a llama2.c `.bin`, or a Hugging Face folder / config.json / model.safetensors.
ModelWeights read_model(const std::string& path);

}  // namespace nl
