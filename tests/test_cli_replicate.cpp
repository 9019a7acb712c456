// nl-layout with flash replication end to end: solve --replicate-budget (a bad value is a usage error), eval of the
// layout it writes, and pack's refusal of layouts with replicas (exit 3, nothing written) on the bundled tiny-relu.
#include <doctest/doctest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "formats/core/atomic_file.h"
#include "formats/layout.h"
#include "formats/trace.h"
#include "layout/synthetic.h"

using namespace nl;

namespace {

int run(const std::string& args, std::string* err = nullptr) {
  std::string cmd = std::string(NL_BINARY_DIR) + "/cli/nl-layout " + args + " > rep_out.txt 2> rep_err.txt";
  int st = std::system(cmd.c_str());
  if (err) *err = read_file("rep_err.txt");
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
  trace_write("rep_trace.h5", o, masks, seq);
  std::string err;
  CHECK(run("solve --trace rep_trace.h5 --replicate-budget 12x --out rep_bad.json", &err) == 2);
  CHECK(err.find("--replicate-budget") != std::string::npos);
  CHECK(!std::filesystem::exists("rep_bad.json"));
  REQUIRE(run("-q solve --trace rep_trace.h5 --bundle-bytes 16384 --replicate-budget 20% --out rep.json") == 0);
  const Layout l = layout_load("rep.json");
  uint32_t replicas = 0;
  for (const LayoutLayer& L : l.layers) {
    CHECK(L.order.size() == 512 + L.replicas);
    replicas += L.replicas;
  }
  CHECK(replicas > 0);  // on this trace copies win on validation (the unit test's trace, layer 0 keeps 25)
  CHECK(l.parameters.at("replicate_share").get<double>() == doctest::Approx(0.2));
  CHECK(run("-q eval --trace rep_trace.h5 --layout rep.json --bundle-bytes 16384 --cache-ratio 0.05") == 0);
}

TEST_CASE("pack refuses a layout with replicas, naming the file, and writes nothing") {
  nlohmann::json layers = nlohmann::json::array();
  for (int l = 0; l < 4; ++l) {  // tiny-relu: 4 layers of 512 neurons; neuron 0 twice in each
    std::vector<uint32_t> order(512);
    for (uint32_t s = 0; s < 512; ++s) order[s] = s;
    order.push_back(0);
    layers.push_back({{"order", order}, {"replicas", 1}});
  }
  const nlohmann::json j = {
      {"format", "neuralink-layout"}, {"version", 1}, {"method", "greedy+ls"}, {"layers", layers}};
  write_file_atomic("rep_tiny.json", j.dump());
  const std::string model = std::string(NL_SOURCE_DIR) + "/datasets/tiny-relu/model";
  std::filesystem::remove("rep_tiny.nlw");
  std::string err;
  CHECK(run("pack --model " + model + " --layout rep_tiny.json --out rep_tiny.nlw", &err) == 3);
  CHECK(err.find("rep_tiny.json") != std::string::npos);
  CHECK(err.find("replicas") != std::string::npos);
  CHECK(!std::filesystem::exists("rep_tiny.nlw"));
  CHECK(!std::filesystem::exists("rep_tiny.nlw.json"));
}
