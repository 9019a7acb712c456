// Predictor files (formats/predictor_file.h).
#include "formats/predictor_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <map>

#include "formats/core/error.h"
#include "formats/gguf.h"

namespace nl {

PredictorFile::~PredictorFile() {
  if (fd_ >= 0) ::close(fd_);
}

// fc1 is [rank][dim], fc2 [hidden][rank]; the first fc1 sets the rank every other tensor must have.
void PredictorFile::check_shape(const std::string& name, bool fc2, uint64_t rows, uint64_t cols, int layer) {
  const uint64_t rank = fc2 ? cols : rows, other = fc2 ? rows : cols;
  if (layer == 0 && !fc2) {
    if (rank < 1 || rank > uint64_t(c_.dim + c_.hidden_dim))
      throw InputError(path_, "tensor '" + name + "': rank " + std::to_string(rank) + " is out of range");
    rank_ = int(rank);
  }
  if (rank != uint64_t(rank_) || other != uint64_t(fc2 ? c_.hidden_dim : c_.dim))
    throw InputError(
        path_, "tensor '" + name + "' is [" + std::to_string(rows) + "][" + std::to_string(cols) + "], expected " +
                   (fc2 ? "[hidden " + std::to_string(c_.hidden_dim) + "][rank " + std::to_string(rank_) + "]"
                        : "[rank " + std::to_string(rank_) + "][dim " + std::to_string(c_.dim) + "]"));
}

PredictorFile::PredictorFile(const std::string& path, const ModelConfig& c) : path_(path), c_(c) {
  auto name_of = [](int l, int part) { return "blk." + std::to_string(l) + (part ? ".fc2.weight" : ".fc1.weight"); };
  if (is_gguf_file(path)) {
    gguf_ = open_gguf_tensors(path);
    for (int l = 0; l < c.n_layers; ++l)
      for (int part = 0; part < 2; ++part) {
        const std::string name = name_of(l, part);
        const std::vector<uint64_t> ne = gguf_->tensor_ne(name);
        if (ne.empty()) throw InputError(path, "tensor '" + name + "' is missing (blk.{l}.fc1/fc2.weight)");
        if (ne.size() != 2) throw InputError(path, "tensor '" + name + "' is not 2-D");
        check_shape(name, part == 1, ne[1], ne[0], l);
      }
    return;
  }
  std::map<std::string, SafetensorsEntry> by_name;
  for (auto& e : safetensors_header(path, &data_start_)) by_name.emplace(e.name, e);
  for (int l = 0; l < c.n_layers; ++l) {
    for (int part = 0; part < 2; ++part) {
      const std::string name = name_of(l, part);
      auto it = by_name.find(name);
      if (it == by_name.end()) throw InputError(path, "tensor '" + name + "' is missing (blk.{l}.fc1/fc2.weight)");
      const SafetensorsEntry& e = it->second;
      if (e.dtype != "F32" && e.dtype != "F16" && e.dtype != "BF16")
        throw InputError(path, "tensor '" + name + "' is " + e.dtype + " (F32, F16 or BF16)");
      if (e.shape.size() != 2) throw InputError(path, "tensor '" + name + "' is not 2-D");
      check_shape(name, part == 1, e.shape[0], e.shape[1], l);
      (part ? fc2_ : fc1_).push_back(e);
    }
  }
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);  // last: nothing throws after it (the destructor closes it)
  if (fd_ < 0) throw IoError(path, errno_text("open"));
}

void PredictorFile::read(const SafetensorsEntry& e, uint64_t n, std::vector<float>* out) const {
  out->resize(size_t(n));
  safetensors_read_f32(fd_, path_, data_start_, e, 0, n, out->data());
}

void PredictorFile::write_to(ImageWriter& iw) const {
  std::vector<float> fc1, fc2;
  for (int l = 0; l < c_.n_layers; ++l) {
    read_layer(l, &fc1, &fc2);
    iw.add_predictor_layer(l, fc1.data(), fc2.data());
  }
}

void PredictorFile::read_layer(int layer, std::vector<float>* fc1, std::vector<float>* fc2) const {
  const std::string pre = "blk." + std::to_string(layer);
  if (gguf_) {
    gguf_->load_tensor(pre + ".fc1.weight", uint64_t(rank_), uint64_t(c_.dim), *fc1);
    gguf_->load_tensor(pre + ".fc2.weight", uint64_t(c_.hidden_dim), uint64_t(rank_), *fc2);
    return;
  }
  read(fc1_[size_t(layer)], uint64_t(rank_) * uint64_t(c_.dim), fc1);
  read(fc2_[size_t(layer)], uint64_t(c_.hidden_dim) * uint64_t(rank_), fc2);
}

}  // namespace nl
