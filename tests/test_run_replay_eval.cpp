// One planner, one answer: `nl-run replay` of a trace through a packed image reports exactly the reads, bytes and
// cache hits per token that `nl-layout eval` computes for the same trace, layout, gap and cache settings, for
// several layouts (identity, frequency, greedy, rcm) and settings (no merging/no cache, gap merging + S3-FIFO,
// sliding window).
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "formats/core/image_writer.h"
#include "formats/layout.h"
#include "formats/trace.h"
#include "image_test_util.h"
#include "layout/synthetic.h"

using namespace nl;

namespace {

int sh(const std::string& cmd, std::string* out) {
  FILE* p = ::popen((cmd + " 2>/dev/null").c_str(), "r");
  std::array<char, 4096> buf{};
  std::string s;
  while (size_t n = std::fread(buf.data(), 1, buf.size(), p)) s.append(buf.data(), n);
  int st = ::pclose(p);
  *out = s;
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

// Clustered activations; `offset` shifts the token window (profile vs held-out trace of the same structure).
void write_trace(const std::string& path, uint32_t n_neurons, uint64_t offset, uint64_t n_tokens) {
  std::vector<LayerMask> masks;
  for (uint32_t l = 0; l < 2; ++l) {
    ClusteredTraceSpec s;
    s.n_neurons = n_neurons;
    s.n_tokens = offset + n_tokens;
    s.cluster_size = 12;
    s.cluster_rate = 0.05;
    s.seed = 40 + l;
    LayerMask all = clustered_mask(s);
    LayerMask t(n_neurons, n_tokens);
    for (uint32_t n = 0; n < n_neurons; ++n)
      for (uint64_t k = 0; k < n_tokens; ++k)
        if (all.test(n, offset + k)) t.set(n, k);
    masks.push_back(t);
  }
  TraceWriterOptions o;
  o.model = "clustered";
  o.activation = "synthetic:clustered";
  o.n_neurons = {n_neurons, n_neurons};
  trace_write(path, o, masks, {0});
}

}  // namespace

TEST_CASE("replay reads/token equals nl-layout eval for the same trace, layout, gap and cache") {
  const std::string d = "replay_eval_test";
  ::mkdir(d.c_str(), 0755);
  ModelConfig c = test::small_config(64, 256, 2);
  ModelWeights w = test::random_weights(c, 5);
  write_trace(d + "/prof.h5", 256, 0, 600);
  write_trace(d + "/test.h5", 256, 600, 400);
  const std::string bin = std::string(NL_BINARY_DIR) + "/cli/";
  std::string out;
  const std::vector<std::string> methods = {"identity", "frequency", "greedy", "rcm"};
  std::string eval_layouts;
  uint64_t bundle_bytes = 0;
  for (const auto& m : methods) {
    const std::string lay = d + "/" + m + ".json";
    REQUIRE(sh(bin + "nl-layout -q solve --trace " + d + "/prof.h5 --method " + m + " --out " + lay, &out) == 0);
    eval_layouts += " --layout " + lay;
    ImageSpec spec;
    for (const auto& L : layout_load(lay).layers) spec.order.push_back(L.order);
    bundle_bytes = image_write_model(d + "/" + m + ".nlw", w, spec).bundle_bytes;
  }
  CHECK(bundle_bytes == 3 * 64 * 4);

  struct Setting {
    std::string eval_args, run_args;
  };
  const std::vector<Setting> settings = {
      {"--gap 0 --cache-ratio 0", "--gap off --cache-ratio 0"},
      {"--gap 3 --cache-ratio 0.1", "--gap 3 --cache-ratio 0.1"},
      {"--gap 2 --cache-ratio 0.05 --run-admit-prob 0.5 --seed 7", "--gap 2 --cache-ratio 0.05 --run-admit-prob 0.5 --seed 7"},
      {"--gap 1 --cache-ratio 0 --window 3", "--gap 1 --cache-ratio 0 --cache-window 3"},
  };
  for (const auto& s : settings) {
    CAPTURE(s.eval_args);
    REQUIRE(sh(bin + "nl-layout --json eval --trace " + d + "/test.h5" + eval_layouts + " --bundle-bytes " +
                   std::to_string(bundle_bytes) + " " + s.eval_args,
               &out) == 0);
    auto ev = nlohmann::json::parse(out);
    REQUIRE(ev["layouts"].size() == methods.size());
    double identity_reads = 0, greedy_reads = 0;
    for (size_t k = 0; k < methods.size(); ++k) {
      CAPTURE(methods[k]);
      REQUIRE(sh(bin + "nl-run --json replay --image " + d + "/" + methods[k] + ".nlw --trace " + d + "/test.h5 " +
                     s.run_args,
                 &out) == 0);
      auto rp = nlohmann::json::parse(out);
      REQUIRE(rp["tokens"].get<uint64_t>() == 400);
      const auto& e = ev["layouts"][k];
      const auto& t = rp["totals"];
      const double tokens = 400;
      // Exact: both are integer sums divided by the same token count.
      CHECK(double(t["reads"].get<uint64_t>()) / tokens == e["reads"].get<double>());
      CHECK(double(t["bytes_read"].get<uint64_t>()) / tokens == e["bytes_read"].get<double>());
      CHECK(double(t["bytes_needed"].get<uint64_t>()) / tokens == e["bytes_needed"].get<double>());
      const uint64_t active = t["active"].get<uint64_t>(), hits = t["cache_hits"].get<uint64_t>();
      CHECK((active ? double(hits) / double(active) : 0.0) == e["hit_rate"].get<double>());
      if (methods[k] == "identity") identity_reads = e["reads"].get<double>();
      if (methods[k] == "greedy") greedy_reads = e["reads"].get<double>();
    }
    CHECK(greedy_reads < identity_reads);  // the layouts really differ on this structured trace
  }
}
