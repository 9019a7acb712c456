// Streaming flash image writer: fixed layout computed up front, payload hashed as it is written, header last.
#include "formats/core/image_writer.h"

#include <cmath>
#include <cstring>
#include <utility>

#include "formats/core/error.h"

namespace nl {

namespace {
uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

std::string base_name(const std::string& p) {
  auto pos = p.find_last_of('/');
  return pos == std::string::npos ? p : p.substr(pos + 1);
}
}  // namespace

double StoredError::rel_rms() const { return ref2 > 0 ? std::sqrt(err2 / ref2) : (err2 > 0 ? INFINITY : 0.0); }

std::string dense_tensor_kind(const std::string& name) {
  const std::string leaf = name.substr(name.find_last_of('.') + 1);
  if (leaf == "tok_embeddings" || leaf == "pos_embeddings") return "embeddings";
  if (leaf == "wcls") return "classifier";
  if (leaf.rfind("rms_", 0) == 0 || leaf.find("norm_b") != std::string::npos) return "norms";
  if (leaf == "b_up" || leaf == "b_down") return "ffn.bias";
  return "attention." + leaf;
}

void ImageWriter::account(const std::string& kind, ImageDtype d, const float* src, const void* stored, size_t n) {
  decoded_.resize(n);
  image_decode(d, stored, n, decoded_.data());
  StoredError& e = (*errors_)[kind];
  for (size_t i = 0; i < n; ++i) {
    const double r = src[i], x = double(decoded_[i]) - r;
    e.err2 += x * x;
    e.ref2 += r * r;
  }
  e.elems += n;
}

std::string image_dtype_problem(const ModelConfig& c, ImageDtype d) {
  if (image_row_len_ok(d, size_t(c.dim))) return "";
  return std::string(image_dtype_name(d)) + " stores rows in blocks of 32 weights along dim, and dim " +
         std::to_string(c.dim) + " is not a multiple of 32 (use f32, f16 or bf16)";
}

ImageWriter::ImageWriter(const std::string& image_path, ImageSpec spec) : image_path_(image_path) {
  const ModelConfig& c = spec.config;
  if (std::string p = model_config_problem(c); !p.empty()) throw UsageError("cannot pack: model config: " + p);
  if (std::string p = image_dtype_problem(c, spec.dtype); !p.empty()) throw UsageError("cannot pack: " + p);
  m_.image_file = base_name(image_path);
  m_.config = c;
  m_.dtype = spec.dtype;
  if (!c.ffn_gated() && spec.bundle_kind != BundleKind::kPlain)
    throw UsageError(std::string("cannot pack: an ") + model_arch_name(c.arch) + " model has plain bundles");
  m_.bundle_kind = spec.bundle_kind;
  m_.bundle_bytes = image_bundle_bytes(spec.dtype, spec.bundle_kind, size_t(c.dim));
  m_.tokenizer = spec.tokenizer;
  m_.source = spec.source;
  m_.source_format = spec.source_format;
  m_.layout = spec.layout;
  m_.layout_method = spec.layout_method;
  if (spec.order.empty()) {
    spec.order.resize(size_t(c.n_layers));
    for (auto& o : spec.order) {
      o.resize(size_t(c.hidden_dim));
      for (uint32_t i = 0; i < o.size(); ++i) o[i] = i;
    }
  }
  if (spec.order.size() != size_t(c.n_layers)) throw UsageError("cannot pack: the layout has a different layer count");
  // Flash replication: an order longer than the layer holds n + r slots, each neuron once or twice (format 1.2).
  bool replicated = false;
  std::vector<uint32_t> replicas(spec.order.size(), 0);
  for (size_t l = 0; l < spec.order.size(); ++l) {
    const auto& o = spec.order[l];
    const size_t hidden = size_t(c.hidden_dim);
    if (o.size() < hidden || o.size() > 2 * hidden)
      throw UsageError("cannot pack: layout layer " + std::to_string(l) + " has " + std::to_string(o.size()) +
                       " slots, the model has " + std::to_string(c.hidden_dim) + " neurons");
    const std::string problem = image_order_problem(o, uint32_t(hidden), o.size() - hidden);
    if (!problem.empty()) throw UsageError("cannot pack: layout layer " + std::to_string(l) + problem);
    replicas[l] = uint32_t(o.size() - hidden);
    replicated = replicated || o.size() != hidden;
  }
  m_.order = std::move(spec.order);
  if (replicated) {
    m_.replicas = std::move(replicas);
    m_.version_minor = kImageVersionMinorReplicas;
  }
  if (!spec.cache_policy.empty() && spec.cache_policy.size() != size_t(c.n_layers))
    throw UsageError("cannot pack: the cache policy has a different layer count");
  for (size_t l = 0; l < spec.cache_policy.size(); ++l) {
    const std::string problem = image_cache_policy_problem(spec.cache_policy[l], m_.order[l], uint32_t(c.hidden_dim));
    if (!problem.empty()) throw UsageError("cannot pack: cache_policy[" + std::to_string(l) + "]" + problem);
  }
  m_.cache_policy = std::move(spec.cache_policy);
  m_.planner = std::move(spec.planner);
  if (!spec.act_threshold.empty() && spec.act_threshold.size() != size_t(c.n_layers))
    throw UsageError("cannot pack: the activation thresholds have a different layer count");
  for (double t : spec.act_threshold)
    if (!(t >= 0) || !std::isfinite(t))
      throw UsageError("cannot pack: an activation threshold is negative or not finite");
  m_.act_threshold = std::move(spec.act_threshold);
  if (!m_.act_threshold.empty()) m_.version_minor = kImageVersionMinorThresholds;  // the id covers them
  if (c.sliding_window > 0) m_.version_minor = kImageVersionMinorSlidingWindow;    // and this (it includes 1.2, 1.3)
  if (c.act == FfnAct::kFatRelu || c.act == FfnAct::kDRelu) m_.version_minor = kImageVersionMinorActivations;
  if (spec.predictor_rank < 0 || spec.predictor_rank > c.dim + c.hidden_dim)
    throw UsageError("cannot pack: predictor rank " + std::to_string(spec.predictor_rank) + " is out of range");
  m_.predictor_rank = spec.predictor_rank;
  m_.predictor_source = std::move(spec.predictor_source);
  if (m_.has_predictor()) {
    if (replicated) throw UsageError("cannot pack: a stored predictor with a replicated layout is not supported");
    m_.version_minor = kImageVersionMinorPredictor;
  }
  if (c.arch != ModelArch::kLlama) m_.version_minor = kImageVersionMinorArch;  // (it includes every earlier minor)
  m_.predictor_input = spec.predictor_input;
  if (m_.has_predictor() && m_.predictor_input != PredictorInput::kFfnNorm)
    m_.version_minor = kImageVersionMinorPredictorInput;

  // Fixed layout: header block, dense region, one region per layer, each aligned.
  m_.dense_tensors = image_dense_tensor_list(c, m_.dtype);
  uint64_t off = 0;
  for (auto& t : m_.dense_tensors) {
    off = align_up(off, kImageTensorAlign);
    t.offset = off;
    off += t.bytes();
  }
  m_.regions.push_back({"dense", -1, kImageAlign, off, 0});
  for (int l = 0; l < c.n_layers; ++l) {
    const ImageRegion& prev = m_.regions.back();
    m_.regions.push_back({"ffn." + std::to_string(l), l, align_up(prev.offset + prev.bytes, kImageAlign),
                          uint64_t(m_.n_slots(l)) * m_.bundle_bytes, 0});
  }
  if (m_.has_predictor()) {
    const ImageRegion& prev = m_.regions.back();
    m_.regions.push_back({"predictor", -1, align_up(prev.offset + prev.bytes, kImageAlign),
                          uint64_t(c.n_layers) * m_.predictor_layer_bytes(), 0});
  }
  m_.image_bytes = align_up(m_.regions.back().offset + m_.regions.back().bytes, kImageAlign);
  require_disk_space(image_path, m_.image_bytes, "the flash image");

  out_ = std::make_unique<AtomicWriter>(image_path);
  std::vector<char> header_block(kImageAlign, 0);  // real header written at commit, when checksums are known
  out_->write(header_block.data(), header_block.size());
  dense_hash_ = new Xxh64();
}

ImageWriter::~ImageWriter() { delete dense_hash_; }

void ImageWriter::add_dense(const std::string& name, const float* data, size_t elems) {
  if (next_tensor_ >= m_.dense_tensors.size() || m_.dense_tensors[next_tensor_].name != name)
    throw InternalError("ImageWriter: dense tensor '" + name + "' out of order");
  const DenseTensor& t = m_.dense_tensors[next_tensor_++];
  if (elems != t.elems())
    throw InternalError("ImageWriter: dense tensor '" + name + "' has " + std::to_string(elems) +
                        " elements, expected " + std::to_string(t.elems()));
  const uint64_t region_pos = out_->offset() - m_.regions[0].offset;
  std::vector<char> pad(t.offset - region_pos, 0);
  out_->write(pad.data(), pad.size());
  dense_hash_->update(pad.data(), pad.size());
  scratch_.resize(t.bytes());
  image_encode(t.dtype, data, elems, scratch_.data());  // quantized: cols % 32 == 0, so blocks never span rows
  if (errors_) account(dense_tensor_kind(name), t.dtype, data, scratch_.data(), elems);
  out_->write(scratch_.data(), scratch_.size());
  dense_hash_->update(scratch_.data(), scratch_.size());
  if (next_tensor_ == m_.dense_tensors.size()) m_.regions[0].xxh64 = dense_hash_->digest();
}

void ImageWriter::add_layer(int layer, const float* gate, const float* up, const float* down) {
  if (next_tensor_ != m_.dense_tensors.size()) throw InternalError("ImageWriter: FFN layer before all dense tensors");
  if (layer != next_layer_ || layer >= m_.config.n_layers)
    throw InternalError("ImageWriter: FFN layer " + std::to_string(layer) + " out of order");
  if ((m_.bundle_kind == BundleKind::kGated) != (gate != nullptr))
    throw InternalError("ImageWriter: gate matrix presence does not match the bundle kind");
  ++next_layer_;
  ImageRegion& r = m_.regions[size_t(1 + layer)];
  out_->pad_to(kImageAlign);
  if (out_->offset() != r.offset) throw InternalError("ImageWriter: region offset drifted");
  const size_t dim = size_t(m_.config.dim), hidden = size_t(m_.config.hidden_dim);
  // Down columns are strided in [dim][hidden]: transpose once so each bundle copies contiguous rows.
  std::vector<float> down_t(hidden * dim);
  for (size_t o = 0; o < dim; ++o)
    for (size_t n = 0; n < hidden; ++n) down_t[n * dim + o] = down[o * hidden + n];
  const size_t part = m_.bundle_part_bytes();
  Xxh64 h;
  // A few hundred bundles per write keeps syscalls few and memory flat.
  const size_t per_chunk = std::max<size_t>(1, (1u << 20) / m_.bundle_bytes);
  std::vector<char> chunk(per_chunk * m_.bundle_bytes);
  const auto& order = m_.order[size_t(layer)];
  const size_t n_slots = order.size();
  std::vector<uint8_t> written(hidden, 0);  // a replica's bundle repeats its first copy's bytes: not counted twice
  for (size_t s0 = 0; s0 < n_slots; s0 += per_chunk) {
    const size_t s1 = std::min(n_slots, s0 + per_chunk);
    char* p = chunk.data();
    for (size_t s = s0; s < s1; ++s) {
      const size_t n = order[s];
      StoredErrors* const errors = std::exchange(errors_, written[n]++ ? nullptr : errors_);
      if (gate) {
        image_encode(m_.dtype, gate + n * dim, dim, p);
        if (errors_) account("ffn.gate", m_.dtype, gate + n * dim, p, dim);
        p += part;
      }
      image_encode(m_.dtype, up + n * dim, dim, p);
      if (errors_) account("ffn.up", m_.dtype, up + n * dim, p, dim);
      p += part;
      image_encode(m_.dtype, down_t.data() + n * dim, dim, p);
      if (errors_) account("ffn.down", m_.dtype, down_t.data() + n * dim, p, dim);
      p += part;
      errors_ = errors;
    }
    const size_t bytes = size_t(p - chunk.data());
    out_->write(chunk.data(), bytes);
    h.update(chunk.data(), bytes);
  }
  r.xxh64 = h.digest();
  if (progress_) progress_(uint64_t(next_layer_), uint64_t(m_.config.n_layers));
}

void ImageWriter::add_predictor_layer(int layer, const float* fc1, const float* fc2) {
  if (!m_.has_predictor() || next_layer_ != m_.config.n_layers || layer != next_predictor_)
    throw InternalError("ImageWriter: predictor layer " + std::to_string(layer) + " out of order");
  ImageRegion& r = m_.regions[m_.predictor_region_index()];
  if (layer == 0) {
    out_->pad_to(kImageAlign);
    if (out_->offset() != r.offset) throw InternalError("ImageWriter: predictor region offset drifted");
    predictor_hash_ = std::make_unique<Xxh64>();
  }
  ++next_predictor_;
  const ImageDtype d = m_.predictor_dtype();
  const size_t dim = size_t(m_.config.dim), rank = size_t(m_.predictor_rank);
  const size_t rb1 = image_row_bytes(d, dim), rb2 = image_row_bytes(d, rank);
  scratch_.resize(size_t(m_.predictor_layer_bytes()));
  char* p = scratch_.data();
  for (size_t k = 0; k < rank; ++k, p += rb1) image_encode(d, fc1 + k * dim, dim, p);
  const auto& order = m_.order[size_t(layer)];  // slot s holds neuron order[s] (no replicas: checked above)
  for (size_t s = 0; s < order.size(); ++s, p += rb2) image_encode(d, fc2 + size_t(order[s]) * rank, rank, p);
  out_->write(scratch_.data(), scratch_.size());
  predictor_hash_->update(scratch_.data(), scratch_.size());
  if (next_predictor_ == m_.config.n_layers) r.xxh64 = predictor_hash_->digest();
}

ImageManifest ImageWriter::commit() {
  if (next_tensor_ != m_.dense_tensors.size() || next_layer_ != m_.config.n_layers ||
      (m_.has_predictor() && next_predictor_ != m_.config.n_layers))
    throw InternalError("ImageWriter: commit before every tensor and layer was written");
  out_->pad_to(kImageAlign);
  if (out_->offset() != m_.image_bytes) throw InternalError("ImageWriter: image size drifted");
  m_.image_id = image_id_of(m_);
  ImageHeader h{};
  std::memcpy(h.magic, kImageMagic, sizeof h.magic);
  h.version_major = kImageVersionMajor;
  h.version_minor = m_.version_minor;
  h.header_bytes = kImageHeaderBytes;
  h.alignment = uint32_t(kImageAlign);
  h.image_bytes = m_.image_bytes;
  h.image_id = m_.image_id;
  h.n_regions = uint32_t(m_.regions.size());
  out_->write_at(0, &h, sizeof h);
  out_->commit();
  write_file_atomic(manifest_path_for(image_path_), manifest_to_json(m_));
  return m_;
}

void image_add_dense_weights(ImageWriter& iw, const ModelWeights& w) {
  for (const DenseTensorSpec& t : dense_tensor_specs(w.config)) {
    const std::vector<float>& v = t.in(w);
    iw.add_dense(t.name, v.data(), v.size());
  }
}

ImageManifest image_write_model(const std::string& image_path, const ModelWeights& w, ImageSpec spec,
                                const ProgressFn& progress) {
  spec.config = w.config;
  if (!w.config.ffn_gated()) spec.bundle_kind = BundleKind::kPlain;  // (a Llama config may be written plain: I/O tests)
  ImageWriter iw(image_path, std::move(spec));
  iw.set_progress(progress);
  image_add_dense_weights(iw, w);
  for (size_t l = 0; l < w.layers.size(); ++l) {
    const LayerWeights& lw = w.layers[l];
    const size_t mat = size_t(w.config.hidden_dim) * size_t(w.config.dim);
    const bool gated = !lw.w_gate.empty();
    if ((gated && lw.w_gate.size() != mat) || lw.w_up.size() != mat || lw.w_down.size() != mat)
      throw InternalError("image_write_model: layer " + std::to_string(l) + " FFN matrices have the wrong size");
    iw.add_layer(int(l), gated ? lw.w_gate.data() : nullptr, lw.w_up.data(), lw.w_down.data());
  }
  return iw.commit();
}

}  // namespace nl
