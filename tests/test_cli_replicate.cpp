// nl-layout with flash replication end to end: solve --replicate-budget (a bad value is a usage error), eval of the
// layout it writes; on the bundled tiny-relu, pack of a replicated layout, nl-run generate's tokens against the same
// layout without replicas, nl-run replay's reads against nl-layout eval's, and manifests with a corrupted replica map
// (exit 3, one line). Its files in the shared test directory start with repl_ (test_cli_report's start with rep_, and
// ctest -j runs both at once).
#include <doctest/doctest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "formats/core/atomic_file.h"
#include "formats/core/image.h"
#include "formats/layout.h"
#include "formats/trace.h"
#include "layout/synthetic.h"
#include "runtime/plan/replica_cover.h"
#include "skip_util.h"

using namespace nl;

namespace {

int run(const std::string& args, std::string* err = nullptr) {
  std::string cmd = std::string(NL_BINARY_DIR) + "/cli/nl-layout " + args + " > repl_out.txt 2> repl_err.txt";
  int st = std::system(cmd.c_str());
  if (err) *err = read_file("repl_err.txt");
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

}  // namespace

TEST_CASE("solve --replicate-budget writes a layout eval reads; a bad budget is a usage error") {
  std::vector<LayerMask> masks;
  for (uint32_t l = 0; l < 2; ++l) {
    ClusteredTraceSpec s;
    s.n_neurons = 512;
    s.n_tokens = 4096;
    s.cluster_size = 12;
    s.cluster_rate = 0.05;
    s.seed = 3 + l;
    masks.push_back(clustered_mask(s));
  }
  TraceWriterOptions o;
  o.model = "clustered";
  o.activation = "synthetic:clustered";
  o.n_neurons = {512, 512};
  std::vector<int64_t> seq;
  for (int64_t t = 0; t < 4096; t += 128) seq.push_back(t);
  trace_write("repl_trace.h5", o, masks, seq);
  std::string err;
  CHECK(run("solve --trace repl_trace.h5 --replicate-budget 12x --out repl_bad.json", &err) == 2);
  CHECK(err.find("--replicate-budget") != std::string::npos);
  CHECK(!std::filesystem::exists("repl_bad.json"));
  REQUIRE(run("-q solve --trace repl_trace.h5 --bundle-bytes 16384 --replicate-budget 20% --out repl.json") == 0);
  const Layout l = layout_load("repl.json");
  uint32_t replicas = 0;
  for (const LayoutLayer& L : l.layers) {
    CHECK(L.order.size() == 512 + L.replicas);
    replicas += L.replicas;
  }
  CHECK(replicas > 0);  // on this trace copies win on validation (the unit test's trace, layer 0 keeps 25)
  CHECK(l.parameters.at("replicate_share").get<double>() == doctest::Approx(0.2));
  CHECK(run("-q eval --trace repl_trace.h5 --layout repl.json --bundle-bytes 16384 --cache-ratio 0.05") == 0);
}

namespace {

int sh(const std::string& cmd, std::string* out) {
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  out->clear();
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, p)) out->append(buf, n);
  const int st = ::pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

nlohmann::json json_of(const std::string& cmd) {
  std::string out;
  const int rc = sh(cmd + " 2>/dev/null", &out);
  INFO(cmd << "\n" << out);
  REQUIRE(rc == 0);
  return nlohmann::json::parse(out);
}

std::string tokens_line(const std::string& out) {
  auto p = out.find("tokens:");
  return p == std::string::npos ? "" : out.substr(p, out.find('\n', p) - p);
}

}  // namespace

// The bundled tiny-relu model end to end: profile, a greedy layout, the same layout with a copy of every 6th neuron
// placed far from its first (the solver keeps no copies on this small model, so the test places them), pack both.
TEST_CASE("tiny-relu: a replicated image generates the unreplicated layout's tokens; replay reads what eval predicts" *
          nl::test::needs_file("/usr/share/common-licenses/GPL-3", "Debian base-files, the profiling text")) {
  const std::string d = "repl_tiny_e2e";
  std::filesystem::create_directories(d);
  const std::string model = std::string(NL_SOURCE_DIR) + "/datasets/tiny-relu/model";
  const std::string bin = std::string(NL_BINARY_DIR) + "/cli/";
  const std::string ufs40 = std::string(NL_SOURCE_DIR) + "/configs/devices/ufs40.json";
  std::string out;
  REQUIRE(sh(bin + "nl-profile -q run --model " + model + " --tokenizer " + model +
                 "/tokenizer.model --text /usr/share/common-licenses/GPL-3 --seq-len 128 --max-tokens 3000 "
                 "--test-fraction 0.2 --out " +
                 d + "/prof.h5 --test-out " + d + "/test.h5",
             &out) == 0);
  REQUIRE(sh(bin + "nl-layout -q solve --trace " + d + "/prof.h5 --method greedy --out " + d + "/g.json", &out) == 0);
  Layout rep = layout_load(d + "/g.json"), prim = rep;
  for (size_t l = 0; l < rep.layers.size(); ++l) {
    const std::vector<uint32_t> o = rep.layers[l].order;
    const size_t n = o.size();
    std::vector<std::vector<uint32_t>> after(n);
    for (size_t i = 0; i < n; i += 6)
      if (o[(i * 7919 + 13) % n] != o[i]) after[(i * 7919 + 13) % n].push_back(o[i]);
    std::vector<uint32_t> r;
    for (size_t s = 0; s < n; ++s) {
      r.push_back(o[s]);
      for (uint32_t v : after[s]) r.push_back(v);
    }
    rep.layers[l].replicas = uint32_t(r.size() - n);
    rep.layers[l].order = r;
    prim.layers[l].order = primary_order(r, uint32_t(n));  // the same layout without its replicas
  }
  layout_write(d + "/rep.json", rep);
  layout_write(d + "/prim.json", prim);
  for (const char* k : {"rep", "prim"})
    REQUIRE(sh(bin + "nl-layout -q pack --model " + model + " --layout " + d + "/" + k + ".json --out " + d + "/" + k +
                   ".nlw",
               &out) == 0);
  const ImageManifest m = manifest_load(d + "/rep.nlw.json");
  REQUIRE(m.replicas.size() == 4);
  for (size_t l = 0; l < 4; ++l) {
    CHECK(m.replicas[l] == rep.layers[l].replicas);
    CHECK(m.order[l] == rep.layers[l].order);
  }
  CHECK(manifest_load(d + "/prim.nlw.json").replicas.empty());

  // generate: the same tokens (gate selection, several planner and cache settings, both I/O paths).
  for (std::string extra : {"--gap off", "--gap 3 --cache-ratio 0.1 --overlap none", "--gap auto --cache-ratio 0.2",
                            "--gap 1 --cache-ratio 0.1 --cache-window 2 --read-batch 8KiB"}) {
    CAPTURE(extra);
    std::string a, b;
    const std::string args = " --no-direct --prompt-tokens 1,450,2000 --steps 40 " + extra;
    REQUIRE(sh(bin + "nl-run generate --image " + d + "/rep.nlw" + args, &a) == 0);
    REQUIRE(sh(bin + "nl-run generate --image " + d + "/prim.nlw" + args, &b) == 0);
    REQUIRE(tokens_line(a).size() > 20);
    CHECK(tokens_line(a) == tokens_line(b));
  }
  // The default overlap (auto) is both, whose read-ahead does not read replicas: layer for the replicated image.
  for (const char* img : {"/rep.nlw", "/prim.nlw"}) {
    const auto j =
        json_of(bin + "nl-run -q --json generate --no-direct --prompt-tokens 1,450 --steps 4 --image " + d + img);
    CHECK(j["overlap"]["mode"] == (std::string(img) == "/rep.nlw" ? "layer" : "both"));
  }

  // replay: per token exactly the reads, bytes and hits nl-layout eval predicts for the replicated layout.
  struct Setting {
    std::string eval_args, run_args;
  };
  const std::vector<Setting> settings = {
      {"--gap 0 --cache-ratio 0.1", "--gap off --cache-ratio 0.1"},
      {"--gap auto --device " + ufs40 + " --cache-ratio 0.1", "--gap auto --device " + ufs40 + " --cache-ratio 0.1"},
      {"--gap 2 --cache-ratio 0.05 --seed 3", "--gap 2 --cache-ratio 0.05 --seed 3"},
      {"--gap 1 --cache-ratio 0.1 --window 2", "--gap 1 --cache-ratio 0.1 --cache-window 2"},
  };
  for (const auto& s : settings) {
    CAPTURE(s.eval_args);
    const auto ev = json_of(bin + "nl-layout --json -q eval --trace " + d + "/test.h5 --layout " + d +
                            "/rep.json --bundle-bytes 1536 " + s.eval_args);
    const auto rp = json_of(bin + "nl-run --json -q replay --no-direct --image " + d + "/rep.nlw --trace " + d +
                            "/test.h5 " + s.run_args);
    const auto& e = ev["layouts"][0];
    const auto& t = rp["totals"];
    const double tokens = double(rp["tokens"].get<uint64_t>());
    REQUIRE(tokens >= 300);
    CHECK(double(t["reads"].get<uint64_t>()) / tokens == e["reads"].get<double>());
    CHECK(double(t["bytes_read"].get<uint64_t>()) / tokens == e["bytes_read"].get<double>());
    CHECK(double(t["bytes_needed"].get<uint64_t>()) / tokens == e["bytes_needed"].get<double>());
    CHECK(double(t["cache_hits"].get<uint64_t>()) / double(t["active"].get<uint64_t>()) == e["hit_rate"].get<double>());
    CHECK(rp["replication"]["second_copy_reads"].get<uint64_t>() > 0);  // the copies are used
  }
}

TEST_CASE("a manifest with a corrupted replica map is refused with one line and exit 3") {
  // Any small image with replicas: the bundled tiny-relu with neuron 0 twice in each layer.
  nlohmann::json layers = nlohmann::json::array();
  for (int l = 0; l < 4; ++l) {
    std::vector<uint32_t> order(512);
    for (uint32_t s = 0; s < 512; ++s) order[s] = s;
    order.push_back(0);
    layers.push_back({{"order", order}, {"replicas", 1}});
  }
  const nlohmann::json j = {
      {"format", "neuralink-layout"}, {"version", 1}, {"method", "greedy+ls"}, {"layers", layers}};
  write_file_atomic("repl_tiny.json", j.dump());
  const std::string model = std::string(NL_SOURCE_DIR) + "/datasets/tiny-relu/model";
  REQUIRE(run("-q pack --model " + model + " --layout repl_tiny.json --out repl_tiny.nlw") == 0);
  const std::string text = read_file("repl_tiny.nlw.json");
  const nlohmann::json good = nlohmann::json::parse(text);
  CHECK(good["version_minor"] == 2);
  CHECK(good["replicas"] == nlohmann::json::array({1, 1, 1, 1}));
  const std::string nlrun = std::string(NL_BINARY_DIR) + "/cli/nl-run";
  std::string out;
  REQUIRE(sh(nlrun + " generate --no-direct --image repl_tiny.nlw --prompt-tokens 1,5 --steps 3", &out) == 0);
  struct Edit {
    std::string what, expect;
    std::function<void(nlohmann::json&)> edit;
  };
  const std::vector<Edit> edits = {
      {"neuron out of range", "neuron 512 is out of range", [](nlohmann::json& m) { m["order"][1][512] = 512; }},
      {"a neuron three times", "more than twice", [](nlohmann::json& m) { m["order"][2][511] = 0; }},
      {"a copy moved (checksum not updated)", "image id",
       [](nlohmann::json& m) { std::swap(m["order"][3][1], m["order"][3][512]); }},
      {"the replica count", "replicas", [](nlohmann::json& m) { m["replicas"][0] = 2; }},
      {"the replica map dropped (back to 1.1)", "expected hidden_dim 512",
       [](nlohmann::json& m) {
         m.erase("replicas");
         m["version_minor"] = 1;
       }},
  };
  for (const auto& e : edits) {
    CAPTURE(e.what);
    nlohmann::json m = good;
    e.edit(m);
    write_file_atomic("repl_tiny.nlw.json", m.dump(1));
    const int rc = sh(nlrun + " generate --no-direct --image repl_tiny.nlw --prompt-tokens 1,5 --steps 3", &out);
    CHECK(rc == 3);
    CHECK(out.find("repl_tiny.nlw.json") != std::string::npos);
    CHECK(out.find(e.expect) != std::string::npos);
    CHECK(std::count(out.begin(), out.end(), '\n') == 1);  // one line
    CHECK(out.find("tokens:") == std::string::npos);
  }
  write_file_atomic("repl_tiny.nlw.json", text);
  CHECK(sh(nlrun + " generate --no-direct --image repl_tiny.nlw --prompt-tokens 1,5 --steps 3", &out) == 0);
}
