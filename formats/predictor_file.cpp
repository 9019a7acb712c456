// Predictor files (formats/predictor_file.h).
#include "formats/predictor_file.h"

#include "formats/core/error.h"
#include "formats/gguf.h"

namespace nl {

namespace {
constexpr const char* kBlkNaming = "blk.{l}.fc1/fc2.weight";
constexpr const char* kTurboSparseNaming = "model.layers.{l}.mlp.predictor.fc1/fc2.weight";
}  // namespace

PredictorFile::~PredictorFile() = default;

const char* PredictorFile::naming() const { return turbosparse_ ? kTurboSparseNaming : kBlkNaming; }

std::string PredictorFile::name_of(int layer, bool fc2) const {
  const std::string l = std::to_string(layer);
  if (turbosparse_) return "model.layers." + l + ".mlp.predictor." + (fc2 ? "fc2" : "fc1") + ".weight";
  return "blk." + l + (fc2 ? ".fc2.weight" : ".fc1.weight");
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
  if (is_gguf_file(path)) {
    gguf_ = open_gguf_tensors(path);
    for (int l = 0; l < c.n_layers; ++l)
      for (int part = 0; part < 2; ++part) {
        const std::string name = name_of(l, part == 1);
        const std::vector<uint64_t> ne = gguf_->tensor_ne(name);
        if (ne.empty()) throw InputError(path, "tensor '" + name + "' is missing (" + naming() + ")");
        if (ne.size() != 2) throw InputError(path, "tensor '" + name + "' is not 2-D");
        check_shape(name, part == 1, ne[1], ne[0], l);
      }
    return;
  }
  st_ = open_safetensors_tensors(path);
  if (!st_->find(name_of(0, false))) {
    turbosparse_ = true;
    if (!st_->find(name_of(0, false)))
      throw InputError(st_->path(), "holds no predictor: neither blk.0.fc1.weight (PowerInfer's " +
                                        std::string(kBlkNaming) + ") nor " + name_of(0, false) + " (TurboSparse's " +
                                        kTurboSparseNaming + ")");
  }
  for (int l = 0; l < c.n_layers; ++l) {
    for (int part = 0; part < 2; ++part) {
      const std::string name = name_of(l, part == 1);
      const SafetensorsEntry* e = st_->find(name);
      if (!e) throw InputError(st_->path(), "tensor '" + name + "' is missing (" + naming() + ")");
      if (e->dtype != "F32" && e->dtype != "F16" && e->dtype != "BF16")
        throw InputError(st_->file_of(*e), "tensor '" + name + "' is " + e->dtype + " (F32, F16 or BF16)");
      if (e->shape.size() != 2) throw InputError(st_->file_of(*e), "tensor '" + name + "' is not 2-D");
      check_shape(name, part == 1, e->shape[0], e->shape[1], l);
    }
  }
}

void PredictorFile::write_to(ImageWriter& iw) const {
  std::vector<float> fc1, fc2;
  for (int l = 0; l < c_.n_layers; ++l) {
    read_layer(l, &fc1, &fc2);
    iw.add_predictor_layer(l, fc1.data(), fc2.data());
  }
}

void PredictorFile::read_layer(int layer, std::vector<float>* fc1, std::vector<float>* fc2) const {
  const uint64_t n1 = uint64_t(rank_) * uint64_t(c_.dim), n2 = uint64_t(c_.hidden_dim) * uint64_t(rank_);
  if (gguf_) {
    gguf_->load_tensor(name_of(layer, false), uint64_t(rank_), uint64_t(c_.dim), *fc1);
    gguf_->load_tensor(name_of(layer, true), uint64_t(c_.hidden_dim), uint64_t(rank_), *fc2);
    return;
  }
  fc1->resize(size_t(n1));
  fc2->resize(size_t(n2));
  st_->read_f32(*st_->find(name_of(layer, false)), 0, n1, fc1->data());
  st_->read_f32(*st_->find(name_of(layer, true)), 0, n2, fc2->data());
}

}  // namespace nl
