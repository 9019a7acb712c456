// One planner, one answer: `nl-run replay` of a trace through a packed image reports exactly the reads, bytes and
// cache hits per token that `nl-layout eval` computes for the same trace, layout, gap and cache settings, for
// several layouts (identity, frequency, greedy, rcm, greedy+ls) and settings (no merging/no cache, gap merging +
// S3-FIFO, sliding window); and, on the bundled tiny-relu model end to end (nl-profile run -> nl-layout solve ->
// nl-layout pack -> nl-run replay), for greedy+ls layouts that record a per-layer cache policy (pinned hot neurons,
// admission "all"), which pack carries into the manifest and nl-run applies; and a read longer than nl-run's staging
// counts as the pieces the runtime issues, in both.
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>

#include "cli_test_util.h"
#include "formats/core/image.h"
#include "formats/core/image_writer.h"
#include "formats/layout.h"
#include "formats/trace.h"
#include "image_test_util.h"
#include "layout/synthetic.h"
#include "runtime/memory.h"
#include "skip_util.h"

using namespace nl;

namespace {

int sh(const std::string& cmd, std::string* out) { return test::sh(cmd, out, test::Stderr::kDrop); }

// A two-layer synthetic trace of `masks` (one sequence), model "<name>", activation "synthetic:<name>".
void write_masks(const std::string& path, const std::string& name, const std::vector<LayerMask>& masks) {
  TraceWriterOptions o;
  o.model = name;
  o.activation = "synthetic:" + name;
  for (const LayerMask& m : masks) o.n_neurons.push_back(m.n_neurons);
  trace_write(path, o, masks, {0});
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
  write_masks(path, "clustered", masks);
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
  const std::vector<std::string> methods = {"identity", "frequency", "greedy", "rcm", "greedy+ls"};
  std::string eval_layouts;
  uint64_t bundle_bytes = 0;
  for (const auto& m : methods) {
    const std::string lay = d + "/" + m + ".json";
    REQUIRE(sh(bin + "nl-layout -q solve --trace " + d + "/prof.h5 --method " + m + " --out " + lay, &out) == 0);
    eval_layouts += " --layout " + lay;
    ImageSpec spec;
    const Layout L = layout_load(lay);
    for (const auto& ll : L.layers) spec.order.push_back(ll.order);
    spec.cache_policy = layout_cache_policy_slots(L);  // what nl-layout pack records
    bundle_bytes = image_write_model(d + "/" + m + ".nlw", w, spec).bundle_bytes;
  }
  CHECK(bundle_bytes == 3 * 64 * 4);

  struct Setting {
    std::string eval_args, run_args;
  };
  const std::vector<Setting> settings = {
      {"--gap 0 --cache-ratio 0", "--gap off --cache-ratio 0"},
      {"--gap 3 --cache-ratio 0.1", "--gap 3 --cache-ratio 0.1"},
      {"--gap 2 --cache-ratio 0.05 --run-admit-prob 0.5 --seed 7",
       "--gap 2 --cache-ratio 0.05 --run-admit-prob 0.5 --seed 7"},
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

TEST_CASE("a read longer than nl-run's staging counts as its device pieces, in replay and eval alike") {
  // 12,000-byte bundles (not a block multiple: pieces share a block at each cut) and runs of 1500-1700 active
  // neurons: each run is one planned read of 18-20.4 MB, which nl-run issues as pieces that fit its 16 MiB staging
  // (memory.h kFfnReadBatchBytes; the layer's 24.6 MB region does not cut it).
  static_assert(kFfnReadBatchBytes == uint64_t(16) << 20, "the runs below are sized for a 16 MiB staging");
  const std::string d = "replay_eval_pieces_test";
  ::mkdir(d.c_str(), 0755);
  const uint32_t n = 2048;
  ModelConfig c = test::small_config(1000, int(n), 2);
  ModelWeights w = test::random_weights(c, 9);
  auto trace = [&](const std::string& path, uint64_t seed) {
    std::vector<LayerMask> masks;
    for (uint32_t l = 0; l < 2; ++l) {
      LayerMask t(n, 40);
      for (uint64_t k = 0; k < 40; ++k) {
        const uint32_t b = uint32_t((k * 37 + seed * 11 + l * 5) % 100), len = 1500 + uint32_t((k * 53 + seed) % 200);
        for (uint32_t v = b; v < b + len; ++v) t.set(v, k);
        t.set(uint32_t(2000 + (k + seed) % 24), k);  // and a short read
      }
      masks.push_back(t);
    }
    write_masks(path, "long-runs", masks);
  };
  trace(d + "/prof.h5", 1);
  trace(d + "/test.h5", 2);
  const std::string bin = std::string(NL_BINARY_DIR) + "/cli/";
  std::string out;
  REQUIRE(sh(bin + "nl-layout -q solve --trace " + d + "/prof.h5 --method identity --out " + d + "/id.json", &out) ==
          0);
  ImageSpec spec;
  for (const auto& ll : layout_load(d + "/id.json").layers) spec.order.push_back(ll.order);
  const uint64_t bundle_bytes = image_write_model(d + "/id.nlw", w, spec).bundle_bytes;
  REQUIRE(bundle_bytes == 12000);
  for (const char* cache : {"0", "0.05"}) {
    CAPTURE(cache);
    REQUIRE(sh(bin + "nl-layout --json eval --trace " + d + "/test.h5 --layout " + d +
                   "/id.json --bundle-bytes 12000 --gap 0 --cache-ratio " + cache,
               &out) == 0);
    const auto e = nlohmann::json::parse(out)["layouts"][0];
    REQUIRE(sh(bin + "nl-run --json replay --image " + d + "/id.nlw --trace " + d +
                   "/test.h5 --gap off --cache-ratio " + cache,
               &out) == 0);
    const auto t = nlohmann::json::parse(out)["totals"];
    CHECK(double(t["reads"].get<uint64_t>()) / 40 == e["reads"].get<double>());
    CHECK(double(t["bytes_read"].get<uint64_t>()) / 40 == e["bytes_read"].get<double>());
    // Per layer-token: the short read and two pieces of the long one (1398 bundles fit 16 MiB).
    CHECK(e["reads"].get<double>() >= 2 * 3);
  }
}

namespace {

nlohmann::json json_of(const std::string& bin, const std::string& args) {
  std::string out;
  const int rc = sh(bin + " --json -q " + args, &out);
  INFO(bin << " " << args << "\n" << out);
  REQUIRE(rc == 0);
  return nlohmann::json::parse(out);
}

}  // namespace

TEST_CASE("tiny-relu end to end: replay equals nl-layout eval for greedy+ls layouts with a recorded cache policy" *
          nl::test::needs_file("/usr/share/common-licenses/GPL-3", "Debian base-files, the profiling text")) {
  const std::string text = "/usr/share/common-licenses/GPL-3";
  const std::string d = "replay_eval_tiny";
  ::mkdir(d.c_str(), 0755);
  const std::string model = std::string(NL_SOURCE_DIR) + "/datasets/tiny-relu/model";
  const std::string bin = std::string(NL_BINARY_DIR) + "/cli/";
  const std::string ufs40 = std::string(NL_SOURCE_DIR) + "/configs/devices/ufs40.json";
  std::string out;
  REQUIRE(sh(bin + "nl-profile -q run --model " + model + " --tokenizer " + model + "/tokenizer.model --text " + text +
                 " --seq-len 128 --max-tokens 8000 --test-fraction 0.2 --out " + d + "/prof.h5 --test-out " + d +
                 "/test.h5",
             &out) == 0);
  const uint64_t test_tokens = json_of(bin + "nl-profile", "inspect " + d + "/test.h5")["n_tokens"].get<uint64_t>();
  REQUIRE(test_tokens >= 300);
  // f32 gated bundles of the 128-wide model: 3 x 128 x 4 bytes; the layouts are designed for them.
  const std::string bb = "--bundle-bytes 1536";

  struct Lay {
    std::string name, solve_args;
  };
  const std::vector<Lay> lays = {
      {"identity", "--method identity"},
      {"greedy", "--method greedy"},
      // Ours designed for a 10 % cache, chosen on the profile tokens under the weight guard: on this model it keeps
      // admission "all" without a pinned set (the pinned variant lowers the gap-0 path weight, which the guard
      // refuses).
      {"gls", "--method greedy+ls --cache-ratio 0.1 --gap auto --validation-share 0 --weight-guard " + bb},
      // Without the weight guard the pinned variant (hottest neurons pinned, admission all) wins on every layer.
      {"gls-pin", "--method greedy+ls --cache-ratio 0.1 --gap auto --validation-share 0 " + bb},
      // gls-pin's orders with half of each pinned set, so that part of the capacity runs S3-FIFO, admitting every
      // miss ("all") or only misses read alone ("isolated") on every layer (no solve arguments: derived from
      // gls-pin), so that the runtime's isolated admission is checked against eval's whatever the guard chose.
      {"gls-half", ""},
      {"gls-iso", ""},
      // gls-half with half of each S3-FIFO part in its small FIFO (`small_fraction`, 10 % otherwise).
      {"gls-small", ""},
      // gls-pin's orders with the value cache: without pins, its hotness order gls-pin's pinned set (the rest
      // unlisted); and with half of each pinned set pinned and every neuron listed, coldest first.
      {"gls-value", ""},
      {"gls-value-pin", ""},
  };
  std::string eval_layouts;
  size_t layers_pinned = 0, layers_all = 0;
  std::map<std::string, bool> records_pins;  // layout name -> some layer has a pinned set
  for (const auto& L : lays) {
    const std::string lay = d + "/" + L.name + ".json", img = d + "/" + L.name + ".nlw";
    if (L.solve_args.empty()) {
      Layout x = layout_load(d + "/gls-pin.json");
      for (auto& ll : x.layers) {
        ll.admission = L.name == "gls-iso" ? CacheAdmission::kIsolated : CacheAdmission::kAll;
        if (L.name == "gls-value") {
          ll.admission = CacheAdmission::kValue;
          ll.hot = ll.pinned;
          ll.pinned.clear();
          continue;
        }
        if (L.name == "gls-value-pin") {
          ll.admission = CacheAdmission::kValue;
          for (uint32_t v = uint32_t(ll.order.size()); v-- > 0;) ll.hot.push_back(v);
        }
        ll.pinned.resize(ll.pinned.size() / 2);
        if (L.name == "gls-small") ll.small_fraction = 0.5;
      }
      layout_write(lay, x);
    } else {
      REQUIRE(sh(bin + "nl-layout -q solve --trace " + d + "/prof.h5 " + L.solve_args + " --out " + lay, &out) == 0);
    }
    REQUIRE(sh(bin + "nl-layout -q pack --model " + model + " --layout " + lay + " --out " + img, &out) == 0);
    eval_layouts += " --layout " + lay;
    // pack carried the layout's policy into the manifest, pinned neurons as their slots, hottest first.
    const Layout layout = layout_load(lay);
    const ImageManifest m = manifest_load(img + ".json");
    CHECK(m.bundle_bytes == 1536);
    bool any = false;
    for (const auto& ll : layout.layers) {
      any = any || ll.admission != CacheAdmission::kUnset || !ll.pinned.empty();
      records_pins[L.name] = records_pins[L.name] || !ll.pinned.empty();
    }
    REQUIRE(m.cache_policy.size() == (any ? layout.layers.size() : 0));
    for (size_t l = 0; l < m.cache_policy.size(); ++l) {
      CAPTURE(L.name);
      CAPTURE(l);
      CHECK(m.cache_policy[l].admission == layout.layers[l].admission);
      REQUIRE(m.cache_policy[l].pinned.size() == layout.layers[l].pinned.size());
      for (size_t k = 0; k < m.cache_policy[l].pinned.size(); ++k)
        CHECK(m.order[l][m.cache_policy[l].pinned[k]] == layout.layers[l].pinned[k]);
      REQUIRE(m.cache_policy[l].hot.size() == layout.layers[l].hot.size());
      for (size_t k = 0; k < m.cache_policy[l].hot.size(); ++k)
        CHECK(m.order[l][m.cache_policy[l].hot[k]] == layout.layers[l].hot[k]);
      if (L.name == "gls-pin") {
        layers_pinned += !layout.layers[l].pinned.empty();
        layers_all += layout.layers[l].admission == CacheAdmission::kAll;
      }
    }
  }
  // The case this test exists for: the solver really recorded pinned hot neurons and admission "all".
  MESSAGE("greedy+ls (pin): " << layers_pinned << " of 4 layers pinned, " << layers_all << " with admission all");
  REQUIRE(layers_pinned >= 1);
  REQUIRE(layers_all >= 1);

  struct Setting {
    std::string eval_args, run_args;
  };
  const std::vector<Setting> settings = {
      {"--gap 0 --cache-ratio 0.1", "--gap off --cache-ratio 0.1"},
      {"--gap auto --device " + ufs40 + " --cache-ratio 0.1", "--gap auto --device " + ufs40 + " --cache-ratio 0.1"},
      {"--gap 2 --cache-ratio 0.05 --seed 3", "--gap 2 --cache-ratio 0.05 --seed 3"},  // pinned set cut to capacity
      {"--gap 1 --cache-ratio 0.1 --window 2", "--gap 1 --cache-ratio 0.1 --cache-window 2"},
      // Ablations: the manifest's policy ignored, one admission rule for every layer.
      {"--gap 2 --cache-ratio 0.1 --same-cache", "--gap 2 --cache-ratio 0.1 --cache-policy linking-aligned"},
      {"--gap 2 --cache-ratio 0.1 --same-cache --plain-s3fifo", "--gap 2 --cache-ratio 0.1 --cache-policy all"},
      // The same settings under the names nl-run gives them (eval accepts them too).
      {"--gap 1 --cache-ratio 0.1 --cache-window 2", "--gap 1 --cache-ratio 0.1 --cache-window 2"},
      {"--gap 2 --cache-ratio 0.1 --cache-policy linking-aligned",
       "--gap 2 --cache-ratio 0.1 --cache-policy linking-aligned"},
      {"--gap 2 --cache-ratio 0.1 --cache-policy all", "--gap 2 --cache-ratio 0.1 --cache-policy all"},
  };
  std::map<std::string, uint64_t> hits_policy;
  for (const auto& s : settings) {
    CAPTURE(s.eval_args);
    auto ev =
        json_of(bin + "nl-layout", "eval --trace " + d + "/test.h5" + eval_layouts + " " + bb + " " + s.eval_args);
    REQUIRE(ev["layouts"].size() == lays.size());
    for (size_t k = 0; k < lays.size(); ++k) {
      CAPTURE(lays[k].name);
      auto rp = json_of(bin + "nl-run", "replay --no-direct --image " + d + "/" + lays[k].name + ".nlw --trace " + d +
                                            "/test.h5 " + s.run_args);
      REQUIRE(rp["tokens"].get<uint64_t>() == test_tokens);
      const auto& e = ev["layouts"][k];
      const auto& t = rp["totals"];
      const double tokens = double(test_tokens);
      const double replay_reads = double(t["reads"].get<uint64_t>()) / tokens;
      MESSAGE(lays[k].name << " [" << s.run_args << "]: replay reads/token " << replay_reads << ", eval "
                           << e["reads"].get<double>() << "; pinned " << rp["pinned"]["bundles"]);
      CHECK(replay_reads == e["reads"].get<double>());
      CHECK(double(t["bytes_read"].get<uint64_t>()) / tokens == e["bytes_read"].get<double>());
      CHECK(double(t["bytes_needed"].get<uint64_t>()) / tokens == e["bytes_needed"].get<double>());
      const uint64_t active = t["active"].get<uint64_t>(), hits = t["cache_hits"].get<uint64_t>();
      CHECK((active ? double(hits) / double(active) : 0.0) == e["hit_rate"].get<double>());
      const bool same = s.run_args.find("--cache-policy") != std::string::npos;
      if (lays[k].name.rfind("gls-", 0) == 0 && s.run_args == "--gap off --cache-ratio 0.1")
        hits_policy[lays[k].name] = hits;
      // Pinned bundles exactly when the layout recorded a pinned set and the manifest's policy is in force.
      CHECK((rp["pinned"]["bundles"].get<uint64_t>() > 0) == (records_pins[lays[k].name] && !same));
    }
  }
  // The policy changes what the cache does (else the cases above would not test it): the same layout replayed with
  // the paper's cache instead of its own serves a different number of hits.
  auto rp = json_of(bin + "nl-run", "replay --no-direct --image " + d + "/gls-pin.nlw --trace " + d +
                                        "/test.h5 --gap off --cache-ratio 0.1 --cache-policy linking-aligned");
  CHECK(rp["totals"]["cache_hits"].get<uint64_t>() != hits_policy["gls-pin"]);
  CHECK(hits_policy["gls-iso"] != hits_policy["gls-half"]);    // isolated admission is a different cache
  CHECK(hits_policy["gls-small"] != hits_policy["gls-half"]);  // and so is a larger small FIFO
  CHECK(hits_policy["gls-value"] != hits_policy["gls-pin"]);   // and the value cache
  CHECK(hits_policy["gls-value-pin"] != hits_policy["gls-half"]);
  MESSAGE("value cache: " << hits_policy["gls-value"] << " hits, with half pinned " << hits_policy["gls-value-pin"]);
  MESSAGE("half pinned, admission all: small FIFO 10 % " << hits_policy["gls-half"] << " hits, 50 % "
                                                         << hits_policy["gls-small"]);
  MESSAGE("half pinned: hits with admission all " << hits_policy["gls-half"] << ", isolated "
                                                  << hits_policy["gls-iso"]);
  MESSAGE("gls-pin hits with its own policy " << hits_policy["gls-pin"] << ", with linking-aligned "
                                              << rp["totals"]["cache_hits"]);
}
