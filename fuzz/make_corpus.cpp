// Writes the fuzzers' seed corpus with the toolkit's own writers: valid files of every format (and a few
// near-misses), one folder per harness. Usage: make_corpus OUT_DIR
#include <cstring>
#include <filesystem>
#include <fstream>
#include <tuple>

#include "formats/core/atomic_file.h"
#include "formats/core/image_writer.h"
#include "formats/layout.h"
#include "formats/llama2c.h"
#include "formats/safetensors.h"
#include "formats/trace.h"
#include "fuzz/fuzz_util.h"
#include "runtime/device.h"

namespace fs = std::filesystem;
using namespace nl;

namespace {

// llama2.c tokenizer.bin: max_token_length, then (score, length, bytes) per token.
std::string tokenizer_bin(const std::vector<std::string>& pieces) {
  std::string s;
  auto put = [&s](const void* p, size_t n) { s.append(static_cast<const char*>(p), n); };
  int32_t max_len = 0;
  for (const auto& p : pieces) max_len = std::max<int32_t>(max_len, int32_t(p.size()));
  put(&max_len, 4);
  float score = 0;
  for (const auto& p : pieces) {
    int32_t len = int32_t(p.size());
    put(&score, 4);
    put(&len, 4);
    put(p.data(), p.size());
    score -= 1;
  }
  return s;
}

}  // namespace

// A GGUF (version 3, architecture llama, F32 tensors) of `w`, written by hand: the toolkit reads GGUF, it does not
// write it (scripts/gguf_from_image.py does, with llama.cpp's gguf-py).
void write_gguf_seed(const std::string& path, const ModelWeights& w) {
  std::string b;
  auto put = [&b](const void* p, size_t n) { b.append(static_cast<const char*>(p), n); };
  auto u32 = [&](uint32_t v) { put(&v, 4); };
  auto u64 = [&](uint64_t v) { put(&v, 8); };
  auto str = [&](const std::string& s) { u64(s.size()), put(s.data(), s.size()); };
  const ModelConfig& c = w.config;
  std::vector<std::pair<std::string, const std::vector<float>*>> tensors = {{"token_embd.weight", &w.tok_embeddings}};
  std::vector<std::vector<uint64_t>> shapes = {{uint64_t(c.dim), uint64_t(c.vocab_size)}};
  for (size_t l = 0; l < w.layers.size(); ++l) {
    const LayerWeights& L = w.layers[l];
    const std::string p = "blk." + std::to_string(l) + ".";
    const uint64_t d = uint64_t(c.dim), kv = uint64_t(c.kv_dim()), h = uint64_t(c.hidden_dim);
    for (auto [n, v, s] : {std::tuple{"attn_norm", &L.rms_att, std::vector<uint64_t>{d}},
                           std::tuple{"attn_q", &L.wq, std::vector<uint64_t>{d, d}},
                           std::tuple{"attn_k", &L.wk, std::vector<uint64_t>{d, kv}},
                           std::tuple{"attn_v", &L.wv, std::vector<uint64_t>{d, kv}},
                           std::tuple{"attn_output", &L.wo, std::vector<uint64_t>{d, d}},
                           std::tuple{"ffn_norm", &L.rms_ffn, std::vector<uint64_t>{d}},
                           std::tuple{"ffn_gate", &L.w_gate, std::vector<uint64_t>{d, h}},
                           std::tuple{"ffn_up", &L.w_up, std::vector<uint64_t>{d, h}},
                           std::tuple{"ffn_down", &L.w_down, std::vector<uint64_t>{h, d}}}) {
      tensors.push_back({p + n + ".weight", v});
      shapes.push_back(s);
    }
  }
  tensors.push_back({"output_norm.weight", &w.rms_final});
  shapes.push_back({uint64_t(c.dim)});
  put("GGUF", 4);
  u32(3);
  u64(tensors.size());
  u64(7);
  auto kv_u32 = [&](const std::string& k, uint32_t v) { str(k), u32(4), u32(v); };
  str("general.architecture"), u32(8), str("llama");
  kv_u32("llama.embedding_length", uint32_t(c.dim));
  kv_u32("llama.block_count", uint32_t(c.n_layers));
  kv_u32("llama.feed_forward_length", uint32_t(c.hidden_dim));
  kv_u32("llama.attention.head_count", uint32_t(c.n_heads));
  kv_u32("llama.attention.head_count_kv", uint32_t(c.n_kv_heads));
  str("llama.attention.layer_norm_rms_epsilon"), u32(6), put(&c.norm_eps, 4);
  uint64_t off = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    str(tensors[i].first);
    u32(uint32_t(shapes[i].size()));
    for (uint64_t n : shapes[i]) u64(n);
    u32(0);  // F32
    u64(off);
    off += (tensors[i].second->size() * 4 + 31) / 32 * 32;
  }
  b.resize((b.size() + 31) / 32 * 32, '\0');
  for (const auto& t : tensors) {
    put(t.second->data(), t.second->size() * 4);
    b.resize((b.size() + 31) / 32 * 32, '\0');
  }
  std::ofstream(path, std::ios::binary).write(b.data(), std::streamsize(b.size()));
}

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_corpus OUT_DIR\n");
    return 2;
  }
  const fs::path out = argv[1];
  for (const char* d :
       {"manifest", "layout", "safetensors", "gguf", "llama2c", "trace", "trace_struct", "device", "tokenizer"})
    fs::create_directories(out / d);
  const fs::path tmp = out / "tmp";
  fs::create_directories(tmp);
  ModelWeights w = fuzz::tiny_weights();

  // Model files.
  write_llama2c((out / "llama2c/tiny.bin").string(), w);
  write_safetensors_model((tmp / "st32").string(), w, TensorDtype::kF32);
  write_safetensors_model((tmp / "st16").string(), w, TensorDtype::kBF16);
  fs::copy_file(tmp / "st32/model.safetensors", out / "safetensors/f32.safetensors",
                fs::copy_options::overwrite_existing);
  fs::copy_file(tmp / "st16/model.safetensors", out / "safetensors/bf16.safetensors",
                fs::copy_options::overwrite_existing);
  for (const auto& [name, arch] : {std::pair{"opt", ModelArch::kOpt}, std::pair{"phi", ModelArch::kPhi}}) {
    write_safetensors_model((tmp / name).string(), fuzz::tiny_arch_weights(arch), TensorDtype::kF16);
    fs::copy_file(tmp / name / "model.safetensors", out / "safetensors" / (std::string(name) + ".safetensors"),
                  fs::copy_options::overwrite_existing);
  }

  write_gguf_seed((out / "gguf/tiny.gguf").string(), w);

  // Flash image manifests: identity and permuted order, f32 and f16.
  ImageSpec spec;
  image_write_model((tmp / "a.nlw").string(), w, spec);
  fs::copy_file(tmp / "a.nlw.json", out / "manifest/identity.json", fs::copy_options::overwrite_existing);
  for (const auto& [name, arch] : {std::pair{"opt", ModelArch::kOpt}, std::pair{"phi", ModelArch::kPhi}}) {
    image_write_model((tmp / name).string() + ".nlw", fuzz::tiny_arch_weights(arch), spec);  // format 1.7
    fs::copy_file((tmp / name).string() + ".nlw.json", out / "manifest" / (std::string(name) + ".json"),
                  fs::copy_options::overwrite_existing);
  }
  spec.dtype = ImageDtype::kF16;
  spec.order = {{5, 4, 3, 2, 1, 0}, {1, 0, 3, 2, 5, 4}};
  image_write_model((tmp / "b.nlw").string(), w, spec);
  fs::copy_file(tmp / "b.nlw.json", out / "manifest/permuted_f16.json", fs::copy_options::overwrite_existing);

  // Layouts (2 layers of 3 and 2 neurons: the fuzz_layout harness checks against that trace shape).
  Layout l;
  l.method = "greedy";
  l.parameters = {{"seed", 1}, {"top_k", 8}};
  l.trace_sha256 = std::string(64, 'a');
  l.trace_model = "tiny";
  l.trace_tokens = 100;
  auto layer = [](std::vector<uint32_t> order, double objective, double upper_bound) {
    LayoutLayer x;  // named fields: LayoutLayer gained cache-policy members (admission, pinned)
    x.order = std::move(order);
    x.objective = objective;
    x.upper_bound = upper_bound;
    return x;
  };
  l.layers = {layer({2, 0, 1}, 3.0, 4.0), layer({1, 0}, 1.0, 1.0)};
  layout_write((out / "layout/greedy.json").string(), l);
  l.method = "identity";
  l.layers = {layer({0, 1, 2}, 0, 0)};
  layout_write((out / "layout/identity_1layer.json").string(), l);

  // Traces: two layers, two sequences, tokens; and one without tokens, deflate off.
  TraceWriterOptions o;
  o.model = "tiny";
  o.activation = "relu>0";
  o.n_neurons = {5, 3};
  o.thresholds = {0.5, 0.25};
  o.block_tokens = 64;
  std::vector<LayerMask> masks(2);
  for (size_t i = 0; i < 2; ++i) {
    masks[i] = LayerMask(o.n_neurons[i], 70);
    for (uint32_t n = 0; n < o.n_neurons[i]; ++n)
      for (uint64_t t = 0; t < 70; ++t)
        if ((n * 7 + t * 3) % 5 < 2) masks[i].set(n, t);
  }
  std::vector<int32_t> toks(70);
  for (size_t t = 0; t < toks.size(); ++t) toks[t] = int32_t(t % 7);
  trace_write((out / "trace/small.h5").string(), o, masks, {0, 33}, toks);
  o.store_tokens = false;
  o.deflate_level = 0;
  o.thresholds.clear();
  trace_write((out / "trace/plain.h5").string(), o, masks, {0});

  // Device profiles.
  DeviceModel d;
  d.name = "fuzz";
  d.description = "seed";
  d.queue_depth = 8;
  d.cost = {80.0, 1500.0};
  d.has_qd1 = true;
  d.qd1 = {90.0, 400.0};
  d.sources = {"seed"};
  write_file_atomic((out / "device/qd8.json").string(), d.to_json());
  d.has_qd1 = false;
  d.json_extra = R"({"sizes":[4096,65536],"seconds":[0.0001,0.0002]})";
  write_file_atomic((out / "device/measured.json").string(), d.to_json());

  // Tokenizers: first byte 0 = tokenizer file, 1 = token-id file (fuzz_tokenizer.cpp).
  std::vector<std::string> pieces = {"<unk>", "<s>", "</s>", " ", "O", "n", "c", "e", "On", "Once", " u", "p"};
  for (int b = 0; b < 256; b += 37) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    pieces.push_back(name);
  }
  write_file_atomic((out / "tokenizer/llama2c.bin").string(), std::string(1, '\0') + tokenizer_bin(pieces));
  write_file_atomic((out / "tokenizer/ids.txt").string(), std::string(1, '\1') + "# comment\n1 2 3\n\n4\t5 511\r\n");
  fs::remove_all(tmp);
  return 0;
}
