// nl-profile synth (profiler/synth.h): density, persistence, power-law skew, determinism, trace shape and
// sequences, and preset validation.
#include <doctest/doctest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <sstream>
#include <string>

#include "formats/core/error.h"
#include "formats/trace.h"
#include "profiler/synth.h"

using namespace nl;

namespace {

SynthPreset small_preset() {
  SynthPreset p;
  p.name = "small";
  p.model = "test";
  p.neurons = 1500;
  p.layers = 2;
  p.layers_full = 4;
  p.tokens_per_sequence = 64;
  p.profile_sequences = 40;
  p.test_sequences = 10;
  p.active_fraction = 0.08;
  p.zipf_exponent = 1.0;
  p.max_group_rate = 0.9;
  p.background_share = 0.1;
  p.group_count = 100;
  p.groups_per_neuron = 2;
  p.fire_probability = 0.9;
  p.density_swing = 1.0;
  p.stay_global = 0.9;
  p.stay_group = 0.85;
  p.stay_neuron = 0.85;
  return p;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string write_file(const std::string& name, const std::string& text) {
  std::ofstream(name) << text;
  return name;
}

SynthLayerStats pooled(const SynthStats& s) {
  SynthLayerStats a;
  for (const auto& x : s.layers) {
    a.tokens += x.tokens;
    a.active += x.active;
    a.persist_pairs += x.persist_pairs;
    a.persist_base += x.persist_base;
    a.reads_identity += x.reads_identity;
  }
  return a;
}

}  // namespace

TEST_CASE("normal_quantile inverts the normal CDF") {
  for (double p : {1e-9, 1e-4, 0.02, 0.2, 0.5, 0.77, 0.99, 1 - 1e-7}) {
    double x = normal_quantile(p);
    CHECK(0.5 * std::erfc(-x / std::sqrt(2.0)) == doctest::Approx(p).epsilon(1e-9));
  }
  CHECK(normal_quantile(0.5) == doctest::Approx(0.0));
}

TEST_CASE("structure: expected frequencies average to the target and follow the groups' power law") {
  SynthPreset p = small_preset();
  SynthStructure st = synth_structure(p, 1, 0);
  REQUIRE(st.expected_frequency.size() == p.neurons);
  REQUIRE(st.groups.size() == size_t(p.neurons) * p.groups_per_neuron);
  const std::vector<double>& f = st.expected_frequency;
  CHECK(std::accumulate(f.begin(), f.end(), 0.0) / p.neurons == doctest::Approx(p.active_fraction).epsilon(1e-6));
  for (double q : st.group_rate) CHECK(q <= p.max_group_rate);
  // Overlapping memberships: each neuron's groups are distinct.
  for (uint32_t v = 0; v < p.neurons; ++v) CHECK(st.groups[2 * v] != st.groups[2 * v + 1]);
  // Skew: the hottest 5 % of neurons carry a large share of all activations, unlike a uniform model.
  std::vector<double> sorted = f;
  std::sort(sorted.rbegin(), sorted.rend());
  const double top = std::accumulate(sorted.begin(), sorted.begin() + p.neurons / 20, 0.0);
  CHECK(top / std::accumulate(f.begin(), f.end(), 0.0) > 0.2);
  // Same seed and layer -> same structure; another layer -> another structure.
  CHECK(synth_structure(p, 1, 0).groups == st.groups);
  CHECK(synth_structure(p, 1, 1).groups != st.groups);
}

TEST_CASE("background-only neurons: active fraction and persistence match the closed form") {
  // With no groups every neuron is one sticky Bernoulli(b) bit, b = active_fraction: a neuron active at t is
  // active at t+1 with probability stay + (1 − stay)·b.
  SynthPreset p = small_preset();
  p.groups_per_neuron = 0;
  p.background_share = 1.0;
  p.stay_neuron = 0.8;
  p.profile_sequences = 60;
  const double expect_persist = p.stay_neuron + (1 - p.stay_neuron) * p.active_fraction;
  SynthRun run;
  run.seed = 7;
  SynthStats s = synth_write(p, run, "synth_indep.h5");
  SynthLayerStats a = pooled(s);
  CHECK(a.active_fraction(p.neurons) == doctest::Approx(p.active_fraction).epsilon(0.03));
  CHECK(a.persistence() == doctest::Approx(expect_persist).epsilon(0.01));
  // Independent neurons in random index order: P(index neighbour active | active) = the active fraction.
  CHECK(a.read_length_identity() == doctest::Approx(1 / (1 - p.active_fraction)).epsilon(0.01));
  std::remove("synth_indep.h5");
}

TEST_CASE("correlated model: density on target, persistence above the no-change bound, hot neurons scattered") {
  SynthPreset p = small_preset();
  SynthRun run;
  run.seed = 3;
  SynthStats s = synth_write(p, run, "synth_corr.h5");
  SynthLayerStats a = pooled(s);
  CHECK(a.active_fraction(p.neurons) == doctest::Approx(p.active_fraction).epsilon(0.15));
  // A neuron fired by a group stays active when neither the group's bit nor its gate is redrawn.
  CHECK(a.persistence() > p.stay_group * p.stay_neuron);
  CHECK(a.persistence() < 1.0);
  for (uint32_t l = 0; l < p.layers; ++l) {
    // Measured frequencies follow the model's expectation: the hottest neuron near the expected maximum,
    // the median one far below the mean (power law), and a small mean absolute error overall.
    const std::vector<double> expect = synth_structure(p, run.seed, l).expected_frequency;
    std::vector<uint64_t> c = s.counts[l];
    std::sort(c.rbegin(), c.rend());
    const double tokens = double(s.layers[l].tokens);
    CHECK(c[0] / tokens > 0.8 * *std::max_element(expect.begin(), expect.end()));
    CHECK(c[p.neurons / 2] / tokens < p.active_fraction);
    double err = 0;
    for (uint32_t v = 0; v < p.neurons; ++v) err += std::abs(s.counts[l][v] / tokens - expect[v]);
    CHECK(err / p.neurons < 0.25 * p.active_fraction);
    // Scattered: the 50 hottest neurons are spread over the index range, not packed at one end.
    std::vector<uint32_t> order = synth_frequency_order(s.counts[l]);
    std::vector<uint32_t> hot(order.begin(), order.begin() + 50);
    std::sort(hot.begin(), hot.end());
    CHECK(hot.back() - hot.front() > p.neurons / 2);
  }
  std::remove("synth_corr.h5");
}

TEST_CASE("groups create co-activation: frequency order beats identity, test split shares the structure") {
  SynthPreset p = small_preset();
  SynthRun run;
  run.seed = 11;
  SynthStats prof = synth_write(p, run, "synth_prof.h5");
  run.split = SynthSplit::Test;
  for (const auto& c : prof.counts) run.frequency_order.push_back(synth_frequency_order(c));
  SynthStats test = synth_write(p, run, "synth_test.h5");
  for (uint32_t l = 0; l < p.layers; ++l) {
    CHECK(test.layers[l].read_length_frequency() > test.layers[l].read_length_identity() * 1.2);
    // Same latent structure: per-neuron frequencies of the two splits agree (rank correlation proxy: the
    // profile split's 30 hottest neurons are all hotter than the median in the test split).
    std::vector<uint64_t> sorted = test.counts[l];
    std::sort(sorted.begin(), sorted.end());
    const uint64_t median = sorted[p.neurons / 2];
    for (uint32_t i = 0; i < 30; ++i) CHECK(test.counts[l][run.frequency_order[l][i]] > median);
  }
  // Different sequences: the two splits' files differ although their structure is the same.
  CHECK(slurp("synth_prof.h5") != slurp("synth_test.h5"));
  std::remove("synth_prof.h5");
  std::remove("synth_test.h5");
}

TEST_CASE("trace shape, sequences and counts read back through the trace reader") {
  SynthPreset p = small_preset();
  p.tokens_per_sequence = 700;  // longer than one generation block (512): blocks must join seamlessly
  p.profile_sequences = 3;
  SynthRun run;
  run.seed = 5;
  SynthStats s = synth_write(p, run, "synth_shape.h5");
  TraceReader r("synth_shape.h5");
  const TraceInfo& ti = r.info();
  CHECK(ti.n_layers == p.layers);
  CHECK(ti.n_tokens == uint64_t(p.tokens_per_sequence) * p.profile_sequences);
  CHECK(ti.model == "synthetic:small");
  CHECK(ti.sequences == std::vector<int64_t>{0, 700, 1400});
  CHECK(ti.tokens.empty());
  for (uint32_t l = 0; l < p.layers; ++l) {
    CHECK(ti.n_neurons[l] == p.neurons);
    LayerMask m = r.read_layer(l);
    for (uint32_t n = 0; n < p.neurons; ++n) REQUIRE(m.count(n) == s.counts[l][n]);
    // Persistence recomputed from the file, never across a sequence boundary.
    uint64_t pairs = 0, base = 0;
    for (uint64_t t = 0; t + 1 < ti.n_tokens; ++t) {
      if ((t + 1) % p.tokens_per_sequence == 0) continue;
      for (uint32_t n = 0; n < p.neurons; ++n)
        if (m.test(n, t)) {
          ++base;
          pairs += m.test(n, t + 1);
        }
    }
    CHECK(pairs == s.layers[l].persist_pairs);
    CHECK(base == s.layers[l].persist_base);
  }
  std::remove("synth_shape.h5");
}

TEST_CASE("deterministic: same seed -> byte-identical files, whatever the thread count") {
  SynthPreset p = small_preset();
  p.layers = 3;
  p.profile_sequences = 6;
  SynthRun run;
  run.seed = 42;
  omp_set_num_threads(1);
  synth_write(p, run, "synth_a.h5");
  omp_set_num_threads(3);
  synth_write(p, run, "synth_b.h5");
  run.seed = 43;
  synth_write(p, run, "synth_c.h5");
  const std::string a = slurp("synth_a.h5");
  CHECK(!a.empty());
  CHECK(a == slurp("synth_b.h5"));
  CHECK(a != slurp("synth_c.h5"));
  for (const char* f : {"synth_a.h5", "synth_b.h5", "synth_c.h5"}) std::remove(f);
}

TEST_CASE("shipped presets load and hit their density and the literature's persistence on one layer") {
  for (const std::string name : {"opt-350m", "opt-6.7b", "llama2-7b-prosparse", "mistral-7b-turbosparse"}) {
    CAPTURE(name);
    const std::string path = std::string(NL_SOURCE_DIR) + "/configs/workloads/" + name + ".json";
    SynthPreset p = synth_preset_load(path);
    CHECK(p.name == name);
    CHECK(p.layers_full >= p.layers);
    p.layers = 1;
    p.profile_sequences = 12;
    SynthRun run;
    SynthStats s = synth_write(p, run, "synth_preset.h5");
    const SynthLayerStats& x = s.layers[0];
    CHECK(x.active_fraction(p.neurons) == doctest::Approx(p.active_fraction).epsilon(0.2));
    // The literature's 82-85 %, with room for sampling noise and for the dense presets, whose always-on
    // head keeps persistence higher (docs/workloads.md).
    CHECK(x.persistence() >= 0.80);
    CHECK(x.persistence() <= 0.92);
  }
  std::remove("synth_preset.h5");
}

TEST_CASE("bad presets are rejected with one clear message naming the file and the key") {
  const std::string good = R"({"format": "neuralink-workload", "version": 1, "name": "x", "model": "m",
    "shape": {"neurons": 64, "layers": 1, "layers_full": 2, "tokens_per_sequence": 8, "profile_sequences": 2,
              "test_sequences": 1},
    "activity": {"active_fraction": 0.1, "zipf_exponent": 1.0, "max_group_rate": 0.9, "background_share": 0.1},
    "groups": {"count": 8, "per_neuron": 2, "fire_probability": 0.9},
    "global": {"density_swing": 1.0},
    "stay": {"global": 0.9, "group": 0.8, "neuron": 0.8}})";
  CHECK(synth_preset_load(write_file("preset_good.json", good)).neurons == 64);
  struct Case {
    std::string from, to, message;
  };
  const Case cases[] = {
      {"\"version\": 1", "\"version\": 2", "unsupported workload preset version"},
      {"neuralink-workload", "neuralink-trace", "format must be"},
      {"\"neurons\": 64, ", "", "missing key 'shape.neurons'"},
      {"\"neurons\": 64", "\"neurons\": -4", "'shape.neurons' must be a non-negative integer"},
      {"\"neurons\": 64", "\"neurons\": 1", "shape.neurons must be in"},
      {"\"active_fraction\": 0.1", "\"active_fraction\": 1.5", "activity.active_fraction must be in (0, 1)"},
      {"\"active_fraction\": 0.1", "\"active_fraction\": \"0.1\"", "'activity.active_fraction' must be a number"},
      {"\"max_group_rate\": 0.9", "\"max_group_rate\": 1.0", "activity.max_group_rate must be in (0, 1)"},
      {"\"per_neuron\": 2", "\"per_neuron\": 9", "groups.per_neuron must not exceed groups.count"},
      {"\"fire_probability\": 0.9", "\"fire_probability\": 0", "groups.fire_probability must be in (0, 1]"},
      {"\"background_share\": 0.1", "\"background_share\": 1.5", "activity.background_share must be in [0, 1]"},
      {"\"group\": 0.8", "\"group\": 1.2", "stay.global, stay.group and stay.neuron must be in [0, 1]"},
      {"\"density_swing\": 1.0", "\"density_swing\": 1.0, \"sigma\": 2", "unknown key 'global.sigma'"},
      {"\"global\": {\"density_swing\": 1.0},", "", "missing key 'global'"},
      {"\"format\"", "\"globl\": 1, \"format\"", "unknown key 'globl'"},
      {"\"fire_probability\": 0.9", "\"fire_probability\": 0.9, \"size\": 3", "unknown key 'groups.size'"},
      {"\"active_fraction\": 0.1", "\"active_fraction\": 0.95", "unreachable"},
      {"\"stay\": {", "\"stay\": [", "not valid JSON"},
      {"\"tokens_per_sequence\": 8", "\"tokens_per_sequence\": 1", "tokens_per_sequence must be at least 2"},
  };
  for (const Case& c : cases) {
    std::string text = good;
    const size_t at = text.find(c.from);
    REQUIRE(at != std::string::npos);
    text.replace(at, c.from.size(), c.to);
    const std::string path = write_file("preset_bad.json", text);
    CAPTURE(c.message);
    try {
      synth_preset_load(path);
      FAIL("accepted a bad preset");
    } catch (const InputError& e) {
      const std::string m = e.what();
      CHECK(m.rfind(path + ": ", 0) == 0);
      CHECK(m.find(c.message) != std::string::npos);
      CHECK(m.find('\n') == std::string::npos);
    }
  }
  CHECK_THROWS_AS(synth_preset_load("no_such_preset.json"), IoError);
  std::remove("preset_good.json");
  std::remove("preset_bad.json");
}
