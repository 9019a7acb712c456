// Predictor files (formats/predictor_file.h).
#include "formats/predictor_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <map>

#include "formats/core/error.h"
#include "formats/core/half.h"
#include "formats/model_source.h"
#include "formats/safetensors.h"

namespace nl {

PredictorFile::PredictorFile(const std::string& path, const ModelConfig& c) : path_(path), c_(c) {
  std::map<std::string, SafetensorsEntry> by_name;
  for (auto& e : safetensors_header(path, &data_start_)) by_name.emplace(e.name, e);
  for (int l = 0; l < c.n_layers; ++l) {
    for (int part = 0; part < 2; ++part) {
      const std::string name = "blk." + std::to_string(l) + (part ? ".fc2.weight" : ".fc1.weight");
      auto it = by_name.find(name);
      if (it == by_name.end()) throw InputError(path, "tensor '" + name + "' is missing (blk.{l}.fc1/fc2.weight)");
      const SafetensorsEntry& e = it->second;
      if (e.dtype != "F32" && e.dtype != "F16" && e.dtype != "BF16")
        throw InputError(path, "tensor '" + name + "' is " + e.dtype + " (F32, F16 or BF16)");
      if (e.shape.size() != 2) throw InputError(path, "tensor '" + name + "' is not 2-D");
      const uint64_t rank = part ? e.shape[1] : e.shape[0], other = part ? e.shape[0] : e.shape[1];
      const uint64_t want_other = uint64_t(part ? c.hidden_dim : c.dim);
      if (l == 0 && part == 0) {
        if (rank < 1 || rank > uint64_t(c.dim + c.hidden_dim))
          throw InputError(path, "tensor '" + name + "': rank " + std::to_string(rank) + " is out of range");
        rank_ = int(rank);
      }
      if (rank != uint64_t(rank_) || other != want_other)
        throw InputError(path,
                         "tensor '" + name + "' is [" + std::to_string(e.shape[0]) + "][" + std::to_string(e.shape[1]) +
                             "], expected " +
                             (part ? "[hidden " + std::to_string(c.hidden_dim) + "][rank " + std::to_string(rank_) + "]"
                                   : "[rank " + std::to_string(rank_) + "][dim " + std::to_string(c.dim) + "]"));
      (part ? fc2_ : fc1_).push_back({e.dtype, e.begin, e.end});
    }
  }
}

void PredictorFile::read(const Tensor& t, const std::string& name, uint64_t n, std::vector<float>* out) const {
  const uint64_t es = t.dtype == "F32" ? 4 : 2;
  std::vector<uint8_t> raw(size_t(n * es));
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw IoError(path_, errno_text("open"));
  uint64_t done = 0;
  while (done < raw.size()) {
    const ssize_t r = ::pread(fd, raw.data() + done, raw.size() - done, off_t(data_start_ + t.begin + done));
    if (r <= 0) {
      const std::string why = r < 0 ? errno_text("read") : "file ends early (truncated)";
      ::close(fd);
      if (r < 0) throw IoError(path_, why);
      throw InputError(path_, why);
    }
    done += uint64_t(r);
  }
  ::close(fd);
  out->resize(size_t(n));
  for (uint64_t k = 0; k < n; ++k) {
    if (es == 4) {
      std::memcpy(&(*out)[size_t(k)], raw.data() + 4 * k, 4);
    } else {
      uint16_t h;
      std::memcpy(&h, raw.data() + 2 * k, 2);
      (*out)[size_t(k)] = t.dtype == "F16" ? f16_to_f32(h) : bf16_to_f32(h);
    }
  }
  check_finite(path_, "tensor " + name, out->data(), n);
}

void PredictorFile::read_layer(int layer, std::vector<float>* fc1, std::vector<float>* fc2) const {
  const std::string pre = "blk." + std::to_string(layer);
  read(fc1_[size_t(layer)], pre + ".fc1.weight", uint64_t(rank_) * uint64_t(c_.dim), fc1);
  read(fc2_[size_t(layer)], pre + ".fc2.weight", uint64_t(c_.hidden_dim) * uint64_t(rank_), fc2);
}

}  // namespace nl
