// llama-ids: greedy generation with the real llama.cpp engine from token ids, printing token ids and timings as
// one JSON line. llama-completion takes text only and prints text, so token agreement with nl-run (which we drive
// with ids) cannot be read from it exactly; this is examples/simple/simple.cpp with ids in and out.
// Built by scripts/llamacpp.sh against the cached llama.cpp build (static libraries), not by the project's CMake.
//   llama-ids -m model.gguf --prompt-tokens 1,2,3 [-n 32] [-t 2] [--no-mmap] [--kv f16|f32] [--margins]
// --kv: the KV cache's type (default: llama.cpp's, f16; nl-run keeps its KV cache in f32). --margins: each step's
// gap between the largest and the second largest logit, in the JSON line ("margins").
// Greedy = the first index of the largest logit (the same tie rule as nl-run's argmax). Prompt in one batch
// (llama.cpp's default prefill). Timings: load (model + context), prefill, first token (process start to the
// first generated token), decode (mean per token after the first).
#include <chrono>
#include <clocale>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "llama.h"

static double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

static void silent(enum ggml_log_level, const char*, void*) {}

int main(int argc, char** argv) {
  std::setlocale(LC_NUMERIC, "C");
  const double t_start = now_ms();
  std::string model_path;
  std::vector<llama_token> prompt;
  int n_predict = 32, n_threads = 2;
  bool use_mmap = true, verbose = false, margins = false;
  std::string kv;
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        fprintf(stderr, "llama-ids: %s needs a value\n", a.c_str());
        exit(2);
      }
      return argv[++i];
    };
    if (a == "-m") {
      model_path = next();
    } else if (a == "-n") {
      n_predict = atoi(next());
    } else if (a == "-t") {
      n_threads = atoi(next());
    } else if (a == "--no-mmap") {
      use_mmap = false;
    } else if (a == "--kv") {
      kv = next();
      if (kv != "f16" && kv != "f32") {
        fprintf(stderr, "llama-ids: --kv takes f16 or f32, not %s\n", kv.c_str());
        return 2;
      }
    } else if (a == "--margins") {
      margins = true;
    } else if (a == "-v") {
      verbose = true;
    } else if (a == "--prompt-tokens") {
      std::string s = next();
      for (size_t p = 0; p < s.size();) {
        size_t e = s.find(',', p);
        if (e == std::string::npos) e = s.size();
        prompt.push_back(atoi(s.substr(p, e - p).c_str()));
        p = e + 1;
      }
    } else {
      fprintf(stderr, "llama-ids: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  if (model_path.empty() || prompt.empty() || n_predict < 1 || n_threads < 1) {
    fprintf(stderr,
            "usage: llama-ids -m model.gguf --prompt-tokens 1,2,3 [-n 32] [-t 2] [--no-mmap] [--kv f16|f32] "
            "[--margins]\n");
    return 2;
  }
  if (!verbose) llama_log_set(silent, nullptr);
  ggml_backend_load_all();
  llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = 0;
  if (!use_mmap) mp.load_mode = LLAMA_LOAD_MODE_NONE;  // default AUTO = mmap on the CPU backend
  llama_model* model = llama_model_load_from_file(model_path.c_str(), mp);
  if (!model) {
    fprintf(stderr, "llama-ids: %s: cannot load the model\n", model_path.c_str());
    return 3;
  }
  const llama_vocab* vocab = llama_model_get_vocab(model);
  const int n_vocab = llama_vocab_n_tokens(vocab);
  for (llama_token t : prompt)
    if (t < 0 || t >= n_vocab) {
      fprintf(stderr, "llama-ids: prompt token %d is outside the vocabulary (%d)\n", t, n_vocab);
      return 2;
    }
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = uint32_t(prompt.size() + n_predict);
  cp.n_batch = uint32_t(prompt.size());
  cp.n_ubatch = uint32_t(prompt.size());
  cp.n_threads = n_threads;
  cp.n_threads_batch = n_threads;
  cp.no_perf = true;
  if (!kv.empty()) cp.type_k = cp.type_v = kv == "f32" ? GGML_TYPE_F32 : GGML_TYPE_F16;
  llama_context* ctx = llama_init_from_model(model, cp);
  if (!ctx) {
    fprintf(stderr, "llama-ids: cannot create the context\n");
    return 1;
  }
  const double t_loaded = now_ms();
  std::vector<llama_token> out;
  std::vector<double> step_ms, gap;
  llama_batch batch = llama_batch_get_one(prompt.data(), int32_t(prompt.size()));
  llama_token tok = 0;
  double t_first = 0, t_prefill = 0;
  for (int i = 0; i < n_predict; i++) {
    const double t0 = now_ms();
    if (llama_decode(ctx, batch)) {
      fprintf(stderr, "llama-ids: llama_decode failed at step %d\n", i);
      return 1;
    }
    const float* logits = llama_get_logits_ith(ctx, -1);
    int best = 0;
    float second = -INFINITY;  // the largest logit but the chosen one (equal to it on a tie)
    for (int v = 1; v < n_vocab; v++)
      if (logits[v] > logits[best]) {
        second = logits[best];
        best = v;
      } else if (logits[v] > second) {
        second = logits[v];
      }
    tok = best;
    out.push_back(tok);
    if (margins) gap.push_back(double(logits[best]) - double(second));
    const double t1 = now_ms();
    if (i == 0) {
      t_prefill = t1 - t0;
      t_first = t1 - t_start;
    } else {
      step_ms.push_back(t1 - t0);
    }
    batch = llama_batch_get_one(&tok, 1);
  }
  double decode = 0;
  for (double s : step_ms) decode += s;
  printf("{\"prompt_tokens\": %zu, \"tokens\": [", prompt.size());
  for (size_t i = 0; i < out.size(); i++) printf("%s%d", i ? ", " : "", out[i]);
  printf("]");
  if (margins) {
    printf(", \"margins\": [");
    for (size_t i = 0; i < gap.size(); i++) printf("%s%.6g", i ? ", " : "", gap[i]);
    printf("]");
  }
  printf(
      ", \"load_ms\": %.3f, \"prefill_ms\": %.3f, \"ttft_ms\": %.3f, \"decode_ms_per_token\": %.4f, "
      "\"threads\": %d, \"mmap\": %s}\n",
      t_loaded - t_start, t_prefill, t_first, step_ms.empty() ? 0.0 : decode / double(step_ms.size()), n_threads,
      use_mmap ? "true" : "false");
  llama_free(ctx);
  llama_model_free(model);
  return 0;
}
