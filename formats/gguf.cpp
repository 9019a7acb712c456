// GGUF reader (formats/gguf.h): header, metadata and tensor table parsed with bounds checks against the file; the
// Llama block's tensors widened to f32 one layer at a time.
#include "formats/gguf.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <vector>

#include "formats/core/error.h"
#include "formats/core/half.h"
#include "formats/core/quant.h"

namespace nl {
namespace {

// gguf.h's value types and ggml's tensor types (ggml.h: GGML_TYPE_*), the ones read here.
enum : uint32_t { kU8, kI8, kU16, kI16, kU32, kI32, kF32, kBool, kString, kArray, kU64, kI64, kF64 };
enum : uint32_t { kTypeF32 = 0, kTypeF16 = 1, kTypeQ4_0 = 2, kTypeQ8_0 = 8, kTypeBF16 = 30 };
constexpr uint64_t kMaxString = uint64_t(1) << 30;

struct Value {
  uint32_t type = 0;
  uint64_t u = 0;  // unsigned and bool
  int64_t i = 0;   // signed
  double f = 0.0;
  bool is_int = false, is_float = false;
  std::string s;
  uint32_t arr_type = 0;
  uint64_t arr_n = 0;
};

// GGUF's magic, or PowerInfer's PWRI: its sparse-model files are GGUF with their own magic (its ggml.h
// GGUF_POWERINFER_MAGIC), which its llama.cpp takes as "run this model sparse": its FFN through ReLU (configure()).
enum class GgufMagic { kNone, kGguf, kPowerInfer };
GgufMagic gguf_magic(const char (&m)[4]) {
  if (std::memcmp(m, "GGUF", 4) == 0) return GgufMagic::kGguf;
  return std::memcmp(m, "PWRI", 4) == 0 ? GgufMagic::kPowerInfer : GgufMagic::kNone;
}

struct TensorInfo {
  std::vector<uint64_t> ne;  // ne[0]: elements per row
  uint32_t type = 0;
  uint64_t offset = 0, bytes = 0;
};

const char* type_name(uint32_t t) {
  switch (t) {
    case kTypeF32:
      return "F32";
    case kTypeF16:
      return "F16";
    case kTypeQ4_0:
      return "Q4_0";
    case kTypeQ8_0:
      return "Q8_0";
    case kTypeBF16:
      return "BF16";
  }
  return nullptr;
}

// Bytes of one row of n elements of type t; 0 when the type is not read here or n does not fit its blocks.
uint64_t row_bytes_of(uint32_t t, uint64_t n) {
  switch (t) {
    case kTypeF32:
      return n * 4;
    case kTypeF16:
    case kTypeBF16:
      return n * 2;
    case kTypeQ8_0:
      return n % kQuantBlock ? 0 : q8_0_row_bytes(size_t(n));
    case kTypeQ4_0:
      return n % kQuantBlock ? 0 : q4_0_row_bytes(size_t(n));
  }
  return 0;
}

class HeaderReader {
 public:
  HeaderReader(int fd, const std::string& path, uint64_t size) : fd_(fd), path_(path), size_(size) {}
  uint64_t pos() const { return pos_; }
  void read(void* dst, uint64_t n) {
    if (n > size_ || pos_ > size_ - n) throw InputError(path_, "the header runs past the end of the file (truncated?)");
    pread_exact(fd_, path_, pos_, dst, n);
    pos_ += n;
  }
  template <class T>
  T get() {
    T v;
    read(&v, sizeof v);  // little-endian, as x86 and aarch64
    return v;
  }
  std::string string() {
    const uint64_t n = get<uint64_t>();
    if (n > kMaxString) throw InputError(path_, "a string of " + std::to_string(n) + " bytes in the header");
    if (n > size_ - pos_) throw InputError(path_, "the header runs past the end of the file (truncated?)");
    std::string s(size_t(n), '\0');
    read(s.data(), n);
    return s;
  }
  void skip(uint64_t n) {
    if (n > size_ || pos_ > size_ - n) throw InputError(path_, "the header runs past the end of the file (truncated?)");
    pos_ += n;
  }

 private:
  int fd_;
  const std::string& path_;
  uint64_t size_, pos_ = 0;
};

uint64_t scalar_bytes(uint32_t t) {
  switch (t) {
    case kU8:
    case kI8:
    case kBool:
      return 1;
    case kU16:
    case kI16:
      return 2;
    case kU32:
    case kI32:
    case kF32:
      return 4;
    case kU64:
    case kI64:
    case kF64:
      return 8;
  }
  return 0;
}

Value read_value(HeaderReader& r, uint32_t type, const std::string& path, const std::string& key, bool in_array) {
  Value v;
  v.type = type;
  switch (type) {
    case kU8:
      v.u = r.get<uint8_t>(), v.is_int = true;
      break;
    case kI8:
      v.i = r.get<int8_t>(), v.is_int = true;
      break;
    case kU16:
      v.u = r.get<uint16_t>(), v.is_int = true;
      break;
    case kI16:
      v.i = r.get<int16_t>(), v.is_int = true;
      break;
    case kU32:
      v.u = r.get<uint32_t>(), v.is_int = true;
      break;
    case kI32:
      v.i = r.get<int32_t>(), v.is_int = true;
      break;
    case kU64:
      v.u = r.get<uint64_t>(), v.is_int = true;
      break;
    case kI64:
      v.i = r.get<int64_t>(), v.is_int = true;
      break;
    case kF32:
      v.f = r.get<float>(), v.is_float = true;
      break;
    case kF64:
      v.f = r.get<double>(), v.is_float = true;
      break;
    case kBool:
      v.u = r.get<uint8_t>();
      break;
    case kString:
      v.s = r.string();
      break;
    case kArray: {
      if (in_array) throw InputError(path, "key '" + key + "': an array of arrays");
      v.arr_type = r.get<uint32_t>();
      v.arr_n = r.get<uint64_t>();
      if (v.arr_type == kString) {  // only lengths kept (token lists): each string skipped
        for (uint64_t k = 0; k < v.arr_n; ++k) r.skip(r.get<uint64_t>());
      } else if (const uint64_t b = scalar_bytes(v.arr_type); b) {
        if (v.arr_n > (uint64_t(1) << 40) / b) throw InputError(path, "key '" + key + "': array too long");
        r.skip(v.arr_n * b);
      } else {
        throw InputError(path, "key '" + key + "': array of unknown type " + std::to_string(v.arr_type));
      }
      break;
    }
    default:
      throw InputError(path, "key '" + key + "': unknown value type " + std::to_string(type));
  }
  if (v.is_int && (type == kI8 || type == kI16 || type == kI32 || type == kI64)) {
    if (v.i < 0) v.is_int = false;  // no negative counts or sizes are read here
    v.u = uint64_t(v.i);
  }
  return v;
}

class GgufSource : public ModelSource, public GgufTensors {
 public:
  explicit GgufSource(const std::string& path, bool model = true) {
    path_ = path;
    fd_.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_.fd < 0) throw IoError(path, errno_text("open"));
    struct stat st {};
    if (::fstat(fd_.fd, &st) != 0) throw IoError(path, errno_text("stat"));
    if (!S_ISREG(st.st_mode)) throw InputError(path, "not a regular file");
    parse(uint64_t(st.st_size));
    if (model) configure();
  }

  std::vector<uint64_t> tensor_ne(const std::string& name) const override {
    auto it = tensors_.find(name);
    return it == tensors_.end() ? std::vector<uint64_t>{} : it->second.ne;
  }
  void load_tensor(const std::string& name, uint64_t rows, uint64_t cols, std::vector<float>& out) override {
    load(name, rows, cols, out);
  }

  ModelWeights read_dense() override {
    static const std::map<std::string, std::string> kNames = {
        {"embed", "token_embd.weight"},  {"attn_norm", "attn_norm.weight"},
        {"q", "attn_q.weight"},          {"k", "attn_k.weight"},
        {"v", "attn_v.weight"},          {"o", "attn_output.weight"},
        {"ffn_norm", "ffn_norm.weight"}, {"final_norm", "output_norm.weight"},
        {"output", "output.weight"}};
    auto name = [](const char* role, int layer) {
      const std::string& n = kNames.at(role);
      return layer < 0 ? n : "blk." + std::to_string(layer) + "." + n;
    };
    auto ld = [this](const std::string& n, uint64_t rows, uint64_t cols, std::vector<float>& out) {
      load(n, rows, cols, out);
    };
    // llama: q/k rows in the canonical pairs already; smallthinker (NEOX RoPE): rotate_half order.
    return read_llama_dense(config_, path_, name, ld, neox_);
  }

  void read_ffn(int layer, LayerWeights* L) override {
    const uint64_t dim = uint64_t(config_.dim), hid = uint64_t(config_.hidden_dim);
    const std::string pre = "blk." + std::to_string(layer) + ".";
    const std::string sfx = neox_ ? "_exps.weight" : ".weight";  // smallthinker: expert 0 of 1
    load(pre + "ffn_gate" + sfx, hid, dim, L->w_gate);
    load(pre + "ffn_up" + sfx, hid, dim, L->w_up);
    if (neox_ || tensors_.count(pre + "ffn_down.weight")) {
      load(pre + "ffn_down" + sfx, dim, hid, L->w_down);
      return;
    }
    // PowerInfer's files may hold only the transposed down projection, ffn_down_t (ne {dim, hidden}: one row of dim
    // per neuron).
    std::vector<float> t;
    load(pre + "ffn_down_t.weight", hid, dim, t);
    L->w_down.resize(size_t(dim * hid));
    for (uint64_t n = 0; n < hid; ++n)
      for (uint64_t d = 0; d < dim; ++d) L->w_down[size_t(d * hid + n)] = t[size_t(n * dim + d)];
  }

  void write_permuted(const std::string&, const std::vector<std::vector<uint32_t>>&, const ProgressFn&) override {
    throw UsageError(path_ +
                     ": --export-permuted writes Hugging Face folders and llama2.c files, not GGUF (export "
                     "from the checkpoint the GGUF was converted from)");
  }

 private:
  // Closed by its own destructor, so also when the constructor throws (a bad header).
  struct Fd {
    int fd = -1;
    ~Fd() {
      if (fd >= 0) ::close(fd);
    }
  } fd_;
  std::map<std::string, Value> kv_;
  std::map<std::string, TensorInfo> tensors_;
  uint64_t data_start_ = 0;
  bool neox_ = false;
  bool powerinfer_ = false;  // a PowerInfer sparse-model file (magic PWRI)

  void parse(uint64_t size) {
    HeaderReader r(fd_.fd, path_, size);
    char magic[4];
    r.read(magic, 4);
    const GgufMagic kind = gguf_magic(magic);
    if (kind == GgufMagic::kNone) throw InputError(path_, "not a GGUF file (no GGUF magic)");
    powerinfer_ = kind == GgufMagic::kPowerInfer;
    const uint32_t version = r.get<uint32_t>();
    if (version != 2 && version != 3)
      throw InputError(path_, "GGUF version " + std::to_string(version) + " is not supported (2 or 3)");
    const uint64_t n_tensors = r.get<uint64_t>(), n_kv = r.get<uint64_t>();
    if (n_tensors > (uint64_t(1) << 24) || n_kv > (uint64_t(1) << 24))
      throw InputError(path_, "implausible header counts (" + std::to_string(n_tensors) + " tensors, " +
                                  std::to_string(n_kv) + " keys)");
    for (uint64_t k = 0; k < n_kv; ++k) {
      std::string key = r.string();
      const uint32_t type = r.get<uint32_t>();
      Value v = read_value(r, type, path_, key, false);
      if (!kv_.emplace(key, std::move(v)).second) throw InputError(path_, "key '" + key + "' appears twice");
    }
    uint64_t align = 32;
    if (auto it = kv_.find("general.alignment"); it != kv_.end()) {
      if (!it->second.is_int || it->second.u == 0 || (it->second.u & (it->second.u - 1)) || it->second.u > 65536)
        throw InputError(path_, "general.alignment must be a power of two up to 65536");
      align = it->second.u;
    }
    for (uint64_t k = 0; k < n_tensors; ++k) {
      std::string name = r.string();
      TensorInfo t;
      const uint32_t nd = r.get<uint32_t>();
      if (nd < 1 || nd > 4) throw InputError(path_, "tensor '" + name + "': " + std::to_string(nd) + " dimensions");
      uint64_t rows = 1;
      for (uint32_t d = 0; d < nd; ++d) {
        const uint64_t n = r.get<uint64_t>();
        if (n == 0 || n > (uint64_t(1) << 32)) throw InputError(path_, "tensor '" + name + "': bad dimension");
        t.ne.push_back(n);
        if (d > 0) rows *= n;
        if (rows > (uint64_t(1) << 40)) throw InputError(path_, "tensor '" + name + "': too large");
      }
      t.type = r.get<uint32_t>();
      t.offset = r.get<uint64_t>();
      if (t.offset % align)
        throw InputError(path_, "tensor '" + name + "': offset not aligned to " + std::to_string(align));
      const uint64_t rb = row_bytes_of(t.type, t.ne[0]);
      t.bytes = rb * rows;  // 0 for types not read here: refused when such a tensor is needed
      if (!tensors_.emplace(name, std::move(t)).second) throw InputError(path_, "tensor '" + name + "' appears twice");
    }
    data_start_ = (r.pos() + align - 1) / align * align;
    for (const auto& [name, t] : tensors_)
      if (t.bytes && (data_start_ > size || t.offset > size - data_start_ || t.bytes > size - data_start_ - t.offset))
        throw InputError(path_, "tensor '" + name + "' extends past the end of the file (truncated?)");
  }

  const Value* find(const std::string& key) const {
    auto it = kv_.find(key);
    return it == kv_.end() ? nullptr : &it->second;
  }
  uint64_t int_key(const std::string& key, const uint64_t* fallback) const {
    const Value* v = find(key);
    if (!v) {
      if (fallback) return *fallback;
      throw InputError(path_, "key '" + key + "' is missing");
    }
    if (v->type == kArray)
      throw InputError(path_, "key '" + key + "' is an array (per-layer values are not supported)");
    if (!v->is_int || v->u == 0 || v->u > (uint64_t(1) << 24))
      throw InputError(path_, "key '" + key + "' must be an integer in 1..2^24");
    return v->u;
  }
  double float_key(const std::string& key, const double* fallback) const {
    const Value* v = find(key);
    if (!v) {
      if (fallback) return *fallback;
      throw InputError(path_, "key '" + key + "' is missing");
    }
    if (!v->is_float) throw InputError(path_, "key '" + key + "' must be a float");
    return v->f;
  }

  void configure() {
    const Value* a = find("general.architecture");
    if (!a || a->type != kString) throw InputError(path_, "key 'general.architecture' is missing or not a string");
    const std::string arch = a->s;
    if (arch != "llama" && arch != "smallthinker" && arch != "bamboo")
      throw InputError(path_, "general.architecture '" + arch +
                                  "' is not supported (llama, bamboo, or smallthinker with one expert: the Llama "
                                  "block)");
    auto key = [&](const char* k) { return arch + "." + k; };
    ModelConfig& c = config_;
    c.dim = int(int_key(key("embedding_length"), nullptr));
    c.n_layers = int(int_key(key("block_count"), nullptr));
    // Each block has 9 tensors: a block count the tensor table cannot hold is refused before anything is sized by it.
    if (uint64_t(c.n_layers) * 9 > tensors_.size())
      throw InputError(path_, "key '" + key("block_count") + "' = " + std::to_string(c.n_layers) +
                                  ", but the file has " + std::to_string(tensors_.size()) + " tensors");
    c.n_heads = int(int_key(key("attention.head_count"), nullptr));
    const uint64_t heads = uint64_t(c.n_heads), one = 1, ctx = 2048;
    c.n_kv_heads = int(int_key(key("attention.head_count_kv"), &heads));
    c.seq_len = int(int_key(key("context_length"), &ctx));
    const double theta = 10000.0;
    c.rope_theta = float(float_key(key("rope.freq_base"), &theta));
    c.norm_eps = float(float_key(key("attention.layer_norm_rms_epsilon"), nullptr));
    if (const Value* s = find(key("rope.scaling.type")); s && !(s->type == kString && s->s == "none"))
      throw InputError(path_, "key '" + key("rope.scaling.type") + "': RoPE scaling is not supported");
    const uint64_t experts = int_key(key("expert_count"), &one);
    if (arch == "smallthinker") {
      if (experts != 1 || int_key(key("expert_used_count"), &one) != 1)
        throw InputError(path_, "smallthinker with " + std::to_string(experts) +
                                    " experts: only the one-expert form (a dense gated-ReLU Llama block) is read");
      const uint64_t ff = int_key(key("feed_forward_length"), nullptr);
      c.hidden_dim = int(int_key(key("expert_feed_forward_length"), &ff));
      c.act = FfnAct::kRelu;  // llama.cpp's smallthinker FFN: LLM_FFN_RELU, gated
      neox_ = true;
    } else {
      if (find(key("expert_count")) && experts > 1)
        throw InputError(path_, "a mixture of experts (" + std::to_string(experts) + " experts) is not supported");
      c.hidden_dim = int(int_key(key("feed_forward_length"), nullptr));
      // PowerInfer's llama.cpp: bamboo (TurboSparse-Mistral) is LLM_FFN_RELU with LLM_FFN_SYM gating, ReLU on gate and
      // up (dReLU); a sparse (PWRI) llama file runs LLM_FFN_RELU with parallel gating (ReLU-Llama, ProSparse's form as
      // PowerInfer ships it); a plain GGUF llama is llama.cpp's SiLU.
      c.act = arch == "bamboo" ? FfnAct::kDRelu : powerinfer_ ? FfnAct::kRelu : FfnAct::kSilu;
    }
    auto emb = tensors_.find("token_embd.weight");
    if (emb == tensors_.end() || emb->second.ne.size() != 2)
      throw InputError(path_, "tensor 'token_embd.weight' is missing or not 2-D");
    if (emb->second.ne[1] > (uint64_t(1) << 24)) throw InputError(path_, "vocabulary too large");
    c.vocab_size = int(emb->second.ne[1]);
    c.shared_classifier = tensors_.find("output.weight") == tensors_.end();
    if (std::string p = model_config_problem(c); !p.empty()) throw InputError(path_, p);
    if (const Value* d = find(key("rope.dimension_count")); d && (!d->is_int || d->u != uint64_t(c.head_dim())))
      throw InputError(path_, "key '" + key("rope.dimension_count") + "' is not the head dimension " +
                                  std::to_string(c.head_dim()) + " (partial RoPE is not supported)");
  }

  // Tensor `name` as f32 [rows][cols] (cols 0: a vector of `rows`), checked against the shape the config implies.
  void load(const std::string& name, uint64_t rows, uint64_t cols, std::vector<float>& out) {
    auto it = tensors_.find(name);
    if (it == tensors_.end()) throw InputError(path_, "tensor '" + name + "' is missing");
    const TensorInfo& t = it->second;
    const uint64_t want_ne0 = cols ? cols : rows, want_rows = cols ? rows : 1;
    uint64_t have_rows = 1;
    for (size_t d = 1; d < t.ne.size(); ++d) have_rows *= t.ne[d];
    if (t.ne[0] != want_ne0 || have_rows != want_rows) {
      std::string shape;
      for (uint64_t n : t.ne) shape += (shape.empty() ? "" : ", ") + std::to_string(n);
      throw InputError(path_, "tensor '" + name + "' has ne [" + shape + "], the config implies [" +
                                  std::to_string(want_ne0) + ", " + std::to_string(want_rows) + "]");
    }
    if (!type_name(t.type) || !t.bytes)
      throw InputError(path_, "tensor '" + name + "' has ggml type " + std::to_string(t.type) +
                                  " (read: F32, F16, BF16, and Q8_0 / Q4_0 with rows of whole 32-element blocks)");
    const uint64_t rb = t.bytes / want_rows, n = want_ne0;
    out.resize(size_t(want_rows * n));
    std::vector<uint8_t> buf(size_t(std::min<uint64_t>(t.bytes, std::max<uint64_t>(rb, uint64_t(1) << 22))));
    const uint64_t rows_per = buf.size() / rb;
    for (uint64_t r0 = 0; r0 < want_rows; r0 += rows_per) {
      const uint64_t m = std::min(rows_per, want_rows - r0);
      pread_exact(fd_.fd, path_, data_start_ + t.offset + r0 * rb, buf.data(), m * rb);
      for (uint64_t r = 0; r < m; ++r) decode_row(t.type, buf.data() + r * rb, out.data() + (r0 + r) * n, n);
    }
    check_finite(path_, "tensor " + name, out.data(), out.size());
  }

  static void decode_row(uint32_t type, const uint8_t* src, float* dst, uint64_t n) {
    switch (type) {
      case kTypeF32:
        std::memcpy(dst, src, n * 4);
        return;
      case kTypeF16:
      case kTypeBF16:
        for (uint64_t k = 0; k < n; ++k) {
          uint16_t h;
          std::memcpy(&h, src + 2 * k, 2);
          dst[k] = type == kTypeF16 ? f16_to_f32(h) : bf16_to_f32(h);
        }
        return;
      case kTypeQ8_0:
        dequantize_row_q8_0(reinterpret_cast<const BlockQ8_0*>(src), dst, size_t(n));
        return;
      case kTypeQ4_0:
        dequantize_row_q4_0(reinterpret_cast<const BlockQ4_0*>(src), dst, size_t(n));
        return;
    }
  }
};

}  // namespace

std::unique_ptr<ModelSource> open_gguf_source(const std::string& path) { return std::make_unique<GgufSource>(path); }

std::unique_ptr<GgufTensors> open_gguf_tensors(const std::string& path) {
  return std::make_unique<GgufSource>(path, false);
}

bool is_gguf_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char magic[4] = {};
  const bool ok = ::pread(fd, magic, 4, 0) == 4 && gguf_magic(magic) != GgufMagic::kNone;
  ::close(fd);
  return ok;
}

}  // namespace nl
