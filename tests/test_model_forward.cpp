// The sequence (matrix-matrix) forward equals the token-by-token forward bitwise, in one block or in chunks;
// the FFN observer sees the same activations on both paths; an FfnProvider replaces the dense FFN.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "formats/core/error.h"
#include "formats/llama2c.h"
#include "formats/safetensors.h"
#include "model_test_util.h"
#include "skip_util.h"

using namespace nl;

namespace {

// Records every gate activation it sees, per layer, in token order.
struct Recorder : FfnObserver {
  std::vector<std::vector<float>> gate, h;
  explicit Recorder(int layers) : gate(size_t(layers)), h(size_t(layers)) {}
  void on_ffn(int layer, int, int n, const float* g, const float* hh) override {
    (void)n;
    const size_t count = size_t(n) * size_width;
    gate[size_t(layer)].insert(gate[size_t(layer)].end(), g, g + count);
    h[size_t(layer)].insert(h[size_t(layer)].end(), hh, hh + count);
  }
  size_t size_width = 0;
};

void check_paths_agree(const ModelWeights& w, const std::vector<int>& tokens) {
  const int vocab = w.config.vocab_size, n = int(tokens.size());
  Model a(w), b(w), c(w);
  Recorder ra(w.config.n_layers), rb(w.config.n_layers);
  ra.size_width = rb.size_width = size_t(w.config.hidden_dim);
  a.set_observer(&ra);
  b.set_observer(&rb);
  std::vector<float> one;
  for (int p = 0; p < n; ++p) {
    const float* l = a.forward_token(tokens[size_t(p)], p);
    one.insert(one.end(), l, l + vocab);
  }
  std::vector<float> seq(size_t(n) * vocab);
  b.forward_sequence(tokens.data(), n, 0, seq.data());
  CHECK(test::max_abs_diff(one, seq) == 0.0f);
  for (int l = 0; l < w.config.n_layers; ++l) {
    CHECK(ra.gate[size_t(l)] == rb.gate[size_t(l)]);
    CHECK(ra.h[size_t(l)] == rb.h[size_t(l)]);
  }
  // Chunks continue from the KV cache: 1 + 7 + rest.
  std::vector<float> chunked(size_t(n) * vocab);
  c.forward_sequence(tokens.data(), 1, 0, chunked.data());
  c.forward_sequence(tokens.data() + 1, 7, 1, chunked.data() + vocab);
  c.forward_sequence(tokens.data() + 8, n - 8, 8, chunked.data() + size_t(8) * vocab);
  CHECK(test::max_abs_diff(one, chunked) == 0.0f);
  // A prompt in one pass (reserved ahead, classifier on its last token only): the last token's logits, bit for bit.
  Model d(w);
  d.reserve(n);
  const float* last = d.forward_prompt(tokens.data(), n, 0);
  CHECK(std::memcmp(last, one.data() + size_t(n - 1) * vocab, sizeof(float) * size_t(vocab)) == 0);
}

}  // namespace

static void check_shared_model(const char* rel) {
  const ModelWeights w = read_llama2c(std::string(NL_MODELS_DIR) + "/" + rel);
  std::vector<int> tokens;
  for (int i = 0; i < 70; ++i) tokens.push_back((i * 37 + 1) % w.config.vocab_size);
  check_paths_agree(w, tokens);
}

TEST_CASE("sequence forward equals token-by-token on stories260K" *
          test::needs_models({"llama2c-stories260K/stories260K.bin"})) {
  check_shared_model("llama2c-stories260K/stories260K.bin");
}

TEST_CASE("sequence forward equals token-by-token on babyllama-tok105" *
          test::needs_models({"babyllama-tok105/model5000.bin"})) {
  check_shared_model("babyllama-tok105/model5000.bin");
}

TEST_CASE("sequence forward equals token-by-token on the bundled tiny ReLU model") {
  const ModelWeights w = read_model(std::string(NL_SOURCE_DIR) + "/datasets/tiny-relu/model");
  std::vector<int> tokens;
  for (int i = 0; i < 70; ++i) tokens.push_back((i * 37 + 1) % w.config.vocab_size);
  check_paths_agree(w, tokens);
}

TEST_CASE("sequence forward equals token-by-token on random OPT and Phi models (biases, LayerNorm, positions)") {
  for (ModelArch arch : {ModelArch::kOpt, ModelArch::kPhi}) {
    const std::string name = model_arch_name(arch);
    CAPTURE(name);
    const ModelWeights w = test::random_arch_weights(test::small_arch_config(arch), 31);
    std::vector<int> tokens;
    for (int i = 0; i < 40; ++i) tokens.push_back((i * 7 + 3) % w.config.vocab_size);
    check_paths_agree(w, tokens);
  }
}

TEST_CASE("sequence forward equals token-by-token on a random ReLU model with odd widths") {
  const ModelWeights w = test::random_weights(test::small_config(FfnAct::kRelu, false), 21);
  std::vector<int> tokens;
  for (int i = 0; i < 41; ++i) tokens.push_back((i * 7 + 3) % w.config.vocab_size);
  check_paths_agree(w, tokens);
}

TEST_CASE("an FfnProvider replaces the dense FFN: a sparse ReLU FFN over active neurons gives the same logits") {
  const ModelWeights w = test::random_weights(test::small_config(FfnAct::kRelu), 4);
  // Computes only the neurons whose gate fires, as the flash runtime will.
  struct SparseRelu : FfnProvider {
    const ModelWeights& w;
    size_t skipped = 0, total = 0;
    explicit SparseRelu(const ModelWeights& ww) : w(ww) {}
    void ffn(int layer, int pos0, int n, const float* x, float* out, FfnObserver*) override {
      (void)pos0;
      const ModelConfig& c = w.config;
      const LayerWeights& L = w.layers[size_t(layer)];
      for (int t = 0; t < n; ++t) {
        std::vector<float> acc(size_t(c.dim), 0.0f);
        const float* xt = x + size_t(t) * c.dim;
        for (int j = 0; j < c.hidden_dim; ++j) {
          ++total;
          const float g = kernels::dot(L.w_gate.data() + size_t(j) * c.dim, xt, c.dim);
          if (g <= 0.0f) {
            ++skipped;
            continue;
          }
          const float hj = g * kernels::dot(L.w_up.data() + size_t(j) * c.dim, xt, c.dim);
          for (int i = 0; i < c.dim; ++i) acc[size_t(i)] += L.w_down[size_t(i) * c.hidden_dim + j] * hj;
        }
        std::copy(acc.begin(), acc.end(), out + size_t(t) * c.dim);
      }
    }
  } sparse(w);
  const std::vector<int> tokens = {1, 4, 8, 15, 16, 3, 2, 11};
  Model dense(w), mine(w);
  mine.set_ffn(&sparse);
  std::vector<float> a(tokens.size() * size_t(w.config.vocab_size)), b(a.size());
  dense.forward_sequence(tokens.data(), int(tokens.size()), 0, a.data());
  mine.forward_sequence(tokens.data(), int(tokens.size()), 0, b.data());
  CHECK(sparse.skipped > 0);
  CHECK(sparse.skipped < sparse.total);
  CHECK(test::max_abs_diff(a, b) < 1e-4f);  // only the summation order of the down projection differs
  // Weights without FFN matrices run only with a provider.
  ModelWeights no_ffn = w;
  for (auto& L : no_ffn.layers) L.w_gate.clear(), L.w_up.clear(), L.w_down.clear();
  Model flash(no_ffn);
  CHECK_THROWS_AS(flash.forward_token(1, 0), UsageError);
  flash.set_ffn(&sparse);
  CHECK(flash.forward_token(1, 0)[0] == doctest::Approx(a[0]).epsilon(1e-5));
}

TEST_CASE(
    "matmul_acc64: the double-accumulated product, whatever the tile shape or ISA; reordering `in` changes nothing") {
  std::mt19937_64 rng(9);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int in : {7, 8, 172, 1409}) {
    const int out = 13, n = 5;
    std::vector<float> x(size_t(n) * in), w(size_t(out) * in);
    for (float& v : x) v = nd(rng);
    for (float& v : w) v = nd(rng);
    std::vector<float> all(static_cast<size_t>(n * out)), one(static_cast<size_t>(out));
    kernels::matmul_acc64(all.data(), x.data(), w.data(), n, in, out);
    // Permuting the summed dimension of x and w alike (what a layout does to a down projection).
    std::vector<int> perm(static_cast<size_t>(in));
    for (int i = 0; i < in; ++i) perm[size_t(i)] = i;
    std::shuffle(perm.begin(), perm.end(), rng);
    std::vector<float> xp(x.size()), wp(w.size()), allp(all.size());
    for (int i = 0; i < in; ++i) {
      for (int t = 0; t < n; ++t) xp[size_t(t) * in + i] = x[size_t(t) * in + perm[size_t(i)]];
      for (int o = 0; o < out; ++o) wp[size_t(o) * in + i] = w[size_t(o) * in + perm[size_t(i)]];
    }
    kernels::matmul_acc64(allp.data(), xp.data(), wp.data(), n, in, out);
    std::vector<float> portable(all.size());
    kernels::matmul_acc64_portable(portable.data(), x.data(), w.data(), n, in, out);
    CHECK(portable == all);  // the AVX2+FMA path (where the CPU has it) and the portable one agree bitwise
    int fp32_differs = 0;
    std::vector<float> f(all.size()), fp(all.size());
    kernels::matmul(f.data(), x.data(), w.data(), n, in, out);
    kernels::matmul(fp.data(), xp.data(), wp.data(), n, in, out);
    for (int t = 0; t < n; ++t) {
      kernels::matmul_acc64(one.data(), x.data() + size_t(t) * in, w.data(), 1, in, out);  // single-token tiles
      std::vector<float> one_portable(one.size());
      kernels::matmul_acc64_portable(one_portable.data(), x.data() + size_t(t) * in, w.data(), 1, in, out);
      CHECK(one_portable == one);
      for (int o = 0; o < out; ++o) {
        const size_t k = size_t(t) * out + o;
        double ref = 0;
        for (int i = 0; i < in; ++i) ref += double(x[size_t(t) * in + i]) * double(w[size_t(o) * in + i]);
        INFO("in " << in << " t " << t << " o " << o);
        CHECK(one[size_t(o)] == all[k]);
        CHECK(all[k] == float(ref));  // exact products, double sums: the same fp32 value as a plain double loop
        CHECK(allp[k] == all[k]);
        fp32_differs += f[k] != fp[k];
      }
    }
    if (in >= 172) CHECK(fp32_differs > 0);  // fp32 accumulation does depend on the order
  }
}

TEST_CASE("positions beyond the context and bad token ids are refused") {
  const ModelWeights w = test::random_weights(test::small_config(), 2);
  Model m(w, 16);
  CHECK(m.max_seq() == 16);
  CHECK_THROWS_AS(m.forward_token(1, 16), UsageError);
  CHECK_THROWS_AS(m.forward_token(w.config.vocab_size, 0), UsageError);
  CHECK_THROWS_AS(m.forward_token(-1, 0), UsageError);
}
