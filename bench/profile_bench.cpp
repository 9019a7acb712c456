// Profiling throughput: tokens/s of the sequence-batched forward (matrix-matrix products) against token by token,
// for the tiny llama2.c models (NL_MODELS_DIR, bundled in datasets/), forward only and forward + trace writing
// (nl-profile's inner loop).
// Usage: profile_bench [--models DIR] [--tokens N] [--synthetic-tokens N] [--seq-len L] [--reps R] [--threads T]
// [--quiet] Prints one line per (model, mode) with the median of R runs, and the batched/token-by-token ratio.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "formats/core/progress.h"
#include "formats/safetensors.h"
#include "profiler/profile.h"
#include "runtime/model/model.h"

using namespace nl;

namespace {

struct NullObserver : FfnObserver {
  uint64_t active = 0;
  int hidden = 0;
  void on_ffn(int, int, int n, const float* a, const float*) override {
    for (size_t i = 0; i < size_t(n) * size_t(hidden); ++i) active += a[i] > 0.0f;
  }
};

// A random Llama-shaped model too large for the CPU caches (51 MB fp32), where reusing each weight row across a
// whole sequence matters most. Labelled "synthetic" in the output.
ModelWeights synthetic_model() {
  ModelConfig c;
  c.dim = 512;
  c.hidden_dim = 1408;
  c.n_layers = 4;
  c.n_heads = 8;
  c.n_kv_heads = 8;
  c.vocab_size = 512;
  c.seq_len = 256;
  ModelWeights w;
  w.config = c;
  w.source = "synthetic-512x1408x4";
  uint64_t x = 99;
  auto fill = [&x](std::vector<float>& v, size_t n, float scale) {
    v.resize(n);
    for (float& f : v) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      f = scale * (float((x >> 40) & 0xffff) / 32768.0f - 1.0f);
    }
  };
  const size_t d = 512, h = 1408;
  fill(w.tok_embeddings, 512 * d, 1.0f);
  w.layers.resize(4);
  for (auto& L : w.layers) {
    fill(L.rms_att, d, 0.1f);
    for (float& g : L.rms_att) g += 1.0f;
    fill(L.wq, d * d, 0.05f);
    fill(L.wk, d * d, 0.05f);
    fill(L.wv, d * d, 0.05f);
    fill(L.wo, d * d, 0.05f);
    L.rms_ffn = L.rms_att;
    fill(L.w_gate, h * d, 0.05f);
    fill(L.w_up, h * d, 0.05f);
    fill(L.w_down, d * h, 0.03f);
  }
  fill(w.rms_final, d, 0.1f);
  return w;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::string models = NL_MODELS_DIR;
  uint64_t tokens = 4096, synthetic_tokens = 512;
  int seq_len = 256, reps = 3, threads = 0;
  bool quiet = false;  // --quiet: no progress on stderr
  for (int i = 1; i < argc; i += 2) {
    if (!std::strcmp(argv[i], "--quiet")) {
      quiet = true;
      --i;
    } else if (i + 1 >= argc) {
      std::fprintf(stderr, "option %s needs a value\n", argv[i]);
      return 2;
    } else if (!std::strcmp(argv[i], "--models"))
      models = argv[i + 1];
    else if (!std::strcmp(argv[i], "--tokens"))
      tokens = std::strtoull(argv[i + 1], nullptr, 10);
    else if (!std::strcmp(argv[i], "--seq-len"))
      seq_len = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--synthetic-tokens"))
      synthetic_tokens = std::strtoull(argv[i + 1], nullptr, 10);
    else if (!std::strcmp(argv[i], "--reps"))
      reps = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--threads"))
      threads = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "unknown option %s\n", argv[i]);
      return 2;
    }
  }
  if (threads > 0) omp_set_num_threads(threads);
  std::printf("profile_bench: %llu tokens per run, sequences of %d, median of %d runs, %d OpenMP threads\n",
              static_cast<unsigned long long>(tokens), seq_len, reps, omp_get_max_threads());
  const char* files[] = {"llama2c-stories260K/stories260K.bin", "babyllama-tok105/model5000.bin",
                         "synthetic 512x1408x4 (51 MB)"};
  for (const char* rel : files) {
    const bool synthetic = std::strncmp(rel, "synthetic", 9) == 0;
    const std::string path = models + "/" + rel;
    if (!synthetic && !std::filesystem::exists(path)) {
      std::printf("%s: absent, skipped\n", path.c_str());
      continue;
    }
    if (synthetic && synthetic_tokens == 0) continue;
    const ModelWeights w = synthetic ? synthetic_model() : read_model(path);
    const uint64_t tokens_here = synthetic ? synthetic_tokens : tokens;
    const int L = std::min(seq_len, w.config.seq_len);
    // A deterministic pseudo-random token stream (the model's speed does not depend on the text).
    Corpus corpus;
    uint64_t x = 12345;
    auto next = [&](std::vector<int32_t>& doc) {
      if (corpus.n_tokens() >= tokens_here) return false;
      doc.clear();
      for (int i = 0; i < 1000; ++i) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        doc.push_back(int32_t(3 + (x >> 33) % uint64_t(w.config.vocab_size - 3)));
      }
      return true;
    };
    corpus = build_corpus(next, L, tokens_here, 1);
    Model m(w, L);
    NullObserver obs;
    obs.hidden = w.config.hidden_dim;
    m.set_observer(&obs);
    double tps[2][2];  // [forward only / with trace][token by token / batched]
    Progress prog(std::string("profile_bench ") + rel, uint64_t(2 * reps), !quiet, "runs");
    for (int batched = 0; batched < 2; ++batched) {
      std::vector<double> t_fwd, t_trace;
      for (int r = 0; r < reps; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        for (const auto& s : corpus.sequences) {
          const int n = int(s.size()), b = batched ? n : 1;
          for (int p = 0; p < n; p += b) m.forward_sequence(s.data() + p, std::min(b, n - p), p, nullptr);
        }
        t_fwd.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        ProfileOptions po;
        po.model_name = rel;
        po.rule = ActivationRule::parse("abs>0.1");
        po.batch_tokens = batched ? 0 : 1;
        const std::string out = (std::filesystem::temp_directory_path() / "nl_profile_bench.h5").string();
        const ProfileResult pr = profile_corpus(w, L, corpus, out, po);
        t_trace.push_back(pr.seconds);
        std::filesystem::remove(out);
        prog.add(1);
      }
      tps[0][batched] = double(corpus.n_tokens()) / median(t_fwd);
      tps[1][batched] = double(corpus.n_tokens()) / median(t_trace);
    }
    prog.finish();
    std::printf("%-40s forward only:  token-by-token %9.0f tok/s, sequence-batched %9.0f tok/s, ratio %.2fx\n", rel,
                tps[0][0], tps[0][1], tps[0][1] / tps[0][0]);
    std::printf("%-40s + trace write: token-by-token %9.0f tok/s, sequence-batched %9.0f tok/s, ratio %.2fx\n", rel,
                tps[1][0], tps[1][1], tps[1][1] / tps[1][0]);
  }
  return 0;
}
