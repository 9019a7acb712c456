// Pack benchmark: throughput (MB/s of model read) and peak memory of `nl-layout pack`'s streaming path
// (formats/model_source.h: dense tensors, then one FFN layer at a time) against packing from a fully loaded model
// (read_model + image_write_model), on a synthetic llama2.c model with a paper-shaped FFN layer set; and the same
// for the permuted export (--export-permuted: ModelSource::write_permuted, one FFN matrix at a time, against
// ffn_permute + write_llama2c / write_safetensors_model of the whole model), with a random layout, from the
// llama2.c model and from a safetensors copy of it.
//   pack_bench [--dim D] [--hidden H] [--layers L] [--dir DIR] [--dtype f16|f32]
// Defaults: dim 1024, hidden 4096 (OPT-style 4x), 8 layers (~540 MB model; FFN ~ 400 MB of it). Each variant runs
// in its own child process so that its peak RSS (wait4 -> ru_maxrss) is its own; the page cache is warm for both
// (the file was just written), so the figures are CPU/memory-bound packing throughput, not flash reads.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "formats/core/atomic_file.h"
#include "formats/core/image.h"
#include "formats/core/image_writer.h"
#include "formats/core/rng.h"
#include "formats/llama2c.h"
#include "formats/model_source.h"
#include "formats/safetensors.h"

using namespace nl;

namespace {

// Writes a random llama2.c model without holding it: tensors are generated in llama2.c's order in small chunks.
uint64_t write_synthetic_llama2c(const std::string& path, const ModelConfig& c) {
  AtomicWriter out(path);
  const int32_t h[7] = {c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads, c.vocab_size, c.seq_len};
  out.write(h, sizeof h);
  SplitMix64 rng(1);
  std::vector<float> chunk(1 << 16);
  uint64_t total = sizeof h;
  auto put = [&](uint64_t n) {
    while (n) {
      const uint64_t k = std::min<uint64_t>(n, chunk.size());
      for (uint64_t i = 0; i < k; ++i) chunk[i] = 0.02f * float(rng.normal());
      out.write(chunk.data(), k * 4);
      total += k * 4;
      n -= k;
    }
  };
  const uint64_t dim = uint64_t(c.dim), kv = uint64_t(c.kv_dim()), hid = uint64_t(c.hidden_dim),
                 L = uint64_t(c.n_layers);
  put(uint64_t(c.vocab_size) * dim);
  put(L * dim);
  put(L * dim * dim);
  put(L * kv * dim);
  put(L * kv * dim);
  put(L * dim * dim);
  put(L * dim);
  put(L * hid * dim * 3);
  put(dim);
  put(uint64_t(c.seq_len) * uint64_t(c.head_dim()));
  out.commit();
  return total;
}

// xxh64 of a file, read in chunks (the parent stays small: children inherit its resident pages).
uint64_t hash_file(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return 0;
  Xxh64 h;
  std::vector<char> buf(1 << 20);
  while (size_t n = std::fread(buf.data(), 1, buf.size(), f)) h.update(buf.data(), n);
  std::fclose(f);
  return h.digest();
}

struct Run {
  double seconds = 0;
  long max_rss_kb = 0;
};

// Runs `fn` in a child; its wall time and peak RSS.
template <class F>
Run in_child(F fn) {
  auto t0 = std::chrono::steady_clock::now();
  pid_t pid = ::fork();
  if (pid == 0) {
    try {
      fn();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "pack_bench: %s\n", e.what());
      ::_exit(1);
    }
    ::_exit(0);
  }
  int st = 0;
  struct rusage ru {};
  ::wait4(pid, &st, 0, &ru);
  Run r;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.max_rss_kb = ru.ru_maxrss;
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    std::fprintf(stderr, "pack_bench: child failed\n");
    std::exit(1);
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  ModelConfig c;
  c.dim = 1024;
  c.hidden_dim = 4096;
  c.n_layers = 8;
  c.n_heads = 16;
  c.n_kv_heads = 16;
  c.vocab_size = 512;
  c.seq_len = 256;
  c.act = FfnAct::kSilu;
  std::string dir = "/tmp", dtype = "f16";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--dim")
      c.dim = std::atoi(v.c_str());
    else if (k == "--hidden")
      c.hidden_dim = std::atoi(v.c_str());
    else if (k == "--layers")
      c.n_layers = std::atoi(v.c_str());
    else if (k == "--dir")
      dir = v;
    else if (k == "--dtype")
      dtype = v;
    else {
      std::fprintf(stderr, "usage: pack_bench [--dim D] [--hidden H] [--layers L] [--dir DIR] [--dtype f16|f32]\n");
      return 2;
    }
  }
  c.n_kv_heads = c.n_heads = std::max(1, c.dim / 64);
  const std::string model = dir + "/pack_bench_" + std::to_string(::getpid()) + ".bin";
  const std::string image = model + ".nlw";
  const uint64_t bytes = write_synthetic_llama2c(model, c);
  const double mb = double(bytes) / 1e6;
  const double ffn_layer_mb = double(c.hidden_dim) * c.dim * 3 * 4 / 1e6;
  ImageSpec spec;
  if (!image_dtype_parse(dtype, &spec.dtype)) {
    std::fprintf(stderr, "pack_bench: unknown dtype %s\n", dtype.c_str());
    return 2;
  }
  Run streaming = in_child([&] {
    auto src = open_model_source(model);
    ModelWeights dense = src->read_dense();
    image_write_source(image, *src, dense, spec);
  });
  const uint64_t streamed = hash_file(image);
  Run loaded = in_child([&] { image_write_model(image, read_model_source(*open_model_source(model)), spec); });
  const bool same = hash_file(image) == streamed;

  // A random layout (fixed seed) for the export.
  std::vector<std::vector<uint32_t>> order(size_t(c.n_layers));
  SplitMix64 rng(7);
  for (auto& o : order) {
    o.resize(size_t(c.hidden_dim));
    for (uint32_t i = 0; i < o.size(); ++i) o[i] = i;
    shuffle_with(o.data(), o.size(), rng);
  }
  const std::string exported = model + ".permuted.bin";
  Run export_streaming = in_child([&] { open_model_source(model)->write_permuted(exported, order); });
  const uint64_t export_streamed = hash_file(exported);
  Run export_loaded = in_child([&] {
    ModelWeights w = read_model_source(*open_model_source(model));
    ffn_permute(w, order);
    write_llama2c(exported, w);
  });
  const bool export_same = hash_file(exported) == export_streamed;
  // The same from a safetensors copy of the model (f32).
  const std::string hf = model + ".hf", hf_out = model + ".hf_permuted";
  in_child([&] { write_safetensors_model(hf, read_model_source(*open_model_source(model))); });
  Run st_streaming = in_child([&] { open_model_source(hf)->write_permuted(hf_out, order); });
  const uint64_t st_streamed = hash_file(hf_out + "/model.safetensors");
  Run st_loaded = in_child([&] {
    ModelWeights w = read_model_source(*open_model_source(hf));
    ffn_permute(w, order);
    write_safetensors_model(hf_out, w);
  });
  const bool st_same = hash_file(hf_out + "/model.safetensors") == st_streamed;
  std::printf("model: llama2.c, dim %d, hidden %d, %d layers, %.1f MB (FFN layer %.1f MB); image dtype %s\n", c.dim,
              c.hidden_dim, c.n_layers, mb, ffn_layer_mb, dtype.c_str());
  std::printf("%-22s %10s %10s %12s %14s\n", "variant", "seconds", "MB/s", "peak RSS MB", "RSS / model");
  for (auto [name, r] :
       {std::pair<const char*, Run>{"streaming (per layer)", streaming}, {"whole model loaded", loaded}})
    std::printf("%-22s %10.2f %10.1f %12.1f %14.3f\n", name, r.seconds, mb / r.seconds, r.max_rss_kb / 1024.0,
                r.max_rss_kb * 1024.0 / double(bytes));
  std::printf("streaming / loaded: time %.3f, peak RSS %.3f; images identical: %s\n",
              streaming.seconds / loaded.seconds, double(streaming.max_rss_kb) / double(loaded.max_rss_kb),
              same ? "yes" : "NO");
  std::printf("permuted export (llama2.c, random layout):\n");
  for (auto [name, r] :
       {std::pair<const char*, Run>{"streaming (per matrix)", export_streaming}, {"whole model loaded", export_loaded}})
    std::printf("%-22s %10.2f %10.1f %12.1f %14.3f\n", name, r.seconds, mb / r.seconds, r.max_rss_kb / 1024.0,
                r.max_rss_kb * 1024.0 / double(bytes));
  std::printf("streaming / loaded: time %.3f, peak RSS %.3f; exports identical: %s\n",
              export_streaming.seconds / export_loaded.seconds,
              double(export_streaming.max_rss_kb) / double(export_loaded.max_rss_kb), export_same ? "yes" : "NO");
  std::printf("permuted export (safetensors f32, random layout):\n");
  for (auto [name, r] :
       {std::pair<const char*, Run>{"streaming (per matrix)", st_streaming}, {"whole model loaded", st_loaded}})
    std::printf("%-22s %10.2f %10.1f %12.1f %14.3f\n", name, r.seconds, mb / r.seconds, r.max_rss_kb / 1024.0,
                r.max_rss_kb * 1024.0 / double(bytes));
  std::printf("streaming / loaded: time %.3f, peak RSS %.3f; exports identical: %s\n",
              st_streaming.seconds / st_loaded.seconds, double(st_streaming.max_rss_kb) / double(st_loaded.max_rss_kb),
              st_same ? "yes" : "NO");
  for (const std::string& d : {hf, hf_out}) {
    ::unlink((d + "/model.safetensors").c_str());
    ::unlink((d + "/config.json").c_str());
    ::rmdir(d.c_str());
  }
  ::unlink(exported.c_str());
  ::unlink(model.c_str());
  ::unlink(image.c_str());
  ::unlink((image + ".json").c_str());
  return same && export_same && st_same ? 0 : 1;
}
