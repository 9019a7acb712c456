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

TEST_CASE("nl-layout graph --tokens/--slice/--sequences: slices of one trace + graph-merge = the whole trace") {
  // 3 layers, 1,000 tokens in 5 sequences; slice ends off word boundaries, and chunks smaller than a slice.
  std::vector<LayerMask> masks = {random_mask(70, 1000, 0.15, 11), random_mask(9, 1000, 0.5, 12),
                                  random_mask(40, 1000, 0.05, 13)};
  TraceWriterOptions wo;
  wo.model = "slice-model";
  wo.activation = "synthetic";
  for (auto& m : masks) wo.n_neurons.push_back(m.n_neurons);
  trace_write("cli_gs_trace.h5", wo, masks, {0, 130, 401, 640, 777});
  REQUIRE(run("graph --trace cli_gs_trace.h5 --out cli_gs_all.h5 --full --top-k 5 -q").code == 0);
  auto same = [](const std::string& a_path, const std::string& b_path) {
    GraphFileReader a(a_path), b(b_path);
    CHECK(a.info().n_tokens == b.info().n_tokens);
    CHECK(a.info().layers == b.info().layers);
    CHECK(a.info().trace.sha256 == b.info().trace.sha256);
    CHECK(a.info().trace.model == b.info().trace.model);
    CHECK(a.info().trace.has_range == b.info().trace.has_range);
    CHECK(a.info().trace.token_begin == b.info().trace.token_begin);
    CHECK(a.info().trace.token_end == b.info().trace.token_end);
    for (size_t i = 0; i < a.info().layers.size(); ++i) {
      LayerGraph x = a.read_layer(i), y = b.read_layer(i);
      CHECK(x.freq == y.freq);
      CHECK(x.upper == y.upper);
      CHECK(x.nbr == y.nbr);
      CHECK(x.nbr_cnt == y.nbr_cnt);
      CHECK(x.nbr_len == y.nbr_len);
    }
  };
  std::string sha;
  {
    GraphFileReader a("cli_gs_all.h5");
    sha = a.info().trace.sha256;
    CHECK(a.info().trace.sha256.size() == 64);
    CHECK(a.info().trace.model == "slice-model");
    CHECK(a.info().trace.has_range);
    CHECK(a.info().trace.token_end == 1000);
  }
  // Two token slices (333 is inside word 5), the second counted in chunks of 8 words.
  REQUIRE(run("graph --trace cli_gs_trace.h5 --out cli_gs_t0.h5 --full --top-k 5 --tokens 0:333 -q").code == 0);
  REQUIRE(run("graph --trace cli_gs_trace.h5 --out cli_gs_t1.h5 --full --top-k 5 --tokens 333: --chunk-mib 1 -q "
              "--trace-sha256 " +
              sha)
              .code == 0);  // the sha256 given instead of hashed (as a cluster task would)
  {
    GraphFileReader t0("cli_gs_t0.h5");
    CHECK(t0.info().n_tokens == 333);
    // The slice's counts are the library's counts of the sliced mask.
    CoactivationOptions o;
    o.top_k = 5;
    o.full_matrix = true;
    LayerGraph want = coactivation_count(slice(masks[0], 0, 333), o), got = t0.read_layer(0);
    CHECK(got.freq == want.freq);
    CHECK(got.upper == want.upper);
  }
  REQUIRE(run("graph-merge cli_gs_t1.h5 cli_gs_t0.h5 --out cli_gs_m2.h5 -q").code == 0);
  same("cli_gs_all.h5", "cli_gs_m2.h5");
  // Three slices by --slice I/N, and two by sequences (sequences 0-1 and 2-4).
  for (int i = 0; i < 3; ++i)
    REQUIRE(run("graph --trace cli_gs_trace.h5 --out cli_gs_s" + std::to_string(i) + ".h5 --full --top-k 5 --slice " +
                std::to_string(i) + "/3 -q")
                .code == 0);
  REQUIRE(run("graph-merge cli_gs_s0.h5 cli_gs_s1.h5 cli_gs_s2.h5 --out cli_gs_m3.h5 -q").code == 0);
  same("cli_gs_all.h5", "cli_gs_m3.h5");
  REQUIRE(run("graph --trace cli_gs_trace.h5 --out cli_gs_q0.h5 --full --top-k 5 --sequences 0:2 -q").code == 0);
  REQUIRE(run("graph --trace cli_gs_trace.h5 --out cli_gs_q1.h5 --full --top-k 5 --sequences 2: -q").code == 0);
  CHECK(GraphFileReader("cli_gs_q0.h5").info().n_tokens == 401);
  REQUIRE(run("graph-merge cli_gs_q0.h5 cli_gs_q1.h5 --out cli_gs_mq.h5 -q").code == 0);
  same("cli_gs_all.h5", "cli_gs_mq.h5");
  // Overlapping slices of one trace are refused (their shared tokens would count twice), naming the file.
  REQUIRE(run("graph --trace cli_gs_trace.h5 --out cli_gs_ov.h5 --full --top-k 5 --tokens 300:500 -q").code == 0);
  Run r = run("graph-merge cli_gs_t0.h5 cli_gs_ov.h5 --out cli_gs_bad.h5 -q");
  CHECK(r.code == 3);
  CHECK(r.err.find("slices overlap") != std::string::npos);
  CHECK(!std::ifstream("cli_gs_bad.h5").good());
  // Bad ranges: usage errors.
  CHECK(run("graph --trace cli_gs_trace.h5 --out cli_gs_bad.h5 --tokens 10:1001 -q").code == 2);
  CHECK(run("graph --trace cli_gs_trace.h5 --out cli_gs_bad.h5 --tokens 20:10 -q").code == 2);
  CHECK(run("graph --trace cli_gs_trace.h5 --out cli_gs_bad.h5 --slice 3/3 -q").code == 2);
  CHECK(run("graph --trace cli_gs_trace.h5 --out cli_gs_bad.h5 --trace-sha256 abc -q").code == 2);
  CHECK(run("graph --trace cli_gs_trace.h5 --out cli_gs_bad.h5 --tokens 0:5 --slice 0/2 -q").code == 2);
  for (auto p :
       {"cli_gs_trace.h5", "cli_gs_all.h5", "cli_gs_t0.h5", "cli_gs_t1.h5", "cli_gs_m2.h5", "cli_gs_s0.h5",
        "cli_gs_s1.h5", "cli_gs_s2.h5", "cli_gs_m3.h5", "cli_gs_q0.h5", "cli_gs_q1.h5", "cli_gs_mq.h5", "cli_gs_ov.h5"})
    std::remove(p);
}
