// nl-layout graph / graph-merge end to end: the binary's output equals the library's counts, shard merge through
// the CLI equals one run, and bad inputs exit non-zero with one line naming the file.
#include <doctest/doctest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <string>

#include "formats/trace.h"
#include "graph/coactivation.h"
#include "graph/graph_file.h"

using namespace nl;

namespace {

const std::string kBin = std::string(NL_BINARY_DIR) + "/cli/nl-layout";

struct Run {
  int code;
  std::string err;
};

Run run(const std::string& args) {
  std::string cmd = kBin + " " + args + " >cli_graph_out.txt 2>cli_graph_err.txt";
  int st = std::system(cmd.c_str());
  std::ifstream e("cli_graph_err.txt");
  std::stringstream ss;
  ss << e.rdbuf();
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, ss.str()};
}

LayerMask random_mask(uint32_t n, uint64_t tokens, double p, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::bernoulli_distribution on(p);
  LayerMask m(n, tokens);
  for (uint32_t i = 0; i < n; ++i)
    for (uint64_t t = 0; t < tokens; ++t)
      if (on(rng)) m.set(i, t);
  return m;
}

LayerMask slice(const LayerMask& m, uint64_t t0, uint64_t t1) {
  LayerMask s(m.n_neurons, t1 - t0);
  for (uint32_t i = 0; i < m.n_neurons; ++i)
    for (uint64_t t = t0; t < t1; ++t)
      if (m.test(i, t)) s.set(i, t - t0);
  return s;
}

void write_trace(const std::string& path, const std::vector<LayerMask>& masks) {
  TraceWriterOptions wo;
  wo.model = "m";
  wo.activation = "synthetic";
  for (auto& m : masks) wo.n_neurons.push_back(m.n_neurons);
  trace_write(path, wo, masks, {0});
}

}  // namespace

TEST_CASE("nl-layout graph writes the library's counts; graph-merge of shards equals one run") {
  std::vector<LayerMask> masks = {random_mask(50, 900, 0.2, 1), random_mask(20, 900, 0.4, 2),
                                  random_mask(33, 900, 0.1, 3)};
  write_trace("cli_g_trace.h5", masks);
  REQUIRE(run("graph --trace cli_g_trace.h5 --out cli_g.h5 --top-k 7 --layers 0,2 -q").code == 0);
  {
    GraphFileReader r("cli_g.h5");
    CHECK(r.info().layers == std::vector<uint32_t>{0, 2});
    CHECK(!r.info().full);
    CoactivationOptions o;
    o.top_k = 7;
    LayerGraph want = coactivation_count(masks[2], o), got = r.read_layer(1);
    CHECK(got.freq == want.freq);
    CHECK(got.nbr == want.nbr);
    CHECK(got.nbr_cnt == want.nbr_cnt);
  }
  // Shards through the CLI, then merge.
  write_trace("cli_g_s0.h5", {slice(masks[0], 0, 400), slice(masks[1], 0, 400), slice(masks[2], 0, 400)});
  write_trace("cli_g_s1.h5", {slice(masks[0], 400, 900), slice(masks[1], 400, 900), slice(masks[2], 400, 900)});
  REQUIRE(run("graph --trace cli_g_s0.h5 --out cli_g_p0.h5 --full --chunk-mib 1 -q").code == 0);
  REQUIRE(run("graph --trace cli_g_s1.h5 --out cli_g_p1.h5 --full --kernel scalar --method dense -q").code == 0);
  REQUIRE(run("graph --trace cli_g_trace.h5 --out cli_g_all.h5 --full -q").code == 0);
  REQUIRE(run("graph-merge cli_g_p0.h5 cli_g_p1.h5 --out cli_g_m.h5 -q").code == 0);
  {
    GraphFileReader a("cli_g_all.h5"), m("cli_g_m.h5");
    CHECK(m.info().n_tokens == 900);
    for (size_t i = 0; i < 3; ++i) {
      LayerGraph x = a.read_layer(i), y = m.read_layer(i);
      CHECK(x.freq == y.freq);
      CHECK(x.upper == y.upper);
      CHECK(x.nbr == y.nbr);
      CHECK(x.nbr_cnt == y.nbr_cnt);
      CHECK(x.nbr_len == y.nbr_len);
    }
  }
  // Refusals: top-k-only input (exit 3, names the file), bad --layers (exit 2), a malformed trace (exit 3).
  Run r = run("graph-merge cli_g_p0.h5 cli_g.h5 --out cli_g_bad.h5 -q");
  CHECK(r.code == 3);
  CHECK(r.err.find("cli_g.h5: stores top-k lists only") != std::string::npos);
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  CHECK(!std::ifstream("cli_g_bad.h5").good());
  r = run("graph --trace cli_g_trace.h5 --out cli_g_bad.h5 --layers 5");
  CHECK(r.code == 2);
  CHECK(r.err.find("out of range") != std::string::npos);
  r = run("graph --trace cli_g_trace.h5 --out cli_g_bad.h5 --layers x-");
  CHECK(r.code == 2);
  std::ofstream("cli_g_text.h5") << "not a trace";
  r = run("graph --trace cli_g_text.h5 --out cli_g_bad.h5");
  CHECK(r.code == 3);
  CHECK(r.err.find("cli_g_text.h5: not an HDF5 file") != std::string::npos);
  r = run("graph --trace cli_g_trace.h5 --out cli_g_bad.h5 --kernel sse9");
  CHECK(r.code == 2);
  // --json prints figures.
  REQUIRE(run("graph --trace cli_g_trace.h5 --out cli_g.h5 --layers 1 --json -q").code == 0);
  std::ifstream o("cli_graph_out.txt");
  std::stringstream ss;
  ss << o.rdbuf();
  CHECK(ss.str().find("\"seconds\"") != std::string::npos);
  for (auto p : {"cli_g_trace.h5", "cli_g.h5", "cli_g_s0.h5", "cli_g_s1.h5", "cli_g_p0.h5", "cli_g_p1.h5",
                 "cli_g_all.h5", "cli_g_m.h5", "cli_g_text.h5", "cli_graph_out.txt", "cli_graph_err.txt"})
    std::remove(p);
}
