// Layout-free trace statistics (layout/trace_stats.h): known values on a hand-made trace, the streamed reader
// against the in-memory sums, and nl-layout eval printing them with the predicted order gain.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "formats/core/rng.h"
#include "formats/trace.h"
#include "layout/trace_stats.h"

namespace fs = std::filesystem;

namespace {

// 4 neurons × 8 tokens, two sequences (tokens 0–3 and 4–7); row v lists the tokens at which neuron v fires.
nl::LayerMask hand_mask() {
  nl::LayerMask m(4, 8);
  const std::vector<std::vector<uint64_t>> fires = {{0, 1, 4}, {0, 1, 7}, {2, 3, 4, 5}, {1, 2, 7}};
  for (uint32_t v = 0; v < 4; ++v)
    for (uint64_t t : fires[v]) m.set(v, t);
  return m;
}

const std::vector<int64_t> kSequences = {0, 4};

std::string slurp(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int run_layout(const std::string& args, std::string& out) {
  const std::string o = fs::absolute("trace_stats_tmp/stdout").string();
  const int rc = std::system((std::string(NL_BINARY_DIR) + "/cli/nl-layout " + args + " >" + o + " 2>" +
                              fs::absolute("trace_stats_tmp/stderr").string())
                                 .c_str());
  out = slurp(o);
  return WEXITSTATUS(rc);
}

}  // namespace

TEST_CASE("trace statistics: known values on a hand-made trace") {
  const nl::LayerMask m = hand_mask();
  const nl::TraceStructureSums s =
      nl::layer_structure_sums(m.bits.data(), m.n_neurons, m.n_tokens, m.words, kSequences);
  CHECK(s.slots == 32);
  CHECK(s.active == 13);
  // Runs of consecutive active indices per token: {0,1} {0,1|3} {2,3} {2} {0|2} {2} {} {1|3} = 1+2+1+1+2+1+0+2.
  CHECK(s.runs == 10);
  // Pairs (0,1) (1,2) (2,3) (4,5) (5,6) (6,7): overlaps 2+1+1+1+0+0 over sizes 2+3+2+2+1+0; token 3 → 4 crosses
  // the sequence boundary and does not count.
  CHECK(s.persist_pairs == 5);
  CHECK(s.persist_base == 10);
  const nl::TraceStructureStats st = nl::trace_structure_stats(s);
  CHECK(st.active_share == doctest::Approx(13.0 / 32));
  CHECK(st.persistence == doctest::Approx(0.5));
  CHECK(st.identity_run == doctest::Approx(1.3));
  // Top-2 co-firing counts over each neuron's count: n0 (2+1)/3, n1 (2+2)/3, n2 (1+1)/4, n3 (2+1)/3; the 256
  // activation-weighted systematic samples fall 59, 59, 79, 59 on them (counts 3, 3, 4, 3 of 13).
  const double kappa = (59 * 0.5 + 59 * (2.0 / 3) + 79 * 0.25 + 59 * 0.5) / 256;
  CHECK(s.cofire_samples == 256);
  CHECK(st.cofire == doctest::Approx(kappa));
  CHECK(st.headroom == doctest::Approx(1.0 / (1.0 - kappa) / 1.3));
  CHECK(st.cofire_tokens == 8);
  // M with a = 10 µs, B = 1,000 MB/s, 2,500 B bundles: r = 4, (4 / 1.3 + 1) / (4 (1 − κ) + 1).
  CHECK(nl::modelled_gain(st, 10, 1000, 2500) == doctest::Approx((4 / 1.3 + 1) / (4 * (1 - kappa) + 1)));
  CHECK(nl::modelled_gain(st, 10, 1000, 0) == 0);
  // Excess P(u | v) − P(u), top 2 (P(u) = 3/8, 3/8, 4/8, 3/8): n0 (7/24 − 1/24)/2, n1 (7/24 + 7/24)/2,
  // n2 (−3/24 − 3/24)/2, n3 (7/24 − 1/24)/2.
  const double excess = (59 * 0.125 + 59 * (7.0 / 24) + 79 * -0.125 + 59 * 0.125) / 256;
  CHECK(st.excess == doctest::Approx(excess));
}

TEST_CASE("trace statistics: the streamed trace reader pools layers like the in-memory sums") {
  fs::create_directories("trace_stats_tmp");
  const std::string path = fs::absolute("trace_stats_tmp/random.h5").string();
  // 5,000 tokens: two read chunks of 64 words with a carry word between them, κ on the first 2,048 tokens.
  const uint32_t n = 300;
  const uint64_t T = 5000;
  const std::vector<int64_t> seqs = {0, 700, 4095, 4096, 4160};
  std::vector<nl::LayerMask> masks;
  nl::SplitMix64 rng{7};
  for (int l = 0; l < 3; ++l) {
    nl::LayerMask m(n, T);
    for (uint32_t v = 0; v < n; ++v) {
      bool on = false;
      for (uint64_t t = 0; t < T; ++t) {
        // Sticky bits, so persistence is well away from the active share.
        if (rng.uniform() < 0.2) on = rng.uniform() < 0.05 + 0.1 * l;
        if (on) m.set(v, t);
      }
    }
    masks.push_back(std::move(m));
  }
  nl::TraceWriterOptions o;
  o.model = "test";
  o.activation = "synthetic";
  o.n_neurons.assign(3, n);
  nl::trace_write(path, o, masks, seqs);
  nl::TraceStructureSums pooled;
  for (const auto& m : masks) pooled.add(nl::layer_structure_sums(m.bits.data(), n, T, m.words, seqs));
  const nl::TraceStructureStats want = nl::trace_structure_stats(pooled);
  nl::TraceReader tr(path);
  const nl::TraceStructureStats got = nl::trace_structure_stats(tr);
  CHECK(got.active_share == doctest::Approx(want.active_share).epsilon(1e-12));
  CHECK(got.persistence == doctest::Approx(want.persistence).epsilon(1e-12));
  CHECK(got.identity_run == doctest::Approx(want.identity_run).epsilon(1e-12));
  CHECK(got.cofire == doctest::Approx(want.cofire).epsilon(1e-12));
  CHECK(got.excess == doctest::Approx(want.excess).epsilon(1e-12));
  CHECK(got.cofire_tokens == nl::kCofireTokens);
  CHECK(want.persistence > want.active_share + 0.3);
}

TEST_CASE("nl-layout eval prints the trace statistics and the predicted gain") {
  fs::create_directories("trace_stats_tmp");
  const std::string trace = fs::absolute("trace_stats_tmp/hand.h5").string();
  const std::string lay = fs::absolute("trace_stats_tmp/identity.json").string();
  nl::TraceWriterOptions o;
  o.model = "test";
  o.activation = "synthetic";
  o.n_neurons = {4};
  nl::trace_write(trace, o, {hand_mask()}, kSequences);
  std::string out;
  REQUIRE(run_layout("solve --trace " + trace + " --method identity --out " + lay + " -q", out) == 0);
  REQUIRE(run_layout("eval --trace " + trace + " --layout " + lay + " -q", out) == 0);
  INFO(out);
  CHECK(out.find("trace structure: active 40.6") != std::string::npos);
  CHECK(out.find("persistence 50.0 %, identity run 1.300, top-2 co-firing 0.461") != std::string::npos);
  CHECK(out.find("modelled gain M ") != std::string::npos);
  CHECK(out.find("predicted I/O gain over identity with a good cache (fit on a synthetic structure sweep") !=
        std::string::npos);
  // The runtime's planner and cache defaults: no mismatch warning; the 64 B default bundle of a 4-neuron layer is
  // far outside the sweep's read-cost range, a 16 KiB one inside it.
  CHECK(out.find("not these settings") == std::string::npos);
  CHECK(out.find("(extrapolated: a read's fixed cost is worth") != std::string::npos);
  REQUIRE(run_layout("eval --trace " + trace + " --layout " + lay + " --bundle-bytes 16384 -q", out) == 0);
  CHECK(out.find("predicted I/O gain over identity") != std::string::npos);
  CHECK(out.find("extrapolated") == std::string::npos);
  REQUIRE(run_layout("eval --trace " + trace + " --layout " + lay + " --cache-ratio 0.1 --json -q", out) == 0);
  const auto j = nlohmann::json::parse(out);
  const auto& ts = j["trace_structure"];
  CHECK(ts["persistence"].get<double>() == doctest::Approx(0.5));
  CHECK(ts["identity_run"].get<double>() == doctest::Approx(1.3));
  CHECK(ts["modelled_gain"].get<double>() > 1);
  CHECK(ts["predicted_gain_over_identity"]["synthetic_fit"] == true);
  CHECK(ts["predicted_gain_over_identity"]["fit_conditions"] == false);
  CHECK(ts["predicted_gain_over_identity"]["in_fit_range"] == false);
  const auto& g = ts["predicted_gain_over_identity"]["greedy+ls"];
  REQUIRE(g.size() == 3);
  CHECK(g[0].get<double>() > 0);
  CHECK(g[0].get<double>() <= g[1].get<double>());
  CHECK(g[1].get<double>() <= g[2].get<double>());
}
