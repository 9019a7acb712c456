// nl-layout solve / eval end to end on a clustered trace file: byte-identical layouts across runs, the eval
// table and JSON, gate parsing, and exit 5 when a gate is violated.
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "formats/core/atomic_file.h"
#include "formats/core/error.h"
#include "formats/trace.h"
#include "layout/gate.h"
#include "layout/synthetic.h"

using namespace nl;

namespace {

int run(const std::string& args, std::string* out = nullptr) {
  std::string cmd = std::string(NL_BINARY_DIR) + "/cli/nl-layout " + args + " > cli_out.txt 2> cli_err.txt";
  int st = std::system(cmd.c_str());
  if (out) *out = read_file("cli_out.txt");
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

void write_trace(const std::string& path, uint64_t seed) {
  std::vector<LayerMask> masks;
  for (uint32_t l = 0; l < 2; ++l) {
    ClusteredTraceSpec s;
    s.n_neurons = 256;
    s.n_tokens = 1200;
    s.cluster_size = 12;
    s.cluster_rate = 0.05;
    s.seed = 100 + l;
    masks.push_back(clustered_mask(s));
    if (seed != 1) {  // held-out: same structure, later tokens
      s.n_tokens = 2400;
      LayerMask all = clustered_mask(s);
      LayerMask t(256, 1200);
      for (uint32_t n = 0; n < 256; ++n)
        for (uint64_t k = 0; k < 1200; ++k)
          if (all.test(n, 1200 + k)) t.set(n, k);
      masks.back() = t;
    }
  }
  TraceWriterOptions o;
  o.model = "clustered";
  o.activation = "synthetic:clustered";
  o.n_neurons = {256, 256};
  trace_write(path, o, masks, {0});
}

}  // namespace

TEST_CASE("gate expressions") {
  GateLookup look = [](const std::string& l, const std::string& m, double& v) {
    if (m != "reads") return false;
    if (l == "greedy")
      v = 10;
    else if (l == "greedy+ls")
      v = 9;
    else
      return false;
    return true;
  };
  CHECK(gate_check("greedy+ls.reads <= 0.9 * greedy.reads", look).ok);
  CHECK_FALSE(gate_check("greedy+ls.reads < 0.9 * greedy.reads", look).ok);
  CHECK(gate_check("greedy.reads > greedy+ls.reads", look).ok);
  CHECK(gate_check("2 * greedy+ls.reads >= 18", look).ok);
  CHECK_THROWS_AS(gate_check("greedy.reads", look), UsageError);
  CHECK_THROWS_AS(gate_check("greedy.bogus <= 1", look), UsageError);
  CHECK_THROWS_AS(gate_check("nosuch.reads <= 1", look), UsageError);
  CHECK_THROWS_AS(gate_check("greedy.reads <= 1 extra", look), UsageError);
  CHECK_THROWS_AS(gate_check("greedy <= 1", look), UsageError);
}

TEST_CASE("solve is byte-identical across runs; eval prints figures and enforces gates") {
  write_trace("cli_prof.h5", 1);
  write_trace("cli_test.h5", 2);
  for (const char* m : {"identity", "frequency", "greedy", "rcm"})
    REQUIRE(run(std::string("-q solve --trace cli_prof.h5 --method ") + m + " --out cli_" + m + ".json") == 0);
  REQUIRE(run("-q solve --trace cli_prof.h5 --out cli_ls1.json --seed 3") == 0);
  REQUIRE(run("-q --threads 1 solve --trace cli_prof.h5 --out cli_ls2.json --seed 3") == 0);
  CHECK(read_file("cli_ls1.json") == read_file("cli_ls2.json"));
  auto lay = nlohmann::json::parse(read_file("cli_ls1.json"));
  CHECK(lay["method"] == "greedy+ls");
  CHECK(lay["trace"]["sha256"].get<std::string>().size() == 64);

  std::string out;
  std::string layouts =
      "--bundle-bytes 16384 --layout cli_identity.json --layout cli_greedy.json --layout cli_ls1.json --layout "
      "cli_rcm.json";
  REQUIRE(run("eval --trace cli_test.h5 " + layouts + " --gap 0 --cache-ratio 0", &out) == 0);
  CHECK(out.find("greedy+ls") != std::string::npos);
  REQUIRE(run("--json eval --trace cli_test.h5 " + layouts + " --gap auto --cache-ratio 0.05", &out) == 0);
  auto j = nlohmann::json::parse(out);
  REQUIRE(j["layouts"].size() == 4);
  CHECK(j["layouts"][0]["name"] == "identity");
  CHECK(j["layouts"][1]["io_vs_greedy"].get<double>() == doctest::Approx(1.0));
  double gr = j["layouts"][1]["reads"].get<double>(), id = j["layouts"][0]["reads"].get<double>();
  CHECK(gr < id);  // clustered structure: greedy beats the scattered original order

  CHECK(run("eval --trace cli_test.h5 " + layouts + " --require \"greedy.reads <= identity.reads\"") == 0);
  CHECK(run("eval --trace cli_test.h5 " + layouts + " --require \"identity.reads <= 0.5 * greedy.reads\"") ==
        kExitGate);
  CHECK(read_file("cli_err.txt").find("quality gate violated: identity.reads <= 0.5 * greedy.reads") !=
        std::string::npos);
  CHECK(run("eval --trace cli_test.h5 " + layouts + " --require \"identity.nope <= 1\"") == kExitUsage);
  // Issue 57: an unknown layout name failed only after the whole evaluation; now at once (no progress line on
  // stderr, just the error), naming the layouts there are.
  CHECK(run("eval --trace cli_test.h5 " + layouts + " --require \"grdy.reads <= identity.reads\"") == kExitUsage);
  const std::string err = read_file("cli_err.txt");
  CHECK(err.rfind("nl-layout: error: --require \"grdy.reads <= identity.reads\": no layout named 'grdy'", 0) == 0);
  CHECK(err.find("(the layouts: identity, greedy, ") != std::string::npos);
  CHECK(std::count(err.begin(), err.end(), '\n') == 1);
  CHECK(run("eval --trace cli_test.h5 " + layouts + " --require \"greedy.nope <= 1\"") == kExitUsage);
  const std::string err2 = read_file("cli_err.txt");
  CHECK(std::count(err2.begin(), err2.end(), '\n') == 1);
  CHECK(err2.find("unknown layout or metric 'greedy.nope'") != std::string::npos);
  // --bundle-for MODEL --dtype D: the bytes pack stores for that model (formats/core/image.h), priced by eval and
  // recorded by greedy+ls; the shape's FFN width must be the trace's.
  auto eval_bytes = [&](const std::string& opts) {
    REQUIRE(run("--json eval --trace cli_test.h5 --layout cli_identity.json " + opts, &out) == 0);
    return nlohmann::json::parse(out)["bundle_bytes"].get<uint64_t>();
  };
  CHECK(eval_bytes("--bundle-for 64x256xgated") == 3 * 64 * 2);  // f16 by default
  CHECK(eval_bytes("--bundle-for 64x256xgated --dtype q8_0") == 3 * 2 * 34);
  CHECK(eval_bytes("--bundle-for 128x256 --dtype q4_0") == 2 * 4 * 18);
  CHECK(eval_bytes("--bundle-for 64x256xgated --dtype f32") == 3 * 64 * 4);
  REQUIRE(run("-q solve --trace cli_prof.h5 --bundle-for 64x256xgated --dtype q8_0 --out cli_ls8.json") == 0);
  CHECK(nlohmann::json::parse(read_file("cli_ls8.json"))["parameters"]["bundle_bytes"] == 204);
  CHECK(run("eval --trace cli_test.h5 --layout cli_identity.json --bundle-for llama2-7b") == kExitUsage);
  CHECK(read_file("cli_err.txt")
            .find("--bundle-for llama2-7b has 11008 FFN neurons per layer, cli_test.h5 layer 0 "
                  "has 256") != std::string::npos);
  CHECK(run("-q solve --trace cli_prof.h5 --bundle-for 48x256 --dtype q4_0 --out cli_x.json") == kExitUsage);
  CHECK(read_file("cli_err.txt").find("dim 48 is not a multiple of 32") != std::string::npos);
  CHECK(run("eval --trace cli_test.h5 --layout cli_identity.json --bundle-for no-such-model") == kExitUsage);
  CHECK(run("eval --trace cli_test.h5 --layout cli_identity.json --bundle-for 64x256 --dtype q9") == kExitUsage);
  CHECK(run("eval --trace cli_test.h5 --layout cli_identity.json --dtype q8_0") == kExitUsage);  // needs --bundle-for
  CHECK(run("eval --trace cli_test.h5 --layout cli_identity.json --bundle-for 64x256 --bundle-bytes 9") == kExitUsage);
  struct stat st {};
  CHECK(::stat("cli_x.json", &st) != 0);  // nothing written on error

  // A layout for another trace shape is refused with the file named.
  write_file_atomic("cli_bad.json",
                    "{\"format\":\"neuralink-layout\",\"version\":1,\"method\":\"identity\",\"layers\":[]}");
  CHECK(run("eval --trace cli_test.h5 --layout cli_bad.json") == kExitInput);
  CHECK(read_file("cli_err.txt").find("cli_bad.json: has 0 layers") != std::string::npos);
}
