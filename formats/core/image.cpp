// Flash image manifest: JSON form, validation, header checks, checksums, dtype conversion.
#include "formats/core/image.h"

#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "formats/core/atomic_file.h"
#include "formats/core/enum_names.h"
#include "formats/core/error.h"
#include "formats/core/half.h"
#include "formats/core/quant.h"

namespace nl {

using json = nlohmann::json;

namespace {
constexpr EnumName<ImageDtype> kImageDtypeNames[] = {{ImageDtype::kF32, "f32"},
                                                     {ImageDtype::kF16, "f16"},
                                                     {ImageDtype::kBF16, "bf16"},
                                                     {ImageDtype::kQ8_0, "q8_0"},
                                                     {ImageDtype::kQ4_0, "q4_0"}};
}  // namespace

const char* image_dtype_name(ImageDtype d) { return enum_name(kImageDtypeNames, d); }

bool image_dtype_parse(const std::string& s, ImageDtype* out) { return enum_parse(kImageDtypeNames, s, out); }

constexpr EnumName<PredictorInput> kPredictorInputNames[] = {{PredictorInput::kFfnNorm, "ffn_norm"},
                                                             {PredictorInput::kResidual, "residual"}};
const char* predictor_input_name(PredictorInput p) { return enum_name(kPredictorInputNames, p); }
bool predictor_input_parse(const std::string& s, PredictorInput* out) {
  return enum_parse(kPredictorInputNames, s, out);
}

const char* bundle_kind_name(BundleKind k) { return k == BundleKind::kGated ? "gated" : "plain"; }

const DenseTensor* ImageManifest::find_tensor(const std::string& name) const {
  for (const auto& t : dense_tensors)
    if (t.name == name) return &t;
  return nullptr;
}

std::vector<DenseTensor> image_dense_tensor_list(const ModelConfig& c, ImageDtype d) {
  std::vector<DenseTensor> v;
  for (const DenseTensorSpec& t : dense_tensor_specs(c))
    v.push_back({t.name, 0, t.rows, t.cols, image_dense_dtype(d, t.rows)});
  return v;
}

// ---- checksums -------------------------------------------------------------------------------------------

Xxh64::Xxh64() : state_(XXH64_createState()) {
  if (!state_) throw InternalError("out of memory for a checksum state");
  XXH64_reset(static_cast<XXH64_state_t*>(state_), 0);
}
Xxh64::~Xxh64() { XXH64_freeState(static_cast<XXH64_state_t*>(state_)); }
void Xxh64::update(const void* p, size_t n) { XXH64_update(static_cast<XXH64_state_t*>(state_), p, n); }
uint64_t Xxh64::digest() const { return XXH64_digest(static_cast<const XXH64_state_t*>(state_)); }
uint64_t xxh64_of(const void* p, size_t n) { return XXH64(p, n, 0); }
uint64_t xxh3_of(const void* p, size_t n) { return XXH3_64bits(p, n); }

std::string hex64(uint64_t v) {
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
  return b;
}

uint64_t image_id_of(const std::vector<ImageRegion>& regions) {
  Xxh64 h;
  for (const auto& r : regions) {
    h.update(r.name.data(), r.name.size());
    uint64_t f[3] = {r.offset, r.bytes, r.xxh64};
    h.update(f, sizeof f);
  }
  return h.digest();
}

uint64_t image_id_of(const ImageManifest& m) {
  if (m.version_major == 1 && m.version_minor == 0) return image_id_of(m.regions);
  // Fixed-width little-endian fields and length-prefixed names: no two different manifests encode alike.
  std::vector<uint8_t> b;
  auto u64 = [&b](uint64_t v) {
    for (int i = 0; i < 8; ++i) b.push_back(uint8_t(v >> (8 * i)));
  };
  auto str = [&](const std::string& s) {
    u64(s.size());
    b.insert(b.end(), s.begin(), s.end());
  };
  for (const auto& r : m.regions) {
    str(r.name);
    u64(r.offset);
    u64(r.bytes);
    u64(r.xxh64);
  }
  const ModelConfig& c = m.config;
  str("model");
  for (int v : {c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads, c.vocab_size, c.seq_len}) u64(uint64_t(v));
  u64(std::bit_cast<uint32_t>(c.rope_theta));
  u64(std::bit_cast<uint32_t>(c.norm_eps));
  u64(uint64_t(c.act));
  u64(c.shared_classifier ? 1 : 0);
  if (c.sliding_window > 0) {  // 1.4 (kImageVersionMinorSlidingWindow); absent from other images' ids
    str("sliding_window");
    u64(uint64_t(c.sliding_window));
  }
  if (c.arch != ModelArch::kLlama) {  // 1.7 (kImageVersionMinorArch); absent from Llama images' ids
    str("arch");
    str(model_arch_name(c.arch));
  }
  if (c.rope_dims > 0) {  // 1.7: Phi's partial rotary
    str("rope_dims");
    u64(uint64_t(c.rope_dims));
  }
  if (c.act == FfnAct::kFatRelu) {  // 1.5 (kImageVersionMinorActivations)
    str("fatrelu_threshold");
    u64(std::bit_cast<uint32_t>(c.fatrelu_threshold));
  }
  str(image_dtype_name(m.dtype));
  str(bundle_kind_name(m.bundle_kind));
  u64(m.bundle_bytes);
  str("dense_tensors");
  u64(m.dense_tensors.size());
  for (const auto& t : m.dense_tensors) {
    str(t.name);
    u64(t.offset);
    u64(t.rows);
    u64(t.cols);
    str(image_dtype_name(t.dtype));
  }
  str("order");
  u64(m.order.size());
  if (!m.replicas.empty()) {  // 1.2: absent from unreplicated manifests, whose ids stay as they were
    str("replicas");
    for (uint32_t r : m.replicas) u64(r);
  }
  // 1.3: the CATS thresholds, as double bits (absent when none are recorded, so the id of an image without them is
  // that of 1.1 / 1.2; deleting recorded thresholds changes the id all the same).
  if (m.version_minor >= kImageVersionMinorThresholds && !m.act_threshold.empty()) {
    str("act_threshold");
    u64(m.act_threshold.size());
    for (double t : m.act_threshold) u64(std::bit_cast<uint64_t>(t));
  }
  if (m.has_predictor()) {  // 1.6: the predictor's shape (its bytes are the region's checksum)
    str("predictor");
    u64(uint64_t(m.predictor_rank));
    str(image_dtype_name(m.predictor_dtype()));
    if (m.predictor_input != PredictorInput::kFfnNorm) {  // 1.8; absent from the ids of ffn_norm predictors
      str("predictor_input");
      str(predictor_input_name(m.predictor_input));
    }
  }
  Xxh64 h;
  h.update(b.data(), b.size());
  for (const auto& o : m.order) {
    const uint64_t n = o.size();
    h.update(&n, sizeof n);
    h.update(o.data(), o.size() * sizeof(uint32_t));
  }
  return h.digest();
}

// ---- dtype -----------------------------------------------------------------------------------------------

void image_encode(ImageDtype d, const float* src, size_t n, void* dst) {
  if (d == ImageDtype::kQ8_0) return quantize_row_q8_0(src, static_cast<BlockQ8_0*>(dst), n);
  if (d == ImageDtype::kQ4_0) return quantize_row_q4_0(src, static_cast<BlockQ4_0*>(dst), n);
  if (d == ImageDtype::kF32) {
    std::memcpy(dst, src, n * 4);
    return;
  }
  auto* o = static_cast<uint16_t*>(dst);
  if (d == ImageDtype::kF16)
    for (size_t i = 0; i < n; ++i) o[i] = f32_to_f16(src[i]);
  else
    for (size_t i = 0; i < n; ++i) o[i] = f32_to_bf16(src[i]);
}

void image_decode(ImageDtype d, const void* src, size_t n, float* dst) {
  if (d == ImageDtype::kQ8_0) return dequantize_row_q8_0(static_cast<const BlockQ8_0*>(src), dst, n);
  if (d == ImageDtype::kQ4_0) return dequantize_row_q4_0(static_cast<const BlockQ4_0*>(src), dst, n);
  if (d == ImageDtype::kF32) {
    std::memcpy(dst, src, n * 4);
    return;
  }
  const auto* s = static_cast<const uint16_t*>(src);
  if (d == ImageDtype::kF16)
    for (size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
  else
    for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
}

// ---- JSON ------------------------------------------------------------------------------------------------

std::string image_order_problem(const std::vector<uint32_t>& o, uint32_t hidden, uint64_t r) {
  if (o.size() != size_t(hidden) + r)
    return " has " + std::to_string(o.size()) + " entries, expected " + std::to_string(hidden) +
           (r ? " neurons + " + std::to_string(r) + " replicas" : "");
  std::vector<uint8_t> copies(size_t(hidden), 0);
  for (uint32_t n : o) {
    if (n >= copies.size())
      return ": neuron " + std::to_string(n) + " is out of range [0, " + std::to_string(hidden) + ")";
    if (++copies[n] > (r ? 2 : 1))
      return r ? " lists neuron " + std::to_string(n) + " more than twice (at most two copies)"
               : " is not a permutation";
  }
  // Lengths add up and no neuron is listed more than allowed, so a missing neuron means some other one is doubled.
  for (size_t n = 0; n < copies.size(); ++n)
    if (!copies[n]) return " has no slot for neuron " + std::to_string(n);
  return "";
}

std::string image_cache_policy_problem(const ImageCachePolicy& p, const std::vector<uint32_t>& o, uint32_t hidden) {
  if (!cache_small_fraction_valid(p.small_fraction)) return ".small_fraction must be strictly between 0 and 1";
  std::vector<char> seen(o.size(), 0);
  std::vector<char> first(size_t(hidden), 0);  // the cache is keyed by a neuron's first copy
  for (size_t s = 0; s < o.size(); ++s)
    if (o[s] < hidden && !first[o[s]]) first[o[s]] = 1, seen[s] = 2;  // 2: a first copy, not pinned yet
  for (uint32_t s : p.pinned) {
    if (s >= seen.size())
      return ".pinned_slots: slot " + std::to_string(s) + " is out of range [0, " + std::to_string(seen.size()) + ")";
    if (seen[s] == 1) return ".pinned_slots lists slot " + std::to_string(s) + " twice";
    if (seen[s] == 0) return ".pinned_slots: slot " + std::to_string(s) + " holds a second copy (pin the first)";
    seen[s] = 1;
  }
  std::vector<char> hot_seen(o.size(), 0);
  for (uint32_t s : p.hot) {
    if (s >= o.size())
      return ".hot_slots: slot " + std::to_string(s) + " is out of range [0, " + std::to_string(o.size()) + ")";
    if (hot_seen[s]) return ".hot_slots lists slot " + std::to_string(s) + " twice";
    if (seen[s] == 0) return ".hot_slots: slot " + std::to_string(s) + " holds a second copy (list the first)";
    hot_seen[s] = 1;
  }
  return "";
}

std::string manifest_to_json(const ImageManifest& m) {
  const ModelConfig& c = m.config;
  json j;
  j["format"] = "neuralink-image";
  j["version"] = m.version_major;
  j["version_minor"] = m.version_minor;
  j["image"] = {{"file", m.image_file}, {"bytes", m.image_bytes}, {"id", hex64(m.image_id)}};
  j["model"] = {{"dim", c.dim},
                {"hidden_dim", c.hidden_dim},
                {"n_layers", c.n_layers},
                {"n_heads", c.n_heads},
                {"n_kv_heads", c.n_kv_heads},
                {"vocab_size", c.vocab_size},
                {"seq_len", c.seq_len},
                {"rope_theta", double(c.rope_theta)},
                {"norm_eps", double(c.norm_eps)},
                {"ffn_act", ffn_act_name(c.act)},
                {"shared_classifier", c.shared_classifier}};
  if (c.sliding_window > 0) j["model"]["sliding_window"] = c.sliding_window;
  if (c.arch != ModelArch::kLlama) j["model"]["arch"] = model_arch_name(c.arch);
  if (c.rope_dims > 0) j["model"]["rope_dims"] = c.rope_dims;
  if (c.act == FfnAct::kFatRelu) j["model"]["fatrelu_threshold"] = double(c.fatrelu_threshold);
  j["dtype"] = image_dtype_name(m.dtype);
  j["bundle"] = {{"kind", bundle_kind_name(m.bundle_kind)}, {"bytes", m.bundle_bytes}};
  j["tokenizer"] = m.tokenizer;
  j["source"] = {{"path", m.source}, {"format", m.source_format}};
  j["layout"] = {{"path", m.layout}, {"method", m.layout_method}};
  json regions = json::array();
  for (const auto& r : m.regions) {
    json e = {{"name", r.name}, {"offset", r.offset}, {"bytes", r.bytes}, {"xxh64", hex64(r.xxh64)}};
    if (r.layer >= 0) e["layer"] = r.layer;
    regions.push_back(std::move(e));
  }
  j["regions"] = std::move(regions);
  json tensors = json::array();
  for (const auto& t : m.dense_tensors)
    tensors.push_back(
        {{"name", t.name}, {"offset", t.offset}, {"shape", {t.rows, t.cols}}, {"dtype", image_dtype_name(t.dtype)}});
  j["dense_tensors"] = std::move(tensors);
  j["order"] = m.order;
  if (!m.replicas.empty()) j["replicas"] = m.replicas;  // format 1.2 only (flash replication)
  // Written only when a layer records a policy, so images of layouts without one keep their manifest bytes.
  bool any_policy = false;
  for (const auto& p : m.cache_policy) any_policy = any_policy || !p.empty();
  if (any_policy) {
    json pol = json::array();
    for (const auto& p : m.cache_policy) {
      json e = json::object();
      if (p.admission != CacheAdmission::kUnset) e["admission"] = cache_admission_name(p.admission);
      if (!p.pinned.empty()) e["pinned_slots"] = p.pinned;
      if (p.small_fraction != 0) e["small_fraction"] = p.small_fraction;
      if (!p.hot.empty()) e["hot_slots"] = p.hot;
      pol.push_back(std::move(e));
    }
    j["cache_policy"] = std::move(pol);
  }
  if (!m.planner.empty()) {
    const ImagePlanner& p = m.planner;
    j["planner"] = {
        {"gap", p.gap},
        {"device", {{"name", p.device}, {"read_latency_us", p.read_latency_us}, {"bandwidth_MBps", p.bandwidth_MBps}}},
        {"cache_ratio", p.cache_ratio},
        {"cache_admission", cache_admission_name(p.cache_admission)},
        {"from", p.from}};
  }
  if (!m.act_threshold.empty()) j["act_threshold"] = m.act_threshold;
  if (m.has_predictor()) {
    j["predictor"] = {{"rank", m.predictor_rank},
                      {"dtype", image_dtype_name(m.predictor_dtype())},
                      {"form", "fc2 relu(fc1 x)"},
                      {"source", m.predictor_source}};
    if (m.predictor_input != PredictorInput::kFfnNorm)
      j["predictor"]["input"] = predictor_input_name(m.predictor_input);
  }
  return j.dump(1) + "\n";
}

namespace {

[[noreturn]] void bad(const std::string& path, const std::string& what) { throw InputError(path, what); }

const json& need(const json& obj, const char* key, const std::string& path, const char* where = "") {
  if (!obj.is_object() || !obj.contains(key)) bad(path, std::string("missing key '") + where + key + "'");
  return obj.at(key);
}

uint64_t need_u64(const json& obj, const char* key, const std::string& path, const char* where = "") {
  const json& v = need(obj, key, path, where);
  if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0))
    bad(path, std::string("key '") + where + key + "' must be a non-negative integer");
  return v.get<uint64_t>();
}

int need_int(const json& obj, const char* key, const std::string& path, const char* where) {
  uint64_t v = need_u64(obj, key, path, where);
  if (v > (1u << 30))
    bad(path, std::string("key '") + where + key + "' is implausibly large (" + std::to_string(v) + ")");
  return int(v);
}

std::string need_str(const json& obj, const char* key, const std::string& path, const char* where = "") {
  const json& v = need(obj, key, path, where);
  if (!v.is_string()) bad(path, std::string("key '") + where + key + "' must be a string");
  return v.get<std::string>();
}

std::string opt_str(const json& obj, const char* key) {
  if (obj.is_object() && obj.contains(key) && obj.at(key).is_string()) return obj.at(key).get<std::string>();
  return "";
}

uint64_t parse_hex64(const std::string& s, const std::string& path, const std::string& what) {
  if (s.size() != 16 || s.find_first_not_of("0123456789abcdef") != std::string::npos)
    bad(path, what + " must be 16 lowercase hex digits, got '" + s + "'");
  return std::stoull(s, nullptr, 16);
}

uint64_t align_up(uint64_t v) { return (v + kImageAlign - 1) / kImageAlign * kImageAlign; }

void check_manifest(const ImageManifest& m, const std::string& path) {
  const ModelConfig& c = m.config;
  if (std::string p = model_config_problem(c); !p.empty()) bad(path, "model config: " + p);
  if (!image_row_len_ok(m.dtype, size_t(c.dim)))
    bad(path, std::string(image_dtype_name(m.dtype)) + " needs dim to be a multiple of 32, the model has dim " +
                  std::to_string(c.dim));
  if (!c.ffn_gated() && m.bundle_kind != BundleKind::kPlain)
    bad(path, "model.arch " + std::string(model_arch_name(c.arch)) +
                  " needs plain bundles (an fc1 row and an fc2 column per neuron), not " +
                  std::string(bundle_kind_name(m.bundle_kind)));
  const uint64_t part = image_row_bytes(m.dtype, size_t(c.dim));
  const uint64_t want_bundle = image_bundle_bytes(m.dtype, m.bundle_kind, size_t(c.dim));
  if (m.bundle_bytes != want_bundle)
    bad(path, "bundle size " + std::to_string(m.bundle_bytes) + " bytes is inconsistent with the model (" +
                  std::to_string(bundle_parts(m.bundle_kind)) + " x a " + image_dtype_name(m.dtype) + " row of dim " +
                  std::to_string(c.dim) + " (" + std::to_string(part) + " bytes) = " + std::to_string(want_bundle) +
                  ")");
  if (m.image_bytes % kImageAlign != 0)
    bad(path, "image size " + std::to_string(m.image_bytes) + " is not a multiple of " + std::to_string(kImageAlign));
  if (m.has_predictor() && !m.replicas.empty())
    bad(path, "has a predictor and replicas (pack writes one or the other)");
  const size_t n_regions = size_t(c.n_layers) + 1 + (m.has_predictor() ? 1 : 0);
  if (m.regions.size() != n_regions)
    bad(path, "has " + std::to_string(m.regions.size()) + " regions, expected 1 dense + " + std::to_string(c.n_layers) +
                  " FFN layers" + (m.has_predictor() ? " + 1 predictor" : ""));
  // Flash replication (1.2): `replicas` per layer; an FFN region holds hidden_dim + replicas bundles.
  if (!m.replicas.empty()) {
    if (m.version_major == 1 && m.version_minor < kImageVersionMinorReplicas)
      bad(path, "has 'replicas' but is format version 1." + std::to_string(m.version_minor) +
                    " (replicated images are 1." + std::to_string(kImageVersionMinorReplicas) + ")");
    if (m.replicas.size() != size_t(c.n_layers))
      bad(path, "replicas has " + std::to_string(m.replicas.size()) + " entries, expected one per layer (" +
                    std::to_string(c.n_layers) + ")");
  }
  for (size_t i = 0; i < m.regions.size(); ++i) {
    const ImageRegion& r = m.regions[i];
    const bool pred = m.has_predictor() && i == m.predictor_region_index();
    const std::string want_name = i == 0 ? "dense" : pred ? "predictor" : "ffn." + std::to_string(i - 1);
    if (r.name != want_name || r.layer != (pred ? -1 : int(i) - 1))
      bad(path, "region " + std::to_string(i) + " is '" + r.name + "', expected '" + want_name + "'");
    if (r.offset % kImageAlign != 0)
      bad(path, "region '" + r.name + "' offset " + std::to_string(r.offset) + " is not " +
                    std::to_string(kImageAlign) + "-aligned");
    if (r.offset < kImageAlign) bad(path, "region '" + r.name + "' overlaps the image header");
    if (r.offset > m.image_bytes || r.bytes > m.image_bytes - r.offset)
      bad(path, "region '" + r.name + "' [" + std::to_string(r.offset) + ", +" + std::to_string(r.bytes) +
                    ") runs past the end of the image (" + std::to_string(m.image_bytes) + " bytes)");
    if (pred) {
      if (r.bytes != uint64_t(c.n_layers) * m.predictor_layer_bytes())
        bad(path, "region 'predictor' is " + std::to_string(r.bytes) + " bytes, expected n_layers x " +
                      std::to_string(m.predictor_layer_bytes()) + " (rank " + std::to_string(m.predictor_rank) + ")");
      continue;
    }
    const uint64_t slots = uint64_t(c.hidden_dim) + (i > 0 && !m.replicas.empty() ? m.replicas[i - 1] : 0);
    if (i > 0 && r.bytes != slots * m.bundle_bytes)
      bad(path,
          "region '" + r.name + "' is " + std::to_string(r.bytes) + " bytes, expected hidden_dim " +
              std::to_string(c.hidden_dim) +
              (slots != uint64_t(c.hidden_dim) ? " + replicas " + std::to_string(slots - uint64_t(c.hidden_dim)) : "") +
              " x bundle " + std::to_string(m.bundle_bytes) + " bytes");
  }
  std::vector<const ImageRegion*> sorted;
  for (const auto& r : m.regions) sorted.push_back(&r);
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < sorted.size(); ++i)
    if (sorted[i]->offset < sorted[i - 1]->offset + align_up(sorted[i - 1]->bytes))
      bad(path, "regions '" + sorted[i - 1]->name + "' and '" + sorted[i]->name + "' overlap");
  // Dense tensors: exactly the list the config implies, each inside the dense region.
  auto want = image_dense_tensor_list(c, m.dtype);
  if (m.dense_tensors.size() != want.size())
    bad(path, "lists " + std::to_string(m.dense_tensors.size()) + " dense tensors, the model config implies " +
                  std::to_string(want.size()));
  for (size_t i = 0; i < want.size(); ++i) {
    const DenseTensor& t = m.dense_tensors[i];
    if (t.name != want[i].name || t.rows != want[i].rows || t.cols != want[i].cols)
      bad(path, "dense tensor " + std::to_string(i) + " is '" + t.name + "' [" + std::to_string(t.rows) + "][" +
                    std::to_string(t.cols) + "], expected '" + want[i].name + "' [" + std::to_string(want[i].rows) +
                    "][" + std::to_string(want[i].cols) + "]");
    // The one storage rule (image_dense_dtype): a reader never meets a combination no writer makes.
    if (t.dtype != want[i].dtype)
      bad(path, "dense tensor '" + t.name + "' has dtype " + image_dtype_name(t.dtype) + ", a " +
                    image_dtype_name(m.dtype) + " image stores it as " + image_dtype_name(want[i].dtype));
    if (t.offset % kImageTensorAlign != 0)
      bad(path, "dense tensor '" + t.name + "' offset " + std::to_string(t.offset) + " is not " +
                    std::to_string(kImageTensorAlign) + "-byte aligned");
    if (t.offset > m.dense().bytes || t.bytes() > m.dense().bytes - t.offset)
      bad(path, "dense tensor '" + t.name + "' runs past the end of the dense region");
  }
  // Tensors in image order do not overlap (an edited offset could alias two tensors).
  for (size_t i = 1; i < m.dense_tensors.size(); ++i) {
    const DenseTensor& a = m.dense_tensors[i - 1];
    if (m.dense_tensors[i].offset < a.offset + a.bytes())
      bad(path, "dense tensors '" + a.name + "' and '" + m.dense_tensors[i].name + "' overlap or are out of order");
  }
  if (m.order.size() != size_t(c.n_layers))
    bad(path, "has " + std::to_string(m.order.size()) + " layer orders, expected " + std::to_string(c.n_layers));
  // Flash replication (1.2): each order hidden_dim + replicas long, every neuron once or twice.
  for (size_t l = 0; l < m.order.size(); ++l) {
    const auto& o = m.order[l];
    const uint64_t r = m.replicas.empty() ? 0 : m.replicas[l];
    const std::string where = "order of layer " + std::to_string(l);
    if (r > uint64_t(c.hidden_dim))
      bad(path, "replicas[" + std::to_string(l) + "] = " + std::to_string(r) + " exceeds the layer's " +
                    std::to_string(c.hidden_dim) + " neurons (a neuron has at most two copies)");
    const std::string problem = image_order_problem(o, uint32_t(c.hidden_dim), r);
    if (!problem.empty()) bad(path, where + problem);
  }
  if (!m.act_threshold.empty() && m.act_threshold.size() != size_t(c.n_layers))
    bad(path, "act_threshold has " + std::to_string(m.act_threshold.size()) + " entries, expected one per layer (" +
                  std::to_string(c.n_layers) + ")");
  for (double t : m.act_threshold)
    if (!(t >= 0) || !std::isfinite(t)) bad(path, "act_threshold entries must be finite and >= 0");
  if (!m.cache_policy.empty() && m.cache_policy.size() != size_t(c.n_layers))
    bad(path, "cache_policy has " + std::to_string(m.cache_policy.size()) + " entries, expected one per layer (" +
                  std::to_string(c.n_layers) + ")");
  for (size_t l = 0; l < m.cache_policy.size(); ++l) {
    const std::string problem = image_cache_policy_problem(m.cache_policy[l], m.order[l], uint32_t(c.hidden_dim));
    if (!problem.empty()) bad(path, "cache_policy[" + std::to_string(l) + "]" + problem);
  }
  if (image_id_of(m) != m.image_id)
    bad(path, "image id " + hex64(m.image_id) +
                  " does not match its region table and the model, dtypes, tensors "
                  "and order it covers (edited by hand?): re-pack");
}

}  // namespace

ImageManifest manifest_parse(const std::string& text, const std::string& path) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for numbers that overflow
    bad(path, std::string("not valid JSON: ") + e.what());
  }
  if (!j.is_object()) bad(path, "not a JSON object");
  if (opt_str(j, "format") != "neuralink-image")
    bad(path, "not a flash image manifest (format is '" + opt_str(j, "format") + "', expected 'neuralink-image')");
  ImageManifest m;
  const uint64_t major = need_u64(j, "version", path);  // compared before narrowing: 2^32 + 1 is not version 1
  if (major > kImageVersionMajor)
    bad(path, "format version " + std::to_string(major) + " is newer than this build reads (" +
                  std::to_string(kImageVersionMajor) + "); use a newer nl-run or re-pack");
  if (major < 1) bad(path, "format version 0 does not exist");
  m.version_major = uint32_t(major);
  const uint64_t minor = j.contains("version_minor") ? need_u64(j, "version_minor", path) : 0;
  if (minor > 0xffffffffu) bad(path, "version_minor " + std::to_string(minor) + " is out of range");
  m.version_minor = uint32_t(minor);
  try {
    const json& img = need(j, "image", path);
    m.image_file = need_str(img, "file", path, "image.");
    // Pack writes the image's file name beside the manifest; a path would let a manifest point nl-run at any file
    // (the tokenizer's rule below).
    if (m.image_file.empty() || m.image_file.find('/') != std::string::npos || m.image_file == "." ||
        m.image_file == ".." || m.image_file.find('\0') != std::string::npos)
      bad(path, "'image.file' must be a file name in the manifest's folder, not a path (\"" +
                    m.image_file.substr(0, 64) + (m.image_file.size() > 64 ? "...\")" : "\")"));
    m.image_bytes = need_u64(img, "bytes", path, "image.");
    m.image_id = parse_hex64(need_str(img, "id", path, "image."), path, "image.id");
    const json& mc = need(j, "model", path);
    ModelConfig& c = m.config;
    c.dim = need_int(mc, "dim", path, "model.");
    c.hidden_dim = need_int(mc, "hidden_dim", path, "model.");
    c.n_layers = need_int(mc, "n_layers", path, "model.");
    c.n_heads = need_int(mc, "n_heads", path, "model.");
    c.n_kv_heads = need_int(mc, "n_kv_heads", path, "model.");
    c.vocab_size = need_int(mc, "vocab_size", path, "model.");
    c.seq_len = need_int(mc, "seq_len", path, "model.");
    if (!need(mc, "rope_theta", path, "model.").is_number() || !need(mc, "norm_eps", path, "model.").is_number())
      bad(path, "model.rope_theta and model.norm_eps must be numbers");
    // Narrowed only when a float holds them (a double beyond FLT_MAX does not convert).
    for (const char* k : {"rope_theta", "norm_eps"})
      if (!(std::fabs(mc.at(k).get<double>()) <= double(std::numeric_limits<float>::max())))
        bad(path, std::string("model.") + k + " is out of range");
    c.rope_theta = mc.at("rope_theta").get<float>();
    c.norm_eps = mc.at("norm_eps").get<float>();
    if (mc.contains("arch")) {  // 1.7: the block's architecture (absent: llama)
      const std::string arch = need_str(mc, "arch", path, "model.");
      if (!model_arch_parse(arch, &c.arch)) bad(path, "model.arch '" + arch + "' is not llama, opt or phi");
      if (c.arch != ModelArch::kLlama && m.version_major == 1 && m.version_minor < kImageVersionMinorArch)
        bad(path, "model.arch " + arch + " needs format version 1." + std::to_string(kImageVersionMinorArch) +
                      " (this manifest is 1." + std::to_string(m.version_minor) + ")");
    }
    if (mc.contains("rope_dims")) {  // 1.7: Phi's partial rotary (checked with the config below)
      c.rope_dims = need_int(mc, "rope_dims", path, "model.");
      if (m.version_major == 1 && m.version_minor < kImageVersionMinorArch)
        bad(path, "has model.rope_dims but is format version 1." + std::to_string(m.version_minor) + " (1." +
                      std::to_string(kImageVersionMinorArch) + " has it)");
    }
    std::string act = need_str(mc, "ffn_act", path, "model.");
    if (!ffn_act_parse(act, &c.act)) bad(path, "model.ffn_act '" + act + "' is not silu, relu, fatrelu, drelu or gelu");
    if ((c.act == FfnAct::kFatRelu || c.act == FfnAct::kDRelu) && m.version_major == 1 &&
        m.version_minor < kImageVersionMinorActivations)
      bad(path, "model.ffn_act " + act + " needs format version 1." + std::to_string(kImageVersionMinorActivations) +
                    " (this manifest is 1." + std::to_string(m.version_minor) + ")");
    if (c.act == FfnAct::kFatRelu) {
      if (!need(mc, "fatrelu_threshold", path, "model.").is_number())
        bad(path, "model.fatrelu_threshold must be a number");
      const double t = mc.at("fatrelu_threshold").get<double>();
      if (!(t >= 0.0 && t < 1e30)) bad(path, "model.fatrelu_threshold must be finite and >= 0");
      c.fatrelu_threshold = float(t);
    } else if (mc.contains("fatrelu_threshold")) {
      bad(path, "model.fatrelu_threshold is set but model.ffn_act is " + act);
    }
    if (!need(mc, "shared_classifier", path, "model.").is_boolean())
      bad(path, "model.shared_classifier must be true or false");
    c.shared_classifier = mc.at("shared_classifier").get<bool>();
    if (mc.contains("sliding_window")) {  // 1.4: Mistral's attention window
      c.sliding_window = need_int(mc, "sliding_window", path, "model.");
      if (c.sliding_window < 1) bad(path, "model.sliding_window must be at least 1");
      if (m.version_major == 1 && m.version_minor < kImageVersionMinorSlidingWindow)
        bad(path, "has model.sliding_window but is format version 1." + std::to_string(m.version_minor) +
                      " (images with a window are 1." + std::to_string(kImageVersionMinorSlidingWindow) + ")");
    }
    std::string dt = need_str(j, "dtype", path);
    if (!image_dtype_parse(dt, &m.dtype)) bad(path, "unknown dtype '" + dt + "' (f32, f16, bf16, q8_0, q4_0)");
    const json& b = need(j, "bundle", path);
    std::string kind = need_str(b, "kind", path, "bundle.");
    if (kind == "gated")
      m.bundle_kind = BundleKind::kGated;
    else if (kind == "plain")
      m.bundle_kind = BundleKind::kPlain;
    else
      bad(path, "unknown bundle kind '" + kind + "' (gated, plain)");
    m.bundle_bytes = need_u64(b, "bytes", path, "bundle.");
    m.tokenizer = opt_str(j, "tokenizer");
    // A file name beside the manifest, as pack writes it: a path ("../", "/etc/...") would let a manifest point nl-run
    // at any file on the machine, and its errors would quote that file's bytes.
    if (m.tokenizer.find('/') != std::string::npos || m.tokenizer == "." || m.tokenizer == ".." ||
        m.tokenizer.find('\0') != std::string::npos)
      bad(path, "'tokenizer' must be a file name in the manifest's folder, not a path (\"" + m.tokenizer.substr(0, 64) +
                    (m.tokenizer.size() > 64 ? "...\")" : "\")"));
    if (j.contains("source")) {
      m.source = opt_str(j["source"], "path");
      m.source_format = opt_str(j["source"], "format");
    }
    if (j.contains("layout")) {
      m.layout = opt_str(j["layout"], "path");
      m.layout_method = opt_str(j["layout"], "method");
    }
    const json& regions = need(j, "regions", path);
    if (!regions.is_array()) bad(path, "'regions' must be an array");
    for (const json& r : regions) {
      ImageRegion reg;
      reg.name = need_str(r, "name", path, "regions[].");
      reg.offset = need_u64(r, "offset", path, "regions[].");
      reg.bytes = need_u64(r, "bytes", path, "regions[].");
      reg.xxh64 = parse_hex64(need_str(r, "xxh64", path, "regions[]."), path, "regions[].xxh64");
      reg.layer = r.contains("layer") ? need_int(r, "layer", path, "regions[].") : -1;
      m.regions.push_back(std::move(reg));
    }
    const json& tensors = need(j, "dense_tensors", path);
    if (!tensors.is_array()) bad(path, "'dense_tensors' must be an array");
    for (const json& t : tensors) {
      DenseTensor d;
      d.name = need_str(t, "name", path, "dense_tensors[].");
      d.offset = need_u64(t, "offset", path, "dense_tensors[].");
      const json& s = need(t, "shape", path, "dense_tensors[].");
      if (!s.is_array() || s.size() != 2 || !s[0].is_number_unsigned() || !s[1].is_number_unsigned())
        bad(path, "dense tensor '" + d.name + "' shape must be [rows, cols]");
      d.rows = s[0].get<uint64_t>();
      d.cols = s[1].get<uint64_t>();
      if (t.contains("dtype")) {  // absent in 1.0 manifests: the image dtype
        const json& dv = t.at("dtype");
        if (!dv.is_string() || !image_dtype_parse(dv.get<std::string>(), &d.dtype))
          bad(path, "dense tensor '" + d.name + "' dtype must be one of f32, f16, bf16, q8_0, q4_0");
      } else {
        d.dtype = image_dense_dtype(m.dtype, d.rows);
      }
      m.dense_tensors.push_back(std::move(d));
    }
    const json& order = need(j, "order", path);
    if (!order.is_array()) bad(path, "'order' must be an array of arrays");
    for (const json& o : order) {
      if (!o.is_array()) bad(path, "'order' must be an array of arrays");
      std::vector<uint32_t> v;
      v.reserve(o.size());
      for (const json& x : o) {
        if (!x.is_number_unsigned() || x.get<uint64_t>() > 0xffffffffu)
          bad(path, "order entries must be neuron indices");
        v.push_back(x.get<uint32_t>());
      }
      m.order.push_back(std::move(v));
    }
    if (j.contains("replicas")) {  // format 1.2: flash replication
      const json& rep = j["replicas"];
      if (!rep.is_array()) bad(path, "'replicas' must be an array with one count per layer");
      for (const json& x : rep) {
        if (!x.is_number_unsigned() || x.get<uint64_t>() > 0xffffffffu)
          bad(path, "replicas entries must be non-negative counts");
        m.replicas.push_back(x.get<uint32_t>());
      }
    }
    if (j.contains("cache_policy")) {  // optional (docs/formats.md); older manifests do not have it
      const json& pol = j["cache_policy"];
      if (!pol.is_array()) bad(path, "'cache_policy' must be an array with one object per layer");
      for (size_t l = 0; l < pol.size(); ++l) {
        const json& e = pol[l];
        const std::string where = "cache_policy[" + std::to_string(l) + "]";
        if (!e.is_object()) bad(path, where + " must be an object");
        ImageCachePolicy p;
        if (e.contains("admission")) {
          if (!e["admission"].is_string()) bad(path, where + ".admission must be a string");
          // An admission rule this build does not know would be run as something else: refuse rather than guess.
          const std::string a = e["admission"].get<std::string>();
          if (!cache_admission_parse(a, &p.admission))
            bad(path, where + ".admission '" + a + "' is not " + kCacheAdmissions);
        }
        auto slot_list = [&](const char* name, std::vector<uint32_t>& dst) {
          if (!e.contains(name)) return;
          const json& ps = e[name];
          if (!ps.is_array()) bad(path, where + "." + name + " must be an array of slot indices");
          for (const json& x : ps) {
            if (!x.is_number_unsigned() || x.get<uint64_t>() > 0xffffffffu)
              bad(path, where + "." + name + " entries must be slot indices");
            dst.push_back(x.get<uint32_t>());
          }
        };
        slot_list("pinned_slots", p.pinned);
        slot_list("hot_slots", p.hot);
        if (e.contains("small_fraction")) {
          if (!e["small_fraction"].is_number()) bad(path, where + ".small_fraction must be a number");
          p.small_fraction = e["small_fraction"].get<double>();
          if (p.small_fraction == 0) bad(path, where + ".small_fraction must be strictly between 0 and 1");
        }
        m.cache_policy.push_back(std::move(p));
      }
    }
    if (j.contains("planner")) {  // optional (docs/formats.md "Planner settings")
      const json& p = j["planner"];
      ImagePlanner& r = m.planner;
      r.gap = need_str(p, "gap", path, "planner.");
      if (r.gap.empty()) bad(path, "planner.gap must not be empty");
      const json& dev = need(p, "device", path, "planner.");
      r.device = need_str(dev, "name", path, "planner.device.");
      for (const char* k : {"read_latency_us", "bandwidth_MBps"})
        if (!need(dev, k, path, "planner.device.").is_number() || !(dev.at(k).get<double>() > 0) ||
            !std::isfinite(dev.at(k).get<double>()))
          bad(path, std::string("planner.device.") + k + " must be a positive number");
      r.read_latency_us = dev.at("read_latency_us").get<double>();
      r.bandwidth_MBps = dev.at("bandwidth_MBps").get<double>();
      const json& cr = need(p, "cache_ratio", path, "planner.");
      if (!cr.is_number() || !(cr.get<double>() >= 0 && cr.get<double>() <= 1))
        bad(path, "planner.cache_ratio must be a number in [0, 1]");
      r.cache_ratio = cr.get<double>();
      const std::string adm = opt_str(p, "cache_admission");
      if (!adm.empty() && !cache_admission_parse(adm, &r.cache_admission))
        bad(path, "planner.cache_admission '" + adm + "' is not " + kCacheAdmissions);
      r.from = opt_str(p, "from");
    }
    if (j.contains("predictor")) {  // 1.6 (docs/formats.md)
      const json& p = need(j, "predictor", path);
      m.predictor_rank = need_int(p, "rank", path, "predictor.");
      if (m.predictor_rank < 1) bad(path, "predictor.rank must be at least 1");
      if (need_str(p, "dtype", path, "predictor.") != image_dtype_name(m.predictor_dtype()))
        bad(path, std::string("predictor.dtype must be ") + image_dtype_name(m.predictor_dtype()) + " in a " +
                      image_dtype_name(m.dtype) + " image");
      m.predictor_source = opt_str(p, "source");
      if (p.contains("input")) {  // 1.8
        const std::string in = need_str(p, "input", path, "predictor.");
        if (!predictor_input_parse(in, &m.predictor_input))
          bad(path, "predictor.input '" + in + "' is not ffn_norm or residual");
        if (m.version_major == 1 && m.version_minor < kImageVersionMinorPredictorInput)
          bad(path, "has predictor.input but is format version 1." + std::to_string(m.version_minor) + " (1." +
                        std::to_string(kImageVersionMinorPredictorInput) + " has it)");
      }
      if (m.version_major == 1 && m.version_minor < kImageVersionMinorPredictor)
        bad(path, "has a predictor but is format version 1." + std::to_string(m.version_minor) +
                      " (images with one are 1." + std::to_string(kImageVersionMinorPredictor) + ")");
    }
    if (j.contains("act_threshold")) {  // optional (docs/formats.md)
      const json& at = j["act_threshold"];
      if (!at.is_array()) bad(path, "'act_threshold' must be an array with one number per layer");
      for (const json& x : at) {
        if (!x.is_number()) bad(path, "act_threshold entries must be numbers");
        m.act_threshold.push_back(x.get<double>());
      }
    }
  } catch (const json::exception& e) {  // a key of the wrong type somewhere we did not check by hand
    bad(path, std::string("malformed manifest: ") + e.what());
  }
  check_manifest(m, path);
  return m;
}

ImageManifest manifest_load(const std::string& path) { return manifest_parse(read_file(path, 1ull << 32), path); }

std::string image_path_from_manifest(const std::string& manifest_path, const ImageManifest& m) {
  auto pos = manifest_path.find_last_of('/');
  return pos == std::string::npos ? m.image_file : manifest_path.substr(0, pos + 1) + m.image_file;
}

void image_check_header(const std::string& path, const ImageManifest& m, const ImageHeader& h, uint64_t file_bytes) {
  if (file_bytes < kImageHeaderBytes) bad(path, "truncated: " + std::to_string(file_bytes) + " bytes, no header");
  if (std::memcmp(h.magic, kImageMagic, sizeof kImageMagic) != 0) bad(path, "not a flash image (bad magic)");
  if (h.version_major > kImageVersionMajor)
    bad(path, "image format version " + std::to_string(h.version_major) + " is newer than this build reads (" +
                  std::to_string(kImageVersionMajor) + ")");
  if (h.header_bytes < kImageHeaderBytes || h.header_bytes > kImageAlign || h.alignment != kImageAlign)
    bad(path, "malformed header (header size " + std::to_string(h.header_bytes) + ", alignment " +
                  std::to_string(h.alignment) + ")");
  if (file_bytes < m.image_bytes)
    bad(path, "truncated: the file has " + std::to_string(file_bytes) + " bytes, its manifest expects " +
                  std::to_string(m.image_bytes));
  if (file_bytes != m.image_bytes || h.image_bytes != m.image_bytes)
    bad(path, "is " + std::to_string(file_bytes) + " bytes (header says " + std::to_string(h.image_bytes) +
                  "), its manifest expects " + std::to_string(m.image_bytes) +
                  ": not the image this manifest describes");
  // The header's minor version picks how the id is computed: a manifest edited down to 1.0 (whose id covers less)
  // no longer matches its image. (An edit from 1.3 down to 1.1 / 1.2 drops the thresholds from the id, which then no
  // longer equals the one the header repeats.)
  if (h.version_major != m.version_major || (h.version_minor == 0) != (m.version_minor == 0))
    bad(path, "is format version " + std::to_string(h.version_major) + "." + std::to_string(h.version_minor) +
                  ", its manifest says " + std::to_string(m.version_major) + "." + std::to_string(m.version_minor) +
                  ": not the image this manifest describes");
  if (h.image_id != m.image_id || h.n_regions != m.regions.size())
    bad(path, "does not match its manifest (image id " + hex64(h.image_id) + ", manifest says " + hex64(m.image_id) +
                  "): re-pack, or use the manifest written with this image");
}

}  // namespace nl
