// Kernel benchmark (synthetic random weights: meaningless text, real timing). Two parts:
// 1. matvec GFLOP/s and GB/s per weight dtype and kernel path, 1 and 2 threads, on the ~1B model's FFN shapes
//    ([hidden][dim] as gate/up, [dim][hidden] as down; "llama-1b" of formats/core/synthetic_models.h, the shape
//    nl-layout pack --synthetic-shape writes), the weights cycled through several copies so they come from DRAM;
// 2. decode ms/token and batched prefill tokens/s of that model with every weight in DRAM (its dim, heads, KV heads,
//    vocab; FFN gated SiLU; --layers of them): main's f32 path (f32 ModelWeights, DenseFfn) against
//    the typed path (weights in their dtype, runtime/model/typed_kernels.h) for f16, q8_0, q4_0.
// Variants alternate within each repetition; figures are medians [min-max].
// 1b. prefill kernels: matmul of P tokens at once (token tiles) against token by token, and the down projection
//    of P tokens (down_tokens) against one token at a time, per dtype and path;
// Usage: kernel_bench [--layers N] [--reps R] [--tokens T] [--prefill P] [--threads 1,2] [--skip-matvec] [--skip-model]
//                     [--skip-prefill]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "formats/core/image.h"
#include "formats/core/quant.h"
#include "formats/core/synthetic_models.h"
#include "runtime/model/dense_bundles.h"
#include "runtime/model/model.h"
#include "runtime/model/typed_kernels.h"

using namespace nl;
using Clock = std::chrono::steady_clock;

namespace {

struct Rng {
  uint64_t s;
  float next() {  // uniform in [-1, 1)
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return float(int64_t(s >> 40) - (1 << 23)) / float(1 << 23);
  }
};

std::vector<float> rand_vec(size_t n, uint64_t seed, float scale) {
  Rng r{seed * 0x9E3779B97F4A7C15ull + 1};
  std::vector<float> v(n);
  for (float& x : v) x = r.next() * scale;
  return v;
}

// Rows of `src` ([rows][cols] f32) encoded in dtype dt, each row at dst + r * stride.
void encode_rows(ImageDtype dt, const float* src, int rows, int cols, uint8_t* dst, size_t stride) {
#pragma omp parallel for schedule(static)
  for (int r = 0; r < rows; ++r) {
    const float* s = src + size_t(r) * cols;
    uint8_t* d = dst + size_t(r) * stride;
    if (dt == ImageDtype::kQ8_0)
      quantize_row_q8_0(s, reinterpret_cast<BlockQ8_0*>(d), size_t(cols));
    else if (dt == ImageDtype::kQ4_0)
      quantize_row_q4_0(s, reinterpret_cast<BlockQ4_0*>(d), size_t(cols));
    else
      image_encode(dt, s, size_t(cols), d);
  }
}

struct Stat {
  std::vector<double> v;
  double median() const {
    std::vector<double> s = v;
    std::sort(s.begin(), s.end());
    const size_t n = s.size();
    return n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
  }
  double min() const { return *std::min_element(v.begin(), v.end()); }
  double max() const { return *std::max_element(v.begin(), v.end()); }
};

double seconds(const std::function<void()>& f) {
  const auto t0 = Clock::now();
  f();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// ------------------------------------------------------------------------------------------------------------------
// Part 1: matvec.

void bench_matvec(int reps, const std::vector<int>& threads) {
  struct Shape {
    std::string name;
    int rows, cols;
  };
  const ModelConfig& m = synthetic_models().at("llama-1b").config;
  const std::string d = std::to_string(m.dim), h = std::to_string(m.hidden_dim);
  const Shape shapes[] = {{"gate/up [" + h + "][" + d + "]", m.hidden_dim, m.dim},
                          {"down [" + d + "][" + h + "]", m.dim, m.hidden_dim}};
  const ImageDtype dts[] = {ImageDtype::kF32, ImageDtype::kF16, ImageDtype::kBF16, ImageDtype::kQ8_0,
                            ImageDtype::kQ4_0};
  const auto isas = kernels::available_isas();
  std::printf(
      "== matvec (synthetic random weights; weights cycled through copies of >= 96 MiB per dtype, so mostly from "
      "DRAM)\n");
  std::printf("%-22s %-6s %-13s %3s %22s %26s\n", "shape", "dtype", "path", "thr", "GB/s median [min-max]",
              "GFLOP/s median [min-max]");
  for (const Shape& sh : shapes) {
    const std::vector<float> x = rand_vec(size_t(sh.cols), 7, 1.0f);
    std::vector<float> y(size_t(sh.rows));
    struct Variant {
      ImageDtype dt;
      kernels::Isa isa;
      int thr;
      const std::vector<std::vector<uint8_t>>* copies;
      size_t stride;
      Stat s;
    };
    std::vector<std::unique_ptr<std::vector<std::vector<uint8_t>>>> held;
    std::vector<Variant> vars;
    // Source matrices shared by the dtypes: enough copies that even the f32 ones (46 MiB each) exceed the caches.
    constexpr int kCopies = 4;
    std::vector<std::vector<float>> src;
    for (int k = 0; k < kCopies; ++k) src.push_back(rand_vec(size_t(sh.rows) * sh.cols, 100 + uint64_t(k), 0.05f));
    for (ImageDtype dt : dts) {
      const size_t stride = image_row_bytes(dt, size_t(sh.cols)), bytes = stride * size_t(sh.rows);
      auto copies = std::make_unique<std::vector<std::vector<uint8_t>>>();
      // At least 96 MiB of weights per dtype cycled (smaller dtypes: the same sources encoded again).
      const int ncopies = int(std::clamp<size_t>((96u << 20) / bytes + 1, size_t(kCopies), 24));
      for (int k = 0; k < ncopies; ++k) {
        copies->emplace_back(bytes);
        encode_rows(dt, src[size_t(k % kCopies)].data(), sh.rows, sh.cols, copies->back().data(), stride);
      }
      for (kernels::Isa isa : isas) {
        if (dt == ImageDtype::kF32 && isa != isas.front()) continue;  // f32: one kernel (kernels::matmul)
        for (int t : threads) vars.push_back({dt, isa, t, copies.get(), stride, {}});
      }
      held.push_back(std::move(copies));
    }
    for (int r = 0; r < reps; ++r)
      for (Variant& v : vars) {
        kernels::set_isa(v.isa);
        omp_set_num_threads(v.thr);
        const int iters = int(v.copies->size()) * 2;
        const double s = seconds([&] {
          for (int i = 0; i < iters; ++i) {
            const WeightView w{v.dt, (*v.copies)[size_t(i) % v.copies->size()].data(), sh.rows, sh.cols, v.stride};
            kernels::matmul(y.data(), x.data(), w, 1);
          }
        });
        v.s.v.push_back(s / iters);
      }
    for (Variant& v : vars) {
      const double bytes = double(v.stride) * sh.rows, flops = 2.0 * sh.rows * sh.cols;
      std::printf("%-22s %-6s %-13s %3d %8.2f [%6.2f-%6.2f] %10.2f [%6.2f-%6.2f]\n", sh.name.c_str(),
                  image_dtype_name(v.dt), v.dt == ImageDtype::kF32 ? "f32 (tiled)" : kernels::isa_name(v.isa), v.thr,
                  bytes / v.s.median() / 1e9, bytes / v.s.max() / 1e9, bytes / v.s.min() / 1e9,
                  flops / v.s.median() / 1e9, flops / v.s.max() / 1e9, flops / v.s.min() / 1e9);
    }
  }
  kernels::set_isa(isas.back());
}

// ------------------------------------------------------------------------------------------------------------------
// Part 1b: prefill matmul, n tokens at once (token tiles) against the same n tokens one matmul each (the weights
// streamed once per token), and the dense FFN's down projection (down_tokens) against down_accum per token.

void bench_prefill(int reps, int n, const std::vector<int>& threads) {
  const ModelConfig& m = synthetic_models().at("llama-1b").config;
  const int rows = m.hidden_dim, cols = m.dim;
  std::printf(
      "\n== prefill kernels, %d tokens (synthetic random weights): [%d][%d] matmul (gate/up shape; q8_0 interleaved "
      "where the path has the kernel) and the down projection of %d neurons x %d outputs\n",
      n, rows, cols, rows, cols);
  std::printf("%-6s %-13s %3s %-12s %26s %26s %8s\n", "dtype", "path", "thr", "kernel", "batched GFLOP/s [min-max]",
              "per token GFLOP/s [min-max]", "x");
  const std::vector<float> src = rand_vec(size_t(rows) * cols, 5, 0.05f), x = rand_vec(size_t(n) * cols, 6, 1.0f);
  std::vector<float> h = rand_vec(size_t(n) * rows, 8, 1.0f);
  std::vector<float> y(size_t(n) * std::max(rows, cols));
  for (ImageDtype dt : {ImageDtype::kF16, ImageDtype::kBF16, ImageDtype::kQ8_0, ImageDtype::kQ4_0})
    for (kernels::Isa isa : kernels::available_isas()) {
      kernels::set_isa(isa);
      const size_t stride = image_row_bytes(dt, size_t(cols));
      std::vector<uint8_t> bytes(stride * size_t(rows));
      encode_rows(dt, src.data(), rows, cols, bytes.data(), stride);
      std::vector<uint8_t> x8 = bytes;  // the matmul's copy (interleaved where the path has the kernel); down: plain
      WeightView w{dt, x8.data(), rows, cols, stride};
      if (kernels::q8_interleave_pays() && kernels::q8_interleavable(w)) kernels::q8_interleave(&w);
      for (int thr : threads) {
        omp_set_num_threads(thr);
        Stat mm, mm1, dn, dn1;
        kernels::DownCoeffs dc;
        for (int r = 0; r < reps; ++r) {
          mm.v.push_back(seconds([&] { kernels::matmul(y.data(), x.data(), w, n); }));
          mm1.v.push_back(seconds([&] {
            for (int t = 0; t < n; ++t) kernels::matmul(y.data() + size_t(t) * rows, x.data() + size_t(t) * cols, w, 1);
          }));
          // Down: the matrix's rows as `rows` neuron slices of `cols` outputs (one chunk: the whole output range).
          dn.v.push_back(seconds([&] {
            dc.prepare(h.data(), size_t(rows), rows, n);
            kernels::down_tokens(dt, y.data(), size_t(cols), cols, dc, bytes.data(), stride);
          }));
          dn1.v.push_back(seconds([&] {
            for (int t = 0; t < n; ++t) {
              dc.prepare(h.data() + size_t(t) * rows, size_t(rows), rows, 1);
              kernels::down_tokens(dt, y.data() + size_t(t) * cols, size_t(cols), cols, dc, bytes.data(), stride);
            }
          }));
        }
        const double fl = 2.0 * n * rows * cols / 1e9;
        auto row = [&](const char* k, const Stat& a, const Stat& b) {
          std::printf("%-6s %-13s %3d %-12s %10.2f [%6.2f-%6.2f] %10.2f [%6.2f-%6.2f] %7.2fx\n", image_dtype_name(dt),
                      kernels::isa_name(isa), thr, k, fl / a.median(), fl / a.max(), fl / a.min(), fl / b.median(),
                      fl / b.max(), fl / b.min(), b.median() / a.median());
        };
        row(w.q8_x8 ? "matmul (x8)" : "matmul", mm, mm1);
        row("down", dn, dn1);
      }
    }
  kernels::set_isa(kernels::available_isas().back());
}

// ------------------------------------------------------------------------------------------------------------------
// Part 2: whole model in DRAM.

// The gated FFN over bundles in DRAM (every neuron: a SiLU model): nl-run --select dense's own path
// (runtime/model/dense_bundles.h), from bundles encoded as an image holds them.
class BundleFfn : public FfnProvider {
 public:
  BundleFfn(ImageDtype dt, const ModelConfig& c) : dt_(dt), c_(c) {}
  void add_layer(const float* gate, const float* up, const float* down_t) {  // down_t: [hidden][dim] (columns)
    const size_t rb = image_row_bytes(dt_, size_t(c_.dim)), bb = 3 * rb;
    std::vector<uint8_t> b(size_t(c_.hidden_dim) * bb);
    encode_rows(dt_, gate, c_.hidden_dim, c_.dim, b.data(), bb);
    encode_rows(dt_, up, c_.hidden_dim, c_.dim, b.data() + rb, bb);
    encode_rows(dt_, down_t, c_.hidden_dim, c_.dim, b.data() + 2 * rb, bb);
    layers_.emplace_back(dt_, c_.dim, c_.hidden_dim, b.data(), bb);
  }
  size_t bytes() const { return layers_.size() * layers_[0].bytes(); }
  void ffn(int layer, int, int n, const float* x, float* out, FfnObserver*) override {
    ModelConfig silu = c_;
    silu.act = FfnAct::kSilu;
    layers_[size_t(layer)].ffn(x, n, silu, out);
  }

 private:
  ImageDtype dt_;
  ModelConfig c_;
  std::vector<kernels::DenseBundles> layers_;
};

struct TypedModel {
  std::vector<std::vector<uint8_t>> store;
  std::vector<std::vector<float>> norms;
  ModelView view;
  std::unique_ptr<BundleFfn> ffn;
  size_t bytes = 0;
};

void bench_model(int layers, int reps, int tokens, int prefill, const std::vector<int>& threads) {
  ModelConfig c = synthetic_models().at("llama-1b").config;
  c.n_layers = layers;
  c.seq_len = 256;        // the context the timed tokens need, not the model's 2048 (KV cache size)
  c.act = FfnAct::kSilu;  // the dense FFN kernels of SiLU models (llama.cpp's case), not ReLU's zeros
  c.shared_classifier = false;
  const int dim = c.dim, kv = c.kv_dim(), hid = c.hidden_dim;
  std::printf("\n== decode with every weight in DRAM (synthetic random weights: meaningless tokens, real timing)\n");
  std::printf(
      "model: dim %d, FFN %d gated SiLU, %d heads, %d KV heads, vocab %d, %d layers; %d decoded tokens per "
      "repetition after a %d-token batched prefill; kernel path %s\n",
      dim, hid, c.n_heads, c.n_kv_heads, c.vocab_size, layers, tokens, prefill,
      kernels::isa_name(kernels::active_isa()));
  // f32 ModelWeights (main's path runs on these; the typed variants are encoded from them).
  ModelWeights w;
  w.config = c;
  w.source = "synthetic";
  uint64_t seed = 1;
  w.tok_embeddings = rand_vec(size_t(c.vocab_size) * dim, seed++, 0.5f);
  w.wcls = rand_vec(size_t(c.vocab_size) * dim, seed++, 0.02f);
  w.rms_final.assign(size_t(dim), 1.0f);
  for (int l = 0; l < layers; ++l) {
    LayerWeights lw;
    lw.rms_att.assign(size_t(dim), 1.0f);
    lw.rms_ffn.assign(size_t(dim), 1.0f);
    lw.wq = rand_vec(size_t(dim) * dim, seed++, 0.02f);
    lw.wk = rand_vec(size_t(kv) * dim, seed++, 0.02f);
    lw.wv = rand_vec(size_t(kv) * dim, seed++, 0.02f);
    lw.wo = rand_vec(size_t(dim) * dim, seed++, 0.02f);
    lw.w_gate = rand_vec(size_t(hid) * dim, seed++, 0.02f);
    lw.w_up = rand_vec(size_t(hid) * dim, seed++, 0.02f);
    lw.w_down = rand_vec(size_t(dim) * hid, seed++, 0.02f);
    w.layers.push_back(std::move(lw));
  }
  auto make_typed = [&](ImageDtype dt) {
    auto tm = std::make_unique<TypedModel>();
    auto mat = [&](const std::vector<float>& src, int rows, int cols) {
      const size_t stride = image_row_bytes(dt, size_t(cols));
      auto& b = tm->store.emplace_back(stride * size_t(rows));
      encode_rows(dt, src.data(), rows, cols, b.data(), stride);
      tm->bytes += b.size();
      return WeightView{dt, b.data(), rows, cols, stride};
    };
    ModelView& v = tm->view;
    v.config = c;
    v.source = "synthetic";
    tm->store.reserve(size_t(4 * layers + 2));
    v.tok_embeddings = mat(w.tok_embeddings, c.vocab_size, dim);
    v.classifier = mat(w.wcls, c.vocab_size, dim);
    v.rms_final = w.rms_final.data();
    tm->ffn = std::make_unique<BundleFfn>(dt, c);
    std::vector<float> down_t(size_t(hid) * dim);
    for (const LayerWeights& lw : w.layers) {
      LayerView lv;
      lv.rms_att = lw.rms_att.data();
      lv.rms_ffn = lw.rms_ffn.data();
      lv.wq = mat(lw.wq, dim, dim);
      lv.wk = mat(lw.wk, kv, dim);
      lv.wv = mat(lw.wv, kv, dim);
      lv.wo = mat(lw.wo, dim, dim);
      v.layers.push_back(lv);
      for (int o = 0; o < dim; ++o)
        for (int s = 0; s < hid; ++s) down_t[size_t(s) * dim + o] = lw.w_down[size_t(o) * hid + s];
      tm->ffn->add_layer(lw.w_gate.data(), lw.w_up.data(), down_t.data());
    }
    tm->bytes += tm->ffn->bytes();
    return tm;
  };
  struct Variant {
    std::string name;
    std::unique_ptr<TypedModel> typed;  // null: main's f32 path
    size_t bytes;
    int thr;
    Stat decode, pp;
  };
  std::vector<Variant> vars;
  size_t f32_bytes = 0;
  f32_bytes += (w.tok_embeddings.size() + w.wcls.size()) * 4;
  for (const LayerWeights& lw : w.layers)
    f32_bytes += (lw.wq.size() + lw.wk.size() + lw.wv.size() + lw.wo.size() + lw.w_gate.size() + lw.w_up.size() +
                  lw.w_down.size()) *
                 4;
  const std::string kMain = "f32 (main's path)";
  for (int t : threads) vars.push_back({kMain, nullptr, f32_bytes, t, {}, {}});
  for (ImageDtype dt : {ImageDtype::kF16, ImageDtype::kQ8_0, ImageDtype::kQ4_0}) {
    auto tm = make_typed(dt);
    const size_t b = tm->bytes;
    for (size_t i = 0; i < threads.size(); ++i)
      vars.push_back(
          {std::string(image_dtype_name(dt)) + " (typed)", i == 0 ? std::move(tm) : nullptr, b, threads[i], {}, {}});
  }
  // Variants that share one typed model point at the first of them.
  std::vector<TypedModel*> tms(vars.size(), nullptr);
  for (size_t i = 0; i < vars.size(); ++i)
    tms[i] = vars[i].typed ? vars[i].typed.get()
                           : (i > 0 && tms[i - 1] && vars[i].name == vars[i - 1].name ? tms[i - 1] : nullptr);
  std::vector<int> prompt(static_cast<size_t>(prefill));
  for (int i = 0; i < prefill; ++i) prompt[size_t(i)] = (i * 7919 + 3) % c.vocab_size;
  for (int r = 0; r < reps; ++r)
    for (size_t i = 0; i < vars.size(); ++i) {
      Variant& v = vars[i];
      omp_set_num_threads(v.thr);
      std::unique_ptr<Model> m;
      if (tms[i]) {
        m = std::make_unique<Model>(tms[i]->view, prefill + tokens + 1);
        m->set_ffn(tms[i]->ffn.get());
      } else {
        m = std::make_unique<Model>(w, prefill + tokens + 1);
      }
      v.pp.v.push_back(seconds([&] { m->forward_sequence(prompt.data(), prefill, 0, nullptr); }) / prefill);
      int tok = prompt.back();
      v.decode.v.push_back(seconds([&] {
                             for (int p = prefill; p < prefill + tokens; ++p) {
                               const float* lg = m->forward_token(tok, p);
                               tok = int(std::max_element(lg, lg + c.vocab_size) - lg);
                             }
                           }) /
                           tokens);
    }
  std::printf("%-20s %3s %9s %28s %12s %28s %10s\n", "variant", "thr", "MiB", "decode ms/token med [min-max]",
              "tokens/s", "prefill tok/s med [min-max]", "vs f32");
  for (const Variant& v : vars) {
    double base = 0;
    for (const Variant& b : vars)
      if (b.name == kMain && b.thr == v.thr) base = b.decode.median();
    std::printf("%-20s %3d %9.1f %9.2f [%7.2f-%7.2f] %12.2f %10.1f [%6.1f-%6.1f] %9.3fx\n", v.name.c_str(), v.thr,
                double(v.bytes) / (1 << 20), v.decode.median() * 1e3, v.decode.min() * 1e3, v.decode.max() * 1e3,
                1.0 / v.decode.median(), 1.0 / v.pp.median(), 1.0 / v.pp.max(), 1.0 / v.pp.min(),
                base / v.decode.median());
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // progress visible through a pipe
  int layers = 4, reps = 5, tokens = 8, prefill = 16;
  bool matvec = true, model = true, prefill_k = true;
  std::vector<int> threads = {1, 2};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "kernel_bench: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--layers")
      layers = std::stoi(next());
    else if (a == "--reps")
      reps = std::stoi(next());
    else if (a == "--tokens")
      tokens = std::stoi(next());
    else if (a == "--prefill")
      prefill = std::stoi(next());
    else if (a == "--skip-matvec")
      matvec = false;
    else if (a == "--skip-model")
      model = false;
    else if (a == "--skip-prefill")
      prefill_k = false;
    else if (a == "--threads") {
      threads.clear();
      std::string s = next();
      for (size_t p = 0; p < s.size();) {
        size_t q = s.find(',', p);
        if (q == std::string::npos) q = s.size();
        threads.push_back(std::stoi(s.substr(p, q - p)));
        p = q + 1;
      }
    } else {
      std::fprintf(stderr, "kernel_bench: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  if (layers < 1 || reps < 1 || tokens < 1 || prefill < 1 || threads.empty()) {
    std::fprintf(stderr, "kernel_bench: --layers, --reps, --tokens, --prefill and --threads must be positive\n");
    return 2;
  }
  std::printf("kernel_bench: kernel paths here:");
  for (auto isa : kernels::available_isas()) std::printf(" %s", kernels::isa_name(isa));
  std::printf("; %d reps, medians [min-max]\n", reps);
  if (matvec) bench_matvec(reps, threads);
  if (prefill_k) bench_prefill(reps, prefill, threads);
  if (model) bench_model(layers, reps, tokens, prefill, threads);
  return 0;
}
