// nl-layout solve --graph: solving from a graph file's counts (whole trace, or slices + graph-merge) writes the
// layout solve --trace writes (greedy byte for byte; greedy+ls too when its token sample is the whole trace), and
// refuses graphs that lack what the method needs with one line and the documented exit code.
#include <doctest/doctest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "formats/core/atomic_file.h"
#include "formats/trace.h"
#include "layout/synthetic.h"

using namespace nl;
namespace fs = std::filesystem;

namespace {

int run(const std::string& args) {
  std::string cmd = std::string(NL_BINARY_DIR) + "/cli/nl-layout -q " + args + " > sg_out.txt 2> sg_err.txt";
  int st = std::system(cmd.c_str());
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

// Two clustered layers (co-activation structure for greedy to find), 1,500 tokens in 3 sequences.
void write_trace(const std::string& path, uint32_t n0, uint32_t n1) {
  std::vector<LayerMask> masks;
  uint32_t l = 0;
  for (uint32_t n : {n0, n1}) {
    ClusteredTraceSpec s;
    s.n_neurons = n;
    s.n_tokens = 1500;
    s.cluster_size = 10;
    s.cluster_rate = 0.06;
    s.seed = 40 + l++;
    masks.push_back(clustered_mask(s));
  }
  TraceWriterOptions o;
  o.model = "clustered";
  o.activation = "synthetic:clustered";
  o.n_neurons = {n0, n1};
  trace_write(path, o, masks, {0, 500, 1100});
}

}  // namespace

TEST_CASE("solve --graph equals solve --trace") {
  fs::remove_all("sg_tmp");
  fs::create_directories("sg_tmp");
  write_trace("sg_tmp/t.h5", 300, 200);
  const std::string t = " --trace sg_tmp/t.h5";
  // The whole trace counted once, and in two slices merged.
  REQUIRE(run("graph" + t + " --out sg_tmp/all.h5 --full") == 0);
  REQUIRE(run("graph" + t + " --out sg_tmp/s0.h5 --full --tokens 0:777") == 0);
  REQUIRE(run("graph" + t + " --out sg_tmp/s1.h5 --full --tokens 777:") == 0);
  REQUIRE(run("graph-merge sg_tmp/s0.h5 sg_tmp/s1.h5 --out sg_tmp/merged.h5") == 0);
  for (const char* method : {"greedy", "frequency", "rcm", "identity"}) {
    INFO(method);
    const std::string m = std::string(" --method ") + method;
    REQUIRE(run("solve" + t + m + " --out sg_tmp/from_trace.json") == 0);
    REQUIRE(run("solve --graph sg_tmp/all.h5" + m + " --out sg_tmp/from_graph.json") == 0);
    REQUIRE(run("solve --graph sg_tmp/merged.h5" + m + " --out sg_tmp/from_merged.json") == 0);
    const std::string want = read_file("sg_tmp/from_trace.json");
    CHECK(want.find("\"sha256\":\"\"") == std::string::npos);  // the layout names the counted trace
    CHECK(read_file("sg_tmp/from_graph.json") == want);
    CHECK(read_file("sg_tmp/from_merged.json") == want);
  }
  // Layer groups counted (and merged) separately: one file per group.
  REQUIRE(run("graph" + t + " --out sg_tmp/g0.h5 --full --layers 0") == 0);
  REQUIRE(run("graph" + t + " --out sg_tmp/g1.h5 --full --layers 1") == 0);
  REQUIRE(run("solve --graph sg_tmp/g1.h5 sg_tmp/g0.h5 --method greedy --out sg_tmp/groups.json") == 0);
  REQUIRE(run("solve" + t + " --method greedy --out sg_tmp/from_trace.json") == 0);
  CHECK(read_file("sg_tmp/groups.json") == read_file("sg_tmp/from_trace.json"));
  // greedy+ls: the search, guard and cache variants run on the --trace sample; with the whole trace as the sample
  // the layout is the same as solve --trace's.
  // (--validation-share 0: solve --graph makes no validation split, its counts hold every token.)
  REQUIRE(run("solve" + t + " --method greedy+ls --validation-share 0 --out sg_tmp/ls_trace.json") == 0);
  REQUIRE(run("solve --graph sg_tmp/merged.h5" + t + " --method greedy+ls --out sg_tmp/ls_graph.json") == 0);
  CHECK(read_file("sg_tmp/ls_graph.json") == read_file("sg_tmp/ls_trace.json"));
  // Top-k lists only (--full-matrix-mib 0): greedy over the lists; fragments join on the sample's tokens.
  REQUIRE(run("graph" + t + " --out sg_tmp/topk.h5 --top-k 300") == 0);
  REQUIRE(run("solve" + t + " --method greedy --full-matrix-mib 0 --out sg_tmp/k_trace.json") == 0);
  REQUIRE(run("solve --graph sg_tmp/topk.h5" + t + " --method greedy --full-matrix-mib 0 --out sg_tmp/k_graph.json") ==
          0);
  CHECK(read_file("sg_tmp/k_graph.json") == read_file("sg_tmp/k_trace.json"));
  // Without a sample it still solves (fragments joined in index order), a valid permutation of every layer.
  REQUIRE(run("solve --graph sg_tmp/topk.h5 --method greedy --full-matrix-mib 0 --out sg_tmp/k_nosample.json") == 0);
  CHECK(read_file("sg_tmp/k_nosample.json").find("\"n_neurons\": 200") != std::string::npos);

  // Refusals: one line, exit code, no output.
  auto refused = [](const std::string& args, int code, const std::string& what) {
    CHECK(run(args + " --out sg_tmp/bad.json") == code);
    const std::string err = read_file("sg_err.txt");
    CHECK(err.find(what) != std::string::npos);
    CHECK(std::count(err.begin(), err.end(), '\n') == 1);
    CHECK(!fs::exists("sg_tmp/bad.json"));
  };
  refused("solve --graph sg_tmp/all.h5 --method greedy+ls", 2, "needs --trace SAMPLE.h5");
  refused("solve --graph sg_tmp/topk.h5 --method greedy", 2, "stores top-k lists only");
  refused("solve --graph sg_tmp/topk.h5 --method greedy --full-matrix-mib 0 --top-k 400" + t, 2, "fewer than");
  refused("solve --method greedy", 2, "--trace or --graph");
  write_trace("sg_tmp/other.h5", 300, 201);
  refused("solve --graph sg_tmp/all.h5 --trace sg_tmp/other.h5 --method greedy", 3, "sg_tmp/other.h5: layer 1 has 201");
  REQUIRE(run("graph" + t + " --out sg_tmp/layer1.h5 --full --layers 1") == 0);
  refused("solve --graph sg_tmp/layer1.h5 --method greedy", 3, "sg_tmp/layer1.h5: no graph file holds layer 0");
  refused("solve --graph sg_tmp/all.h5 sg_tmp/layer1.h5 --method greedy", 3, "sg_tmp/layer1.h5: holds layer 1, as");
  refused("solve --graph sg_tmp/s0.h5 sg_tmp/layer1.h5 --method greedy", 3, "sg_tmp/layer1.h5: counts other tokens");
  fs::remove_all("sg_tmp");
}
