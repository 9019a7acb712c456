// Hugging Face checkpoints (config.json + model.safetensors; Llama family and OPT): reader, writer, and the any-model
// dispatch.
#include "formats/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <type_traits>

#include "formats/core/atomic_file.h"
#include "formats/core/error.h"
#include "formats/core/half.h"
#include "formats/gguf.h"
#include "formats/llama2c.h"
#include "formats/model_source.h"

namespace nl {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // the format's own limit is 100 MB

struct Fd {  // move-only: a copy would close the descriptor twice
  int fd = -1;
  Fd() = default;
  Fd(Fd&& o) noexcept : fd(o.fd) { o.fd = -1; }
  Fd& operator=(Fd&& o) noexcept {
    std::swap(fd, o.fd);
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

uint64_t dtype_bytes(const std::string& d) {
  if (d == "F32") return 4;
  if (d == "F16" || d == "BF16") return 2;
  return 0;
}

}  // namespace

std::vector<float> permute_rope_rows(const std::vector<float>& w, int n_heads, int head_dim, int cols, bool to_hf,
                                     int rot) {
  std::vector<float> out(w);  // rows past `rot` in each head (partial rotary) stay where they are
  if (rot <= 0) rot = head_dim;
  const int half = rot / 2;
  for (int h = 0; h < n_heads; ++h)
    for (int j = 0; j < half; ++j)
      for (int s = 0; s < 2; ++s) {
        const size_t canon = size_t(h) * head_dim + 2 * j + s, hf = size_t(h) * head_dim + size_t(s) * half + j;
        const size_t src = to_hf ? canon : hf, dst = to_hf ? hf : canon;
        std::copy_n(w.data() + src * cols, cols, out.data() + dst * cols);
      }
  return out;
}

namespace {

// A checkpoint's files: config.json and either one model.safetensors or, for a sharded checkpoint (as
// transformers' save_pretrained writes models above its shard size), model.safetensors.index.json and its shards.
struct Paths {
  std::string config, tensors;  // tensors: model.safetensors, or the index of a sharded checkpoint
  bool sharded = false;
};

Paths checkpoint_paths(const std::string& path) {
  fs::path p(path);
  std::error_code ec;
  fs::path dir;
  if (fs::is_directory(p, ec)) {
    dir = p;
  } else if (p.filename() == "model.safetensors.index.json") {
    dir = p.parent_path().empty() ? fs::path(".") : p.parent_path();
    const std::string config = (dir / "config.json").string();
    if (!fs::exists(config, ec)) throw InputError(config, "missing: a checkpoint needs config.json");
    return {config, p.string(), true};
  } else if (p.filename() == "config.json" || p.extension() == ".safetensors") {
    dir = p.parent_path().empty() ? fs::path(".") : p.parent_path();
  } else {
    throw InputError(path,
                     "not a Hugging Face checkpoint (expected a folder, config.json, model.safetensors or "
                     "model.safetensors.index.json)");
  }
  Paths out{(dir / "config.json").string(),
            p.extension() == ".safetensors" ? p.string() : (dir / "model.safetensors").string()};
  if (!fs::exists(out.config, ec)) throw InputError(out.config, "missing: a checkpoint needs config.json");
  if (!fs::exists(out.tensors, ec)) {
    const fs::path index = dir / "model.safetensors.index.json";
    if (p.extension() != ".safetensors" && fs::exists(index, ec)) return {out.config, index.string(), true};
    throw InputError(out.tensors,
                     "missing: a checkpoint needs model.safetensors (or model.safetensors.index.json "
                     "and its shards)");
  }
  return out;
}

template <class T>
T config_get(const json& j, const std::string& path, const char* key, const T* fallback) {
  if (!j.contains(key) || j[key].is_null()) {
    if (fallback) return *fallback;
    throw InputError(path, std::string("missing key '") + key + "'");
  }
  // Integers must be JSON integers and floats must fit a float: json's get<> would convert 1e300 with UB.
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    if (!j[key].is_number_integer() || (j[key].is_number_unsigned() && j[key].get<uint64_t>() > uint64_t(INT64_MAX)))
      throw InputError(path, std::string("key '") + key + "' has the wrong type (an integer is needed)");
  }
  if constexpr (std::is_floating_point_v<T>) {
    if (!j[key].is_number() || !(std::fabs(j[key].get<double>()) <= 3.0e38))
      throw InputError(path,
                       std::string("key '") + key + "' has the wrong type or is out of range (a number is needed)");
  }
  try {
    return j[key].get<T>();
  } catch (const json::exception&) {
    throw InputError(path, std::string("key '") + key + "' has the wrong type");
  }
}

// Reads an int config key in (0, 2^24].
int config_int(const json& j, const std::string& path, const char* key, const int64_t* fallback) {
  const int64_t v = config_get<int64_t>(j, path, key, fallback);
  if (v <= 0 || v > (1 << 24))
    throw InputError(path, std::string("key '") + key + "' = " + std::to_string(v) + " is out of range");
  return int(v);
}

// OPT (transformers' configuration_opt.py / modeling_opt.py). Supported: the pre-LayerNorm models (every size but
// 350M) with ReLU, biases and affine LayerNorms; refused by name otherwise.
ModelConfig read_opt_config(const json& j, const std::string& path) {
  ModelConfig c;
  c.arch = ModelArch::kOpt;
  c.act = FfnAct::kRelu;
  c.dim = config_int(j, path, "hidden_size", nullptr);
  c.hidden_dim = config_int(j, path, "ffn_dim", nullptr);
  c.n_layers = config_int(j, path, "num_hidden_layers", nullptr);
  c.n_heads = c.n_kv_heads = config_int(j, path, "num_attention_heads", nullptr);
  c.vocab_size = config_int(j, path, "vocab_size", nullptr);
  const int64_t max_pos = 2048, proj = c.dim;
  c.seq_len = config_int(j, path, "max_position_embeddings", &max_pos);
  c.norm_eps = 1e-5f;  // nn.LayerNorm's default: OPT's config has no key for it
  const bool yes = true, no = false;
  c.shared_classifier = config_get<bool>(j, path, "tie_word_embeddings", &yes);
  if (config_int(j, path, "word_embed_proj_dim", &proj) != c.dim)
    throw InputError(path, "word_embed_proj_dim != hidden_size (OPT-350M's project_in / project_out) is not supported");
  if (!config_get<bool>(j, path, "do_layer_norm_before", &yes))
    throw InputError(path, "do_layer_norm_before false (OPT-350M's post-LayerNorm block) is not supported");
  if (config_get<bool>(j, path, "_remove_final_layer_norm", &no))
    throw InputError(path, "_remove_final_layer_norm is not supported");
  if (!config_get<bool>(j, path, "enable_bias", &yes) ||
      !config_get<bool>(j, path, "layer_norm_elementwise_affine", &yes))
    throw InputError(path,
                     "OPT without biases or without LayerNorm weights (enable_bias / "
                     "layer_norm_elementwise_affine false) is not supported");
  const std::string relu = "relu";
  const std::string act = config_get<std::string>(j, path, "activation_function", &relu);
  if (act != "relu") throw InputError(path, "activation_function '" + act + "' is not supported (OPT: relu)");
  if (std::string p = model_config_problem(c); !p.empty()) throw InputError(path, p);
  return c;
}

// Phi (transformers' configuration_phi.py / modeling_phi.py: Phi-1, 1.5, 2): the parallel block with partial rotary
// embeddings and a GeLU (tanh) FFN. qk_layernorm and other activations are refused by name.
ModelConfig read_phi_config(const json& j, const std::string& path) {
  ModelConfig c;
  c.arch = ModelArch::kPhi;
  c.act = FfnAct::kGelu;
  c.dim = config_int(j, path, "hidden_size", nullptr);
  c.hidden_dim = config_int(j, path, "intermediate_size", nullptr);
  c.n_layers = config_int(j, path, "num_hidden_layers", nullptr);
  c.n_heads = config_int(j, path, "num_attention_heads", nullptr);
  const int64_t heads = c.n_heads, max_pos = 2048;
  c.n_kv_heads = config_int(j, path, "num_key_value_heads", &heads);
  c.vocab_size = config_int(j, path, "vocab_size", nullptr);
  c.seq_len = config_int(j, path, "max_position_embeddings", &max_pos);
  const double eps = 1e-5, theta = 10000.0, factor = 0.5;
  c.norm_eps = float(config_get<double>(j, path, "layer_norm_eps", &eps));
  c.rope_theta = float(config_get<double>(j, path, "rope_theta", &theta));
  const bool no = false;
  c.shared_classifier = config_get<bool>(j, path, "tie_word_embeddings", &no);
  const std::string gelu = "gelu_new";
  const std::string act = config_get<std::string>(j, path, "hidden_act", &gelu);
  if (act != "gelu_new" && act != "gelu_pytorch_tanh")
    throw InputError(path, "hidden_act '" + act + "' is not supported (Phi: gelu_new)");
  if (config_get<bool>(j, path, "qk_layernorm", &no)) throw InputError(path, "qk_layernorm is not supported");
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null())
    throw InputError(path, "rope_scaling is not supported");
  if (c.dim % c.n_heads != 0) throw InputError(path, "hidden_size is not a multiple of num_attention_heads");
  // modeling_phi.py: rotary_ndims = int(head_dim * partial_rotary_factor).
  const double f = config_get<double>(j, path, "partial_rotary_factor", &factor);
  if (!(f > 0.0 && f <= 1.0)) throw InputError(path, "partial_rotary_factor must be in (0, 1]");
  c.rope_dims = int(double(c.dim / c.n_heads) * f);
  if (c.rope_dims == c.dim / c.n_heads) c.rope_dims = 0;  // the whole head
  if (std::string p = model_config_problem(c); !p.empty()) throw InputError(path, p);
  return c;
}

ModelConfig read_config(const std::string& path) {
  json j;
  try {
    j = json::parse(read_file(path, 16u << 20));
  } catch (const json::exception& e) {  // parse_error, and out_of_range for numbers that overflow
    throw InputError(path, std::string("not valid JSON: ") + e.what());
  }
  if (!j.is_object()) throw InputError(path, "not a JSON object");
  const std::string llama = "llama";
  const std::string type = config_get<std::string>(j, path, "model_type", &llama);
  if (type == "opt") return read_opt_config(j, path);
  if (type == "phi") return read_phi_config(j, path);
  // Mistral is the Llama block with sliding-window attention (modeling_mistral.py): read as Llama plus the window.
  // Bamboo (TurboSparse-Mistral, PowerInfer's modeling_bamboo.py) is Mistral whose BambooMLP applies hidden_act to
  // both projections, down(act(gate x) * act(up x)): with its relu, dReLU.
  if (type != "llama" && type != "mistral" && type != "bamboo")
    throw InputError(path, "model_type '" + type + "' is not supported (llama, mistral, bamboo, opt or phi)");
  const bool bamboo = type == "bamboo";
  const std::string silu = "silu";
  std::string act = config_get<std::string>(j, path, "hidden_act", &silu);
  if (bamboo) {
    if (act != "relu")
      throw InputError(path, "model_type bamboo with hidden_act '" + act +
                                 "' is not supported (relu: TurboSparse's dReLU, act(gate x) * act(up x))");
    act = "drelu";
  }
  ModelConfig c;
  // silu (swish), relu, fatrelu (ProSparse: ReLU with the threshold hidden_act_param, as vLLM's FatreluAndMul),
  // drelu (TurboSparse: ReLU on both gate and up).
  if (act == "swish")
    c.act = FfnAct::kSilu;
  else if (!ffn_act_parse(act, &c.act) || c.act == FfnAct::kGelu)  // GeLU: Phi's (model_type phi)
    throw InputError(path, "hidden_act '" + act + "' is not supported (silu, relu, fatrelu or drelu)");
  if (c.act == FfnAct::kFatRelu) {
    if (!j.contains("hidden_act_param"))
      throw InputError(path, "hidden_act fatrelu needs hidden_act_param (the threshold)");
    const double t = config_get<double>(j, path, "hidden_act_param", nullptr);
    if (!(t >= 0.0 && t < 1e30)) throw InputError(path, "hidden_act_param must be finite and >= 0");
    c.fatrelu_threshold = float(t);
  }
  auto get_int = [&](const char* key, const int64_t* fb) {
    const int64_t v = config_get<int64_t>(j, path, key, fb);
    if (v <= 0 || v > (1 << 24))
      throw InputError(path, std::string("key '") + key + "' = " + std::to_string(v) + " is out of range");
    return int(v);
  };
  c.dim = get_int("hidden_size", nullptr);
  c.hidden_dim = get_int("intermediate_size", nullptr);
  c.n_layers = get_int("num_hidden_layers", nullptr);
  c.n_heads = get_int("num_attention_heads", nullptr);
  const int64_t heads = c.n_heads, max_pos = 2048;
  c.n_kv_heads = get_int("num_key_value_heads", &heads);
  c.vocab_size = get_int("vocab_size", nullptr);
  c.seq_len = get_int("max_position_embeddings", &max_pos);
  const double eps = 1e-6, theta = 10000.0;
  c.norm_eps = float(config_get<double>(j, path, "rms_norm_eps", &eps));
  c.rope_theta = float(config_get<double>(j, path, "rope_theta", &theta));
  const bool no = false;
  c.shared_classifier = config_get<bool>(j, path, "tie_word_embeddings", &no);
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null())
    throw InputError(path, "rope_scaling is not supported");
  if (config_get<bool>(j, path, "attention_bias", &no) || config_get<bool>(j, path, "mlp_bias", &no))
    throw InputError(path, "attention_bias / mlp_bias are not supported");
  if ((type == "mistral" || bamboo) && j.contains("sliding_window") && !j["sliding_window"].is_null()) {
    const int64_t w = config_get<int64_t>(j, path, "sliding_window", nullptr);
    if (w <= 0 || w > (1 << 24))
      throw InputError(path, "key 'sliding_window' = " + std::to_string(w) + " is out of range");
    c.sliding_window = int(w);  // null / absent: every position (as HF)
  }
  if (std::string p = model_config_problem(c); !p.empty()) throw InputError(path, p);
  if (j.contains("head_dim") && !j["head_dim"].is_null()) {
    const int64_t hd = config_get<int64_t>(j, path, "head_dim", nullptr);
    if (hd != c.head_dim())
      throw InputError(path, "head_dim " + std::to_string(hd) + " != hidden_size / num_attention_heads (" +
                                 std::to_string(c.head_dim()) + "); not supported");
  }
  return c;
}

// The shortest decimal that reads back as the same float (1e-05 rather than 9.999999747378752e-06).
double float_for_json(float f) {
  char buf[32];
  auto r = std::to_chars(buf, buf + sizeof buf, f);
  return std::strtod(std::string(buf, r.ptr).c_str(), nullptr);
}

// A checkpoint's tensors (HF names, shapes) in the writer's fixed order (offsets follow it, so the file is
// deterministic), each with where ModelWeights holds it.
struct HfTensor {
  std::string name;
  std::vector<uint64_t> shape;
  int layer = -1;  // per-layer tensors: the layer
  std::string part;
  char ffn = 0;  // what a neuron order permutes: 'g'ate, 'u'p (rows), 'd'own (columns), 'b': fc1's bias (OPT)
  std::vector<float> ModelWeights::*model_field = nullptr;  // layer < 0
  std::vector<float> LayerWeights::*layer_field = nullptr;  // layer >= 0
  bool rope_rows = false;                                   // q / k of a RoPE model: rows in rotate_half order on disk

  std::vector<float>& in(ModelWeights& w) const {
    return layer < 0 ? w.*model_field : w.layers[size_t(layer)].*layer_field;
  }
  const std::vector<float>& in(const ModelWeights& w) const {
    return layer < 0 ? w.*model_field : w.layers[size_t(layer)].*layer_field;
  }
};

std::vector<HfTensor> hf_tensor_list(const ModelConfig& c) {
  const uint64_t dim = uint64_t(c.dim), kv = uint64_t(c.kv_dim()), hid = uint64_t(c.hidden_dim),
                 voc = uint64_t(c.vocab_size);
  using MW = ModelWeights;
  using LW = LayerWeights;
  std::vector<HfTensor> t;
  auto model = [&](std::string name, std::vector<uint64_t> shape, std::vector<float> MW::*f) {
    t.push_back({std::move(name), std::move(shape), -1, "", 0, f, nullptr, false});
  };
  if (c.arch == ModelArch::kOpt) {  // modeling_opt.py's OPTForCausalLM state dict
    const std::string pre = "model.decoder.";
    model(pre + "embed_tokens.weight", {voc, dim}, &MW::tok_embeddings);
    model(pre + "embed_positions.weight", {uint64_t(c.seq_len + kOptPositionOffset), dim}, &MW::pos_embeddings);
    for (int i = 0; i < c.n_layers; ++i) {
      auto add = [&](const char* part, std::vector<uint64_t> shape, std::vector<float> LW::*f, char ffn = 0) {
        t.push_back(
            {pre + "layers." + std::to_string(i) + "." + part, std::move(shape), i, part, ffn, nullptr, f, false});
      };
      add("self_attn.k_proj.weight", {kv, dim}, &LW::wk);
      add("self_attn.k_proj.bias", {kv}, &LW::bk);
      add("self_attn.v_proj.weight", {kv, dim}, &LW::wv);
      add("self_attn.v_proj.bias", {kv}, &LW::bv);
      add("self_attn.q_proj.weight", {dim, dim}, &LW::wq);
      add("self_attn.q_proj.bias", {dim}, &LW::bq);
      add("self_attn.out_proj.weight", {dim, dim}, &LW::wo);
      add("self_attn.out_proj.bias", {dim}, &LW::bo);
      add("self_attn_layer_norm.weight", {dim}, &LW::rms_att);
      add("self_attn_layer_norm.bias", {dim}, &LW::att_norm_b);
      add("fc1.weight", {hid, dim}, &LW::w_up, 'u');
      add("fc1.bias", {hid}, &LW::b_up, 'b');
      add("fc2.weight", {dim, hid}, &LW::w_down, 'd');
      add("fc2.bias", {dim}, &LW::b_down);
      add("final_layer_norm.weight", {dim}, &LW::rms_ffn);
      add("final_layer_norm.bias", {dim}, &LW::ffn_norm_b);
    }
    model(pre + "final_layer_norm.weight", {dim}, &MW::rms_final);
    model(pre + "final_layer_norm.bias", {dim}, &MW::final_norm_b);
    if (!c.shared_classifier) model("lm_head.weight", {voc, dim}, &MW::wcls);
    return t;
  }
  if (c.arch == ModelArch::kPhi) {  // modeling_phi.py's PhiForCausalLM state dict
    model("model.embed_tokens.weight", {voc, dim}, &MW::tok_embeddings);
    for (int i = 0; i < c.n_layers; ++i) {
      auto add = [&](const char* part, std::vector<uint64_t> shape, std::vector<float> LW::*f, char ffn = 0,
                     bool rope = false) {
        t.push_back(
            {"model.layers." + std::to_string(i) + "." + part, std::move(shape), i, part, ffn, nullptr, f, rope});
      };
      add("input_layernorm.weight", {dim}, &LW::rms_att);
      add("input_layernorm.bias", {dim}, &LW::att_norm_b);
      add("self_attn.q_proj.weight", {dim, dim}, &LW::wq, 0, true);
      add("self_attn.q_proj.bias", {dim}, &LW::bq, 0, true);
      add("self_attn.k_proj.weight", {kv, dim}, &LW::wk, 0, true);
      add("self_attn.k_proj.bias", {kv}, &LW::bk, 0, true);
      add("self_attn.v_proj.weight", {kv, dim}, &LW::wv);
      add("self_attn.v_proj.bias", {kv}, &LW::bv);
      add("self_attn.dense.weight", {dim, dim}, &LW::wo);
      add("self_attn.dense.bias", {dim}, &LW::bo);
      add("mlp.fc1.weight", {hid, dim}, &LW::w_up, 'u');
      add("mlp.fc1.bias", {hid}, &LW::b_up, 'b');
      add("mlp.fc2.weight", {dim, hid}, &LW::w_down, 'd');
      add("mlp.fc2.bias", {dim}, &LW::b_down);
    }
    model("model.final_layernorm.weight", {dim}, &MW::rms_final);
    model("model.final_layernorm.bias", {dim}, &MW::final_norm_b);
    if (!c.shared_classifier) model("lm_head.weight", {voc, dim}, &MW::wcls);
    model("lm_head.bias", {voc}, &MW::cls_b);
    return t;
  }
  model("model.embed_tokens.weight", {voc, dim}, &MW::tok_embeddings);
  for (int i = 0; i < c.n_layers; ++i) {
    auto add = [&](const char* part, std::vector<uint64_t> shape, std::vector<float> LW::*f, char ffn = 0,
                   bool rope = false) {
      t.push_back({"model.layers." + std::to_string(i) + "." + part, std::move(shape), i, part, ffn, nullptr, f, rope});
    };
    add("input_layernorm.weight", {dim}, &LW::rms_att);
    add("self_attn.q_proj.weight", {dim, dim}, &LW::wq, 0, true);
    add("self_attn.k_proj.weight", {kv, dim}, &LW::wk, 0, true);
    add("self_attn.v_proj.weight", {kv, dim}, &LW::wv);
    add("self_attn.o_proj.weight", {dim, dim}, &LW::wo);
    add("post_attention_layernorm.weight", {dim}, &LW::rms_ffn);
    add("mlp.gate_proj.weight", {hid, dim}, &LW::w_gate, 'g');
    add("mlp.up_proj.weight", {hid, dim}, &LW::w_up, 'u');
    add("mlp.down_proj.weight", {dim, hid}, &LW::w_down, 'd');
  }
  model("model.norm.weight", {dim}, &MW::rms_final);
  if (!c.shared_classifier) model("lm_head.weight", {voc, dim}, &MW::wcls);
  return t;
}

// A q / k tensor of a RoPE model (weight rows, or its bias: rows of one column) between HF's rotate_half order and the
// canonical pairs (permute_rope_rows; Phi's partial rotary turns the first rope_dim() rows of each head).
std::vector<float> hf_rope_rows(const HfTensor& t, const ModelConfig& c, const std::vector<float>& v, bool to_hf) {
  const int hd = c.head_dim(), cols = t.shape.size() > 1 ? int(t.shape[1]) : 1;
  return permute_rope_rows(v, int(t.shape[0]) / hd, hd, cols, to_hf, c.rope_dim());
}

// The layer tensors' common prefix (what follows is "{layer}.").
std::string hf_layers_prefix(const ModelConfig& c) {
  return c.arch == ModelArch::kOpt ? "model.decoder.layers." : "model.layers.";
}

uint64_t hf_numel(const HfTensor& t) {
  uint64_t n = 1;
  for (uint64_t d : t.shape) n *= d;
  return n;
}

// The safetensors header of `tensors` stored as `dtype`, padded so the data section is 8-byte aligned (as the
// reference writer does).
std::string hf_header_text(const std::vector<HfTensor>& tensors, TensorDtype dtype) {
  const uint64_t esize = dtype == TensorDtype::kF32 ? 4 : 2;
  const char* dname = dtype == TensorDtype::kF32 ? "F32" : dtype == TensorDtype::kF16 ? "F16" : "BF16";
  json header = json::object();
  header["__metadata__"] = {{"format", "pt"}};
  uint64_t off = 0;
  for (const HfTensor& t : tensors) {
    const uint64_t bytes = hf_numel(t) * esize;
    header[t.name] = {{"dtype", dname}, {"shape", t.shape}, {"data_offsets", {off, off + bytes}}};
    off += bytes;
  }
  std::string text = header.dump();
  while (text.size() % 8) text += ' ';
  return text;
}

std::string hf_torch_dtype(TensorDtype dtype) {
  return dtype == TensorDtype::kF32 ? "float32" : dtype == TensorDtype::kF16 ? "float16" : "bfloat16";
}

std::string hf_config_text(const ModelConfig& c, TensorDtype dtype) {
  if (c.arch == ModelArch::kOpt) {
    const json cfg = {{"architectures", {"OPTForCausalLM"}},
                      {"model_type", "opt"},
                      {"hidden_size", c.dim},
                      {"ffn_dim", c.hidden_dim},
                      {"num_hidden_layers", c.n_layers},
                      {"num_attention_heads", c.n_heads},
                      {"vocab_size", c.vocab_size},
                      {"max_position_embeddings", c.seq_len},
                      {"word_embed_proj_dim", c.dim},
                      {"do_layer_norm_before", true},
                      {"activation_function", "relu"},
                      {"enable_bias", true},
                      {"layer_norm_elementwise_affine", true},
                      {"tie_word_embeddings", c.shared_classifier},
                      {"bos_token_id", 2},
                      {"eos_token_id", 2},
                      {"pad_token_id", 1},
                      {"torch_dtype", hf_torch_dtype(dtype)}};
    return cfg.dump(2) + "\n";
  }
  if (c.arch == ModelArch::kPhi) {
    const json cfg = {{"architectures", {"PhiForCausalLM"}},
                      {"model_type", "phi"},
                      {"hidden_size", c.dim},
                      {"intermediate_size", c.hidden_dim},
                      {"num_hidden_layers", c.n_layers},
                      {"num_attention_heads", c.n_heads},
                      {"num_key_value_heads", c.n_kv_heads},
                      {"vocab_size", c.vocab_size},
                      {"max_position_embeddings", c.seq_len},
                      {"partial_rotary_factor", double(c.rope_dim()) / double(c.head_dim())},
                      {"rope_theta", float_for_json(c.rope_theta)},
                      {"layer_norm_eps", float_for_json(c.norm_eps)},
                      {"hidden_act", "gelu_new"},
                      {"qk_layernorm", false},
                      {"tie_word_embeddings", c.shared_classifier},
                      {"torch_dtype", hf_torch_dtype(dtype)}};
    return cfg.dump(2) + "\n";
  }
  const bool mistral = c.sliding_window > 0;  // the one Llama-block family with a window
  json cfg = {{"architectures", {mistral ? "MistralForCausalLM" : "LlamaForCausalLM"}},
              {"model_type", mistral ? "mistral" : "llama"},
              {"hidden_size", c.dim},
              {"intermediate_size", c.hidden_dim},
              {"num_hidden_layers", c.n_layers},
              {"num_attention_heads", c.n_heads},
              {"num_key_value_heads", c.n_kv_heads},
              {"vocab_size", c.vocab_size},
              {"max_position_embeddings", c.seq_len},
              {"rms_norm_eps", float_for_json(c.norm_eps)},
              {"rope_theta", float_for_json(c.rope_theta)},
              {"hidden_act", ffn_act_name(c.act)},
              {"tie_word_embeddings", c.shared_classifier},
              {"bos_token_id", 1},
              {"eos_token_id", 2},
              {"torch_dtype", hf_torch_dtype(dtype)}};
  if (mistral) cfg["sliding_window"] = c.sliding_window;
  if (c.act == FfnAct::kFatRelu) cfg["hidden_act_param"] = float_for_json(c.fatrelu_threshold);
  return cfg.dump(2) + "\n";
}

void hf_dir_create(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw IoError(dir, "cannot create folder: " + ec.message());
}

}  // namespace

TensorDtype tensor_dtype_from_name(const std::string& name) {
  if (name == "f32") return TensorDtype::kF32;
  if (name == "f16") return TensorDtype::kF16;
  if (name == "bf16") return TensorDtype::kBF16;
  throw UsageError("unknown dtype '" + name + "' (f32, f16, bf16)");
}

std::vector<SafetensorsEntry> safetensors_header(const std::string& path, uint64_t* data_start) {
  Fd f;
  f.fd = open_regular_input(path);
  struct stat st;
  if (::fstat(f.fd, &st) != 0) throw IoError(path, errno_text("stat"));
  const uint64_t size = uint64_t(st.st_size);
  if (size < 8) throw InputError(path, "too small for a safetensors header (" + std::to_string(size) + " bytes)");
  uint64_t n = 0;
  pread_exact(f.fd, path, 0, &n, 8);  // little-endian u64 (x86 and aarch64 are little-endian)
  if (n > kMaxHeaderBytes || n > size - 8)
    throw InputError(path, "header length " + std::to_string(n) + " exceeds the file (" + std::to_string(size) +
                               " bytes) or the 100 MB limit");
  std::string text(n, '\0');
  pread_exact(f.fd, path, 8, text.data(), n);
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for numbers that overflow
    throw InputError(path, std::string("header is not valid JSON: ") + e.what());
  }
  if (!j.is_object()) throw InputError(path, "header is not a JSON object");
  const uint64_t data_size = size - 8 - n;
  std::vector<SafetensorsEntry> out;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const json& e = it.value();
    const std::string where = "tensor '" + it.key() + "'";
    if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") || !e.contains("data_offsets") ||
        !e["dtype"].is_string() || !e["shape"].is_array() || !e["data_offsets"].is_array() ||
        e["data_offsets"].size() != 2)
      throw InputError(path, where + ": entry needs dtype, shape and data_offsets [begin, end]");
    SafetensorsEntry t;
    t.name = it.key();
    t.dtype = e["dtype"].get<std::string>();
    const uint64_t esize = dtype_bytes(t.dtype);
    if (esize == 0) throw InputError(path, where + ": unknown or unsupported dtype '" + t.dtype + "' (F32, F16, BF16)");
    uint64_t numel = 1;
    for (const json& d : e["shape"]) {
      if (!d.is_number_unsigned()) throw InputError(path, where + ": shape holds a non-integer or negative value");
      const uint64_t v = d.get<uint64_t>();
      if (v != 0 && numel > (uint64_t(1) << 48) / v) throw InputError(path, where + ": shape is absurdly large");
      numel *= v;
      t.shape.push_back(v);
    }
    for (const json& d : e["data_offsets"])
      if (!d.is_number_unsigned()) throw InputError(path, where + ": data_offsets must be non-negative integers");
    t.begin = e["data_offsets"][0].get<uint64_t>();
    t.end = e["data_offsets"][1].get<uint64_t>();
    if (t.begin > t.end || t.end > data_size)
      throw InputError(path, where + ": data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
                                 "] out of range (data section has " + std::to_string(data_size) + " bytes)");
    if (t.end - t.begin != numel * esize)
      throw InputError(path, where + ": data_offsets span " + std::to_string(t.end - t.begin) +
                                 " bytes, shape and dtype need " + std::to_string(numel * esize));
    out.push_back(std::move(t));
  }
  // As the reference loader (safetensors' Metadata::validate): in offset order, each tensor starts where the one
  // before ends and the last ends at the end of the file. Overlapping or shifted offsets would pack wrong weights.
  std::vector<const SafetensorsEntry*> by_offset;
  for (const SafetensorsEntry& t : out) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](const SafetensorsEntry* a, const SafetensorsEntry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t expect = 0;
  const SafetensorsEntry* prev = nullptr;
  for (const SafetensorsEntry* t : by_offset) {
    if (t->begin != expect)
      throw InputError(path, "tensor '" + t->name + "': data_offsets begin at " + std::to_string(t->begin) +
                                 (t->begin < expect ? ", inside " : ", leaving a gap after ") +
                                 (prev ? "tensor '" + prev->name + "'" : std::string("the start of the data")) +
                                 " (which ends at " + std::to_string(expect) + ")");
    expect = t->end;
    prev = t;
  }
  if (expect != data_size)
    throw InputError(path, "the tensors cover " + std::to_string(expect) + " bytes of the data section, which has " +
                               std::to_string(data_size));
  if (data_start) *data_start = 8 + n;
  return out;
}

// One safetensors file of a checkpoint (the only one, or a shard), open for reading.
struct SafetensorsTensors::Impl {
  struct Shard {
    std::string path;
    uint64_t data_start = 0;
    Fd f;
  };
  struct Located {
    SafetensorsEntry e;
    size_t shard = 0;
  };
  std::string tensors;  // the file, or the index of a sharded checkpoint (named in messages)
  std::vector<Shard> shards;
  std::map<std::string, Located> entries;

  size_t add_shard(const std::string& file) {
    shards.emplace_back();
    shards.back().path = file;
    shards.back().f.fd = open_regular_input(file);
    return shards.size() - 1;
  }

  // model.safetensors.index.json: {"metadata": {...}, "weight_map": {tensor: shard file name}}. Each shard is a file
  // name in the index's folder (a path is refused, as the manifest's file names are), and must hold exactly the
  // tensors the map assigns to it: a tensor missing from its shard, held by a shard the map does not name for it, or
  // a shard file no tensor maps to would be a checkpoint other than the one the index describes.
  void open_shards(const std::string& index_path) {
    const fs::path dir =
        fs::path(index_path).parent_path().empty() ? fs::path(".") : fs::path(index_path).parent_path();
    json j;
    try {
      j = json::parse(read_file(index_path, 64ull << 20));
    } catch (const json::exception& e) {
      throw InputError(index_path, std::string("not valid JSON: ") + e.what());
    }
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object() || j["weight_map"].empty())
      throw InputError(index_path, "needs a non-empty 'weight_map' object (tensor name -> shard file)");
    std::map<std::string, size_t> shard_of_file;
    std::map<std::string, std::string> want;  // tensor -> shard file
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it.value().is_string()) throw InputError(index_path, "weight_map['" + it.key() + "'] is not a file name");
      const std::string f = it.value().get<std::string>();
      if (f.empty() || f.find('/') != std::string::npos || f == "." || f == ".." || f.find('\0') != std::string::npos)
        throw InputError(index_path, "weight_map['" + it.key() + "'] = '" + f.substr(0, 64) +
                                         "' must be a file name in the checkpoint's folder, not a path");
      want[it.key()] = f;
      if (!shard_of_file.count(f)) {
        const std::string file = (dir / f).string();
        std::error_code ec;
        if (!fs::exists(file, ec)) throw InputError(index_path, "names shard " + f + ", which is missing");
        shard_of_file[f] = add_shard(file);
      }
    }
    for (const auto& [f, k] : shard_of_file) {
      Shard& sh = shards[k];
      for (auto& e : safetensors_header(sh.path, &sh.data_start)) {
        auto w = want.find(e.name);
        if (w == want.end())
          throw InputError(sh.path, "holds tensor '" + e.name + "', which " + index_path + " does not list");
        if (w->second != f)
          throw InputError(sh.path, "holds tensor '" + e.name + "', which " + index_path + " places in " + w->second);
        if (!entries.emplace(e.name, Located{e, k}).second)
          throw InputError(sh.path, "holds tensor '" + e.name + "' twice");
      }
    }
    for (const auto& [name, f] : want)
      if (!entries.count(name))
        throw InputError(index_path, "places tensor '" + name + "' in " + f + ", which does not hold it");
  }
};

SafetensorsTensors::SafetensorsTensors(const std::string& tensors, bool sharded) : impl_(std::make_unique<Impl>()) {
  impl_->tensors = tensors;
  if (sharded) {
    impl_->open_shards(tensors);
  } else {
    impl_->add_shard(tensors);
    for (auto& e : safetensors_header(tensors, &impl_->shards[0].data_start))
      impl_->entries.emplace(e.name, Impl::Located{e, 0});
  }
}
SafetensorsTensors::~SafetensorsTensors() = default;
const std::string& SafetensorsTensors::path() const { return impl_->tensors; }
const SafetensorsEntry* SafetensorsTensors::find(const std::string& name) const {
  auto it = impl_->entries.find(name);
  return it == impl_->entries.end() ? nullptr : &it->second.e;
}
const std::string& SafetensorsTensors::file_of(const SafetensorsEntry& e) const {
  return impl_->shards[impl_->entries.at(e.name).shard].path;
}
std::vector<std::string> SafetensorsTensors::names() const {
  std::vector<std::string> out;
  for (const auto& kv : impl_->entries) out.push_back(kv.first);
  return out;
}
void SafetensorsTensors::read_f32(const SafetensorsEntry& e, uint64_t first, uint64_t n, float* dst) const {
  const Impl::Shard& sh = impl_->shards[impl_->entries.at(e.name).shard];
  safetensors_read_f32(sh.f.fd, sh.path, sh.data_start, e, first, n, dst);
}

std::unique_ptr<SafetensorsTensors> open_safetensors_tensors(const std::string& path) {
  std::error_code ec;
  if (fs::path(path).extension() == ".safetensors" && fs::is_regular_file(path, ec))
    return std::make_unique<SafetensorsTensors>(path, false);
  const Paths p = checkpoint_paths(path);
  return std::make_unique<SafetensorsTensors>(p.tensors, p.sharded);
}

namespace {

// Tensors by name from the validated header; each read is a pread of just that tensor, converted to fp32.
class SafetensorsSource : public ModelSource {
 public:
  explicit SafetensorsSource(const std::string& path) {
    const Paths p = checkpoint_paths(path);
    path_ = fs::path(p.tensors).parent_path().string();
    if (path_.empty()) path_ = ".";
    config_ = read_config(p.config);
    st_ = std::make_unique<SafetensorsTensors>(p.tensors, p.sharded);
    refuse_extra_layers(p.config);
  }

  ModelWeights read_dense() override {
    if (config_.arch != ModelArch::kLlama) {  // OPT, Phi: by the tensor list (fc1's bias is a dense tensor here)
      ModelWeights w;
      w.source = path_;
      w.config = config_;
      w.layers.resize(size_t(config_.n_layers));
      for (const HfTensor& t : hf_tensor_list(config_))
        if (t.ffn == 0 || t.ffn == 'b') {
          std::vector<float>& v = t.in(w);
          load(t.name, t.shape[0], t.shape.size() > 1 ? t.shape[1] : 0, v);
          if (t.rope_rows) v = hf_rope_rows(t, config_, v, false);  // Phi's q / k rows and biases
        }
      return w;
    }
    static const std::map<std::string, std::string> kNames = {{"embed", "model.embed_tokens.weight"},
                                                              {"attn_norm", "input_layernorm.weight"},
                                                              {"q", "self_attn.q_proj.weight"},
                                                              {"k", "self_attn.k_proj.weight"},
                                                              {"v", "self_attn.v_proj.weight"},
                                                              {"o", "self_attn.o_proj.weight"},
                                                              {"ffn_norm", "post_attention_layernorm.weight"},
                                                              {"final_norm", "model.norm.weight"},
                                                              {"output", "lm_head.weight"}};
    auto name = [](const char* role, int layer) {
      const std::string& n = kNames.at(role);
      return layer < 0 ? n : "model.layers." + std::to_string(layer) + "." + n;
    };
    auto ld = [this](const std::string& n, uint64_t rows, uint64_t cols, std::vector<float>& out) {
      load(n, rows, cols, out);
    };
    return read_llama_dense(config_, path_, name, ld, true);  // HF q/k rows: rotate_half order
  }

  void read_ffn(int layer, LayerWeights* L) override {
    if (config_.arch != ModelArch::kLlama) {
      L->w_gate.clear();
      for (const HfTensor& t : hf_tensor_list(config_))
        if (t.layer == layer && (t.ffn == 'u' || t.ffn == 'd')) load(t.name, t.shape[0], t.shape[1], L->*t.layer_field);
      return;
    }
    const uint64_t dim = uint64_t(config_.dim), hid = uint64_t(config_.hidden_dim);
    const std::string pre = "model.layers." + std::to_string(layer) + ".";
    load(pre + "mlp.gate_proj.weight", hid, dim, L->w_gate);
    load(pre + "mlp.up_proj.weight", hid, dim, L->w_up);
    load(pre + "mlp.down_proj.weight", dim, hid, L->w_down);
  }

  // In the writer's tensor order, as f32: FFN matrices one at a time (read, permuted, written), every other tensor
  // converted to f32 in chunks. q/k are copied as stored: reading un-permutes their rows for RoPE and writing
  // permutes them back, which is the identity.
  void write_permuted(const std::string& dir, const std::vector<std::vector<uint32_t>>& order,
                      const ProgressFn& progress) override {
    ffn_order_check(order, config_);
    const std::vector<HfTensor> tensors = hf_tensor_list(config_);
    for (const HfTensor& t : tensors) entry(t.name, t.shape[0], t.shape.size() > 1 ? t.shape[1] : 0);  // all present
    hf_dir_create(dir);
    AtomicWriter out((fs::path(dir) / "model.safetensors").string());
    const std::string header = hf_header_text(tensors, TensorDtype::kF32);
    const uint64_t hlen = header.size();
    out.write(&hlen, 8);
    out.write(header);
    static const std::vector<uint32_t> identity;
    const uint64_t total =
        uint64_t(std::count_if(tensors.begin(), tensors.end(), [](const HfTensor& t) { return t.ffn; }));
    uint64_t done = 0;
    std::vector<float> m;
    for (const HfTensor& t : tensors) {
      const uint64_t rows = t.shape[0], cols = t.shape.size() > 1 ? t.shape[1] : 0;
      if (!t.ffn) {
        copy_f32(out, entry(t.name, rows, cols));
        continue;
      }
      load(t.name, rows, cols, m);
      const std::vector<uint32_t>& perm = order.empty() ? identity : order[size_t(t.layer)];
      if (t.ffn == 'd')
        write_cols_permuted(out, m, size_t(cols), perm);
      else
        write_rows_permuted(out, m, size_t(std::max<uint64_t>(cols, 1)), perm);  // 'b': a vector, one per row
      if (progress) progress(++done, total);
    }
    out.commit();
    write_file_atomic((fs::path(dir) / "config.json").string(), hf_config_text(config_, TensorDtype::kF32));
  }

 private:
  std::unique_ptr<SafetensorsTensors> st_;

  // A checkpoint holding layers past config.json's num_hidden_layers (an edited or mismatched config) would be read
  // as a shallower model with exit 0: refused, naming the first extra layer.
  void refuse_extra_layers(const std::string& config_path) const {
    const std::string pre = hf_layers_prefix(config_);
    long extra = -1;
    for (const std::string& name : st_->names()) {
      if (name.compare(0, pre.size(), pre) != 0) continue;
      const size_t dot = name.find('.', pre.size());
      const std::string num = name.substr(pre.size(), dot == std::string::npos ? std::string::npos : dot - pre.size());
      if (num.empty() || num.size() > 9 || num.find_first_not_of("0123456789") != std::string::npos) continue;
      const long l = std::stol(num);
      if (l >= config_.n_layers && (extra < 0 || l < extra)) extra = l;
    }
    if (extra >= 0)
      throw InputError(config_path, "num_hidden_layers is " + std::to_string(config_.n_layers) + " but " + st_->path() +
                                        " holds layer " + std::to_string(extra) + " (" + pre + std::to_string(extra) +
                                        ".*): the config does not describe this checkpoint");
  }

  // The header entry of `name`, checked against the shape config.json implies ([rows] when cols = 0).
  const SafetensorsEntry& entry(const std::string& name, uint64_t rows, uint64_t cols) const {
    const SafetensorsEntry* found = st_->find(name);
    if (!found) throw InputError(st_->path(), "missing tensor '" + name + "'");
    const SafetensorsEntry& e = *found;
    const bool vec = cols == 0;
    const bool shape_ok = vec ? (e.shape.size() == 1 && e.shape[0] == rows)
                              : (e.shape.size() == 2 && e.shape[0] == rows && e.shape[1] == cols);
    if (!shape_ok) {
      std::string s;
      for (uint64_t d : e.shape) s += (s.empty() ? "" : ", ") + std::to_string(d);
      throw InputError(st_->file_of(e), "tensor '" + name + "' has shape [" + s + "], config.json implies [" +
                                            std::to_string(rows) + (vec ? "" : ", " + std::to_string(cols)) + "]");
    }
    return e;
  }

  void read_f32(const SafetensorsEntry& e, uint64_t first, uint64_t n, float* dst) { st_->read_f32(e, first, n, dst); }

  void load(const std::string& name, uint64_t rows, uint64_t cols, std::vector<float>& dst) {
    const SafetensorsEntry& e = entry(name, rows, cols);
    dst.resize(cols == 0 ? rows : rows * cols);
    read_f32(e, 0, dst.size(), dst.data());
  }

  // Tensor `e` to `out` as fp32, half a MiB at a time.
  void copy_f32(AtomicWriter& out, const SafetensorsEntry& e) {
    const uint64_t numel = (e.end - e.begin) / dtype_bytes(e.dtype);
    std::vector<float> buf(size_t(1) << 17);
    for (uint64_t i = 0; i < numel; i += buf.size()) {
      const uint64_t n = std::min<uint64_t>(buf.size(), numel - i);
      read_f32(e, i, n, buf.data());
      out.write(buf.data(), size_t(n) * 4);
    }
  }
};

}  // namespace

void safetensors_read_f32(int fd, const std::string& path, uint64_t data_start, const SafetensorsEntry& e,
                          uint64_t first, uint64_t n, float* dst) {
  if (e.dtype == "F32") {
    pread_exact(fd, path, data_start + e.begin + first * 4, dst, n * 4);
  } else {
    std::vector<uint16_t> h(static_cast<size_t>(n));
    pread_exact(fd, path, data_start + e.begin + first * 2, h.data(), n * 2);
    if (e.dtype == "F16") {
      for (uint64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(h[size_t(i)]);
    } else {
      for (uint64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(h[size_t(i)]);
    }
  }
  check_finite(path, "tensor '" + e.name + "'", dst, n, first);
}

std::unique_ptr<ModelSource> open_safetensors_source(const std::string& path) {
  return std::make_unique<SafetensorsSource>(path);
}

ModelWeights read_safetensors_model(const std::string& path) {
  SafetensorsSource src(path);
  return read_model_source(src);
}

void write_safetensors_model(const std::string& dir, const ModelWeights& w, TensorDtype dtype) {
  const ModelConfig& c = w.config;
  for (const auto& L : w.layers)
    if (L.w_up.empty()) throw UsageError(dir + ": the model's FFN weights are not in memory");
  hf_dir_create(dir);
  const std::vector<HfTensor> tensors = hf_tensor_list(c);
  // Each tensor's data in the writer's convention (q/k rows of a RoPE model permuted back to HF's rotate_half order).
  auto data = [&](const HfTensor& t) -> std::vector<float> {
    const std::vector<float>& v = t.in(w);
    return t.rope_rows ? hf_rope_rows(t, c, v, true) : v;
  };
  AtomicWriter out((fs::path(dir) / "model.safetensors").string());
  const std::string htext = hf_header_text(tensors, dtype);
  const uint64_t hlen = htext.size();
  out.write(&hlen, 8);
  out.write(htext);
  std::vector<uint16_t> half;
  for (const HfTensor& t : tensors) {
    const std::vector<float> v = data(t);
    if (v.size() != hf_numel(t)) throw InternalError("write_safetensors_model: " + t.name + " has the wrong size");
    if (dtype == TensorDtype::kF32) {
      out.write(v.data(), v.size() * 4);
      continue;
    }
    half.resize(v.size());
    for (size_t i = 0; i < v.size(); ++i) half[i] = dtype == TensorDtype::kF16 ? f32_to_f16(v[i]) : f32_to_bf16(v[i]);
    out.write(half.data(), half.size() * 2);
  }
  out.commit();
  write_file_atomic((fs::path(dir) / "config.json").string(), hf_config_text(c, dtype));
}

ModelWeights read_model(const std::string& path) {
  auto src = open_model_source(path);
  return read_model_source(*src);
}

std::unique_ptr<ModelSource> open_model_source(const std::string& path) {
  std::error_code ec;
  const fs::path p(path);
  if (!fs::exists(p, ec)) throw IoError(path, "no such file or folder");
  if (!fs::is_directory(p, ec)) {
    if (p.extension() == ".bin") return open_llama2c_source(path);
    if (is_gguf_file(path) || p.extension() == ".gguf")
      return open_gguf_source(path);  // .gguf: names the problem  // names the problem (no magic, truncated, ...)
  }
  return open_safetensors_source(path);
}

}  // namespace nl
