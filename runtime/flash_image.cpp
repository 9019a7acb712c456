// Opening a flash image: manifest, header, region checksums, dense weights (runtime/flash_image.h).
#include "runtime/flash_image.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "formats/core/atomic_file.h"
#include "formats/core/error.h"
#include "formats/core/quant.h"
#include "runtime/model/typed_kernels.h"

namespace nl {

namespace {
bool ends_with(const std::string& s, const std::string& suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}
}  // namespace

FlashImage::FlashImage(const std::string& path, const IoOptions& io) {
  if (ends_with(path, ".json")) {
    manifest_path_ = path;
    m_ = manifest_load(manifest_path_);
    image_path_ = image_path_from_manifest(manifest_path_, m_);
  } else {
    image_path_ = path;
    manifest_path_ = manifest_path_for(path);
    m_ = manifest_load(manifest_path_);
  }
  struct stat st {};
  if (::stat(image_path_.c_str(), &st) != 0) throw IoError(image_path_, errno_text("cannot open image"));
  const uint64_t file_bytes = uint64_t(st.st_size);
  io_ = io_open(image_path_, io);
  ImageHeader h{};
  if (file_bytes < kImageAlign) {
    if (file_bytes >= sizeof h) {  // a header without the rest: read it buffered for a precise message
      std::string head = read_file(image_path_, kImageAlign);
      std::memcpy(&h, head.data(), sizeof h);
    }
    image_check_header(image_path_, m_, h, file_bytes);
    throw InputError(image_path_, "truncated: " + std::to_string(file_bytes) + " bytes");
  }
  AlignedBuffer block(kImageAlign);
  ReadSpan span{0, kImageAlign, block.data()};
  io_->read(&span, 1);
  std::memcpy(&h, block.data(), sizeof h);
  image_check_header(image_path_, m_, h, file_bytes);
  verified_.assign(m_.regions.size(), 0);
}

uint64_t FlashImage::read_region(size_t index, AlignedBuffer* buf) {
  const ImageRegion& r = m_.regions.at(index);
  const uint64_t bytes = io_align_up(r.bytes);  // regions are padded to the alignment, so this stays in the file
  buf->resize_uninit(bytes);                    // the read below fills every byte (or throws)
  // Large regions in 8 MiB pieces: the engines see reads of a realistic size.
  constexpr uint64_t kPiece = 8u << 20;
  std::vector<ReadSpan> spans;
  for (uint64_t o = 0; o < bytes; o += kPiece)
    spans.push_back({r.offset + o, std::min(kPiece, bytes - o), buf->data() + o});
  io_->read(spans.data(), spans.size());
  const uint64_t got = xxh64_of(buf->data(), r.bytes);
  if (got != r.xxh64)
    throw InputError(image_path_, "checksum mismatch in region '" + r.name + "' (xxh64 " + hex64(got) +
                                      ", manifest says " + hex64(r.xxh64) + "): the image is corrupt");
  verified_[index] = 1;
  return bytes;
}

std::vector<std::vector<uint64_t>> FlashImage::bundle_sums() {
  std::vector<std::vector<uint64_t>> sums(size_t(m_.config.n_layers));
  AlignedBuffer buf;
  for (int l = 0; l < m_.config.n_layers; ++l) {
    read_region(size_t(1 + l), &buf);
    const uint32_t n = m_.n_slots(l);
    sums[size_t(l)].resize(n);
    for (uint32_t s = 0; s < n; ++s)
      sums[size_t(l)][s] = xxh3_of(buf.data() + uint64_t(s) * m_.bundle_bytes, m_.bundle_bytes);
  }
  return sums;
}

void FlashImage::verify_all() {
  AlignedBuffer buf;
  for (size_t i = 0; i < m_.regions.size(); ++i)
    if (!verified_[i]) read_region(i, &buf);
}

namespace {
// NaN/Inf weights make every logit NaN (a model that prints <unk> forever): pack refuses them; the loaders check
// what they decode anyway (all of load_dense, the norms of load_dense_store) in case an image predates that.
void check_finite_weights(const std::string& path, const std::string& name, const std::vector<float>& v) {
  for (size_t i = 0; i < v.size(); ++i)
    if (!std::isfinite(v[i]))
      throw InputError(path, "dense tensor '" + name + "' element " + std::to_string(i) + " is " +
                                 (std::isnan(v[i]) ? "NaN" : "infinite") + ": weights must be finite (re-pack)");
}
}  // namespace

ModelWeights FlashImage::load_dense() {
  AlignedBuffer buf;
  read_region(0, &buf);
  const ModelConfig& c = m_.config;
  ModelWeights w;
  w.config = c;
  w.source = image_path_;
  auto get = [&](const std::string& name, std::vector<float>* out) {
    const DenseTensor* t = m_.find_tensor(name);
    if (!t) throw InputError(manifest_path_, "dense tensor '" + name + "' missing");
    out->resize(t->elems());
    image_decode(t->dtype, buf.data() + t->offset, t->elems(), out->data());
    check_finite_weights(image_path_, name, *out);
  };
  w.layers.resize(size_t(c.n_layers));
  for (const DenseTensorSpec& t : dense_tensor_specs(c)) get(t.name, &t.in(w));
  return w;
}

std::unique_ptr<DenseStore> FlashImage::load_dense_store() {
  auto st = std::make_unique<DenseStore>();
  read_region(0, &st->bytes);
  const ModelConfig& c = m_.config;
  const uint64_t region = m_.dense().bytes;
  auto find = [&](const std::string& name, uint64_t rows, uint64_t cols) -> const DenseTensor& {
    const DenseTensor* t = m_.find_tensor(name);
    if (!t) throw InputError(manifest_path_, "dense tensor '" + name + "' missing");
    if (t->rows != rows || t->cols != cols)
      throw InputError(manifest_path_, "dense tensor '" + name + "' is " + std::to_string(t->rows) + "x" +
                                           std::to_string(t->cols) + ", the config implies " + std::to_string(rows) +
                                           "x" + std::to_string(cols));
    const ImageDtype dt = t->dtype;  // the manifest's per-tensor dtype (image_dense_dtype)
    if (image_dtype_quantized(dt) && cols % kQuantBlock != 0)
      throw InputError(manifest_path_, "dense tensor '" + name + "' has " + std::to_string(cols) +
                                           " columns, not a multiple of 32 (" + image_dtype_name(dt) + ")");
    if (t->offset > region || rows * image_row_bytes(dt, cols) > region - t->offset)
      throw InputError(manifest_path_, "dense tensor '" + name + "' lies outside the dense region");
    return *t;
  };
  auto matrix = [&](const std::string& name, int rows, int cols) {
    const DenseTensor& t = find(name, uint64_t(rows), uint64_t(cols));
    const ImageDtype dt = t.dtype;
    WeightView v{dt, st->bytes.data() + t.offset, rows, cols, image_row_bytes(dt, size_t(cols))};
    // Matrices only matmul reads (not the embedding table) in the active kernel path's fastest q8_0 layout: the
    // store owns these bytes, already verified against the manifest's checksum.
    if (name != "tok_embeddings") kernels::q8_interleave_if_pays(&v);
    return v;
  };
  ModelView& v = st->view;
  v.config = c;
  v.source = image_path_;
  v.tok_embeddings = matrix("tok_embeddings", c.vocab_size, c.dim);
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    LayerView lv;
    lv.wq = matrix(p + "wq", c.dim, c.dim);
    lv.wk = matrix(p + "wk", c.kv_dim(), c.dim);
    lv.wv = matrix(p + "wv", c.kv_dim(), c.dim);
    lv.wo = matrix(p + "wo", c.dim, c.dim);
    v.layers.push_back(lv);
  }
  // The vectors (norm weights, biases), widened to f32 and kept; st->norms holds them all (pointers stay valid).
  const std::vector<DenseTensorSpec> specs = dense_tensor_specs(c);
  st->norms.reserve(size_t(std::count_if(specs.begin(), specs.end(), [](const auto& t) { return t.rows == 1; })));
  for (const DenseTensorSpec& t : specs) {
    if (t.rows != 1) continue;
    const DenseTensor& d = find(t.name, 1, t.cols);
    std::vector<float> vec(size_t(t.cols));
    image_decode(d.dtype, st->bytes.data() + d.offset, vec.size(), vec.data());
    check_finite_weights(image_path_, t.name, vec);
    st->norms.push_back(std::move(vec));
    set_view_vector(v, t, st->norms.back().data());
  }
  v.classifier = c.shared_classifier ? v.tok_embeddings : matrix("wcls", c.vocab_size, c.dim);
  if (c.learned_positions()) {
    const DenseTensor& t = find("pos_embeddings", uint64_t(c.seq_len + kOptPositionOffset), uint64_t(c.dim));
    v.pos_embeddings = {t.dtype, st->bytes.data() + t.offset, c.seq_len + kOptPositionOffset, c.dim,
                        image_row_bytes(t.dtype, size_t(c.dim))};  // rows read by dequantize_row: never interleaved
  }
  return st;
}

void FlashImage::load_ffn_layer(int layer, LayerWeights* lw) {
  AlignedBuffer buf;
  read_region(size_t(1 + layer), &buf);
  const size_t dim = size_t(m_.config.dim), hidden = size_t(m_.config.hidden_dim);
  const size_t part = m_.bundle_part_bytes();
  const bool gated = m_.bundle_kind == BundleKind::kGated;
  lw->w_gate.assign(gated ? hidden * dim : 0, 0.0f);
  lw->w_up.assign(hidden * dim, 0.0f);
  lw->w_down.assign(dim * hidden, 0.0f);
  std::vector<float> col(dim);
  const auto& order = m_.order[size_t(layer)];
  for (size_t s = 0; s < order.size(); ++s) {  // a replica decodes to its first copy's values (the same bytes)
    const uint8_t* b = buf.data() + s * m_.bundle_bytes;
    const size_t n = order[s];
    if (gated) {
      image_decode(m_.dtype, b, dim, lw->w_gate.data() + n * dim);
      b += part;
    }
    image_decode(m_.dtype, b, dim, lw->w_up.data() + n * dim);
    b += part;
    image_decode(m_.dtype, b, dim, col.data());
    for (size_t o = 0; o < dim; ++o) lw->w_down[o * hidden + n] = col[o];
  }
}

}  // namespace nl
