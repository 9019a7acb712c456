// nl-profile synth: write paper-shaped synthetic traces (a profile split and a held-out test split of the same
// latent structure) from a workload preset, and optionally print what they measure.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "formats/core/atomic_file.h"
#include "formats/core/error.h"
#include "formats/core/progress.h"
#include "formats/trace.h"
#include "profiler/synth.h"

namespace nl::cli {
namespace {

struct SynthOptions {
  std::string preset, profile_out, test_out;
  uint64_t seed = 1;
  bool full_depth = false, stats = false;
  // Shape overrides (0 / negative = the preset's value).
  uint32_t layers = 0, neurons = 0, tokens_per_sequence = 0, profile_sequences = 0, test_sequences = 0;
  double active_fraction = -1;
  // Structure overrides (negative / 0 = the preset's value): the knobs bench/structure_sweep.py sweeps.
  double fire_probability = -1, background_share = -1, stay_group = -1, stay_neuron = -1, stay_global = -1;
  double zipf_exponent = -1, density_swing = -1;
  uint32_t group_count = 0, groups_per_neuron = 0;
};

void add_input_options(CLI::App* c, SynthOptions& o) {
  c->add_option("--preset", o.preset, "Workload preset (configs/workloads/*.json)")
      ->required()
      ->check(CLI::ExistingFile)
      ->group("Input");
  c->add_option("--seed", o.seed, "Seed: the same preset, seed and shape give byte-identical traces")->group("Input");
}

void add_output_options(CLI::App* c, SynthOptions& o) {
  c->add_option("--profile-out", o.profile_out, "Profile trace to write (HDF5, trace v1)")->required()->group("Output");
  c->add_option("--test-out", o.test_out, "Held-out test trace to write: same structure, other sequences")
      ->group("Output");
  c->add_flag("--stats", o.stats,
              "Print active fraction, persistence and identity/frequency read lengths per split (--json for JSON)")
      ->group("Output");
}

void add_shape_options(CLI::App* c, SynthOptions& o) {
  c->add_option("--layers", o.layers, "Layers to generate (default: the preset's few)")
      ->check(CLI::Range(1, 1024))
      ->group("Shape");
  c->add_flag("--full-depth", o.full_depth, "Generate the real model's layer count (shape.layers_full)")
      ->group("Shape");
  c->add_option("--neurons", o.neurons, "FFN neurons per layer")->check(CLI::Range(2, 1 << 24))->group("Shape");
  c->add_option("--active-fraction", o.active_fraction, "Target mean active fraction")
      ->check(CLI::Range(1e-6, 0.999))
      ->group("Shape");
  c->add_option("--tokens-per-sequence", o.tokens_per_sequence, "Tokens per sequence")
      ->check(CLI::Range(2, 1 << 30))
      ->group("Shape");
  c->add_option("--profile-sequences", o.profile_sequences, "Sequences in the profile split")
      ->check(CLI::Range(1, 1 << 30))
      ->group("Shape");
  c->add_option("--test-sequences", o.test_sequences, "Sequences in the test split")
      ->check(CLI::Range(1, 1 << 30))
      ->group("Shape");
}

void add_structure_options(CLI::App* c, SynthOptions& o) {
  c->add_option("--fire-probability", o.fire_probability, "P(a member fires | its group is on): group strength")
      ->check(CLI::Range(1e-6, 1.0))
      ->group("Structure");
  c->add_option("--background-share", o.background_share,
                "Share of the active fraction fired by unstructured background bits")
      ->check(CLI::Range(0.0, 1.0))
      ->group("Structure");
  c->add_option("--stay-group", o.stay_group, "Probability a group's on/off bit persists to the next token")
      ->check(CLI::Range(0.0, 1.0))
      ->group("Structure");
  c->add_option("--stay-neuron", o.stay_neuron, "Probability a neuron's gate and background bits persist")
      ->check(CLI::Range(0.0, 1.0))
      ->group("Structure");
  c->add_option("--stay-global", o.stay_global, "Probability the global density factor persists")
      ->check(CLI::Range(0.0, 1.0))
      ->group("Structure");
  c->add_option("--zipf-exponent", o.zipf_exponent, "Group popularity skew (rate ∝ rank^-zipf)")
      ->check(CLI::Range(0.0, 8.0))
      ->group("Structure");
  c->add_option("--density-swing", o.density_swing, "σ of the global factor's shift of group log-odds")
      ->check(CLI::Range(0.0, 4.0))
      ->group("Structure");
  c->add_option("--group-count", o.group_count, "Latent groups per layer")
      ->check(CLI::Range(1, 1 << 24))
      ->group("Structure");
  c->add_option("--groups-per-neuron", o.groups_per_neuron, "Groups each neuron belongs to")
      ->check(CLI::Range(1, 64))
      ->group("Structure");
}

nlohmann::json stats_json(const SynthPreset& p, const SynthStats& s, bool with_frequency) {
  SynthLayerStats all;
  nlohmann::json layers = nlohmann::json::array();
  for (size_t l = 0; l < s.layers.size(); ++l) {
    const SynthLayerStats& x = s.layers[l];
    nlohmann::json j = {{"layer", l},
                        {"active_fraction", x.active_fraction(p.neurons)},
                        {"persistence", x.persistence()},
                        {"read_length_identity", x.read_length_identity()}};
    if (with_frequency) j["read_length_frequency"] = x.read_length_frequency();
    layers.push_back(j);
    all.tokens += x.tokens;
    all.active += x.active;
    all.persist_pairs += x.persist_pairs;
    all.persist_base += x.persist_base;
    all.reads_identity += x.reads_identity;
    all.reads_frequency += x.reads_frequency;
  }
  nlohmann::json j = {{"tokens", s.layers.empty() ? 0 : s.layers[0].tokens},
                      {"active_fraction", all.active_fraction(p.neurons)},
                      {"persistence", all.persistence()},
                      {"read_length_identity", all.read_length_identity()},
                      {"layers", layers}};
  if (with_frequency) j["read_length_frequency"] = all.read_length_frequency();
  return j;
}

void print_stats(const char* split, const nlohmann::json& j) {
  std::printf("%s split: %llu tokens per layer\n", split, static_cast<unsigned long long>(j["tokens"].get<uint64_t>()));
  const bool freq = j.contains("read_length_frequency");
  std::printf("%6s %10s %12s %14s %s\n", "layer", "active %", "persist %", "len identity",
              freq ? "  len frequency" : "");
  auto row = [&](const std::string& name, const nlohmann::json& x) {
    std::printf("%6s %10.3f %12.2f %14.3f", name.c_str(), 100 * x["active_fraction"].get<double>(),
                100 * x["persistence"].get<double>(), x["read_length_identity"].get<double>());
    if (freq) std::printf(" %15.3f", x["read_length_frequency"].get<double>());
    std::printf("\n");
  };
  for (const auto& l : j["layers"]) row(std::to_string(l["layer"].get<int>()), l);
  row("all", j);
}

// Refuses, before anything is generated, a shape whose traces cannot be written or used here: more tokens per split
// than the co-activation counts hold (uint32, so nl-layout graph / solve could not count them), memory beyond
// MemAvailable (per layer and neuron: the trace writer's block of TraceWriterOptions::block_tokens bits, the counts,
// the generator's state), or a file system with less room than deflate could possibly need (its best ratio is
// about 1032:1, so no trace of these bits is smaller than bits / 8 / 1032).
void refuse_impossible_synth(const SynthPreset& p, const SynthOptions& o) {
  const std::string what = "nl-profile synth (" + std::to_string(p.layers) + " layers x " + std::to_string(p.neurons) +
                           " neurons, " + std::to_string(p.profile_sequences) + " + " +
                           std::to_string(p.test_sequences) + " sequences of " + std::to_string(p.tokens_per_sequence) +
                           " tokens)";
  const unsigned __int128 profile_tokens = (unsigned __int128)p.profile_sequences * p.tokens_per_sequence;
  const unsigned __int128 test_tokens = (unsigned __int128)p.test_sequences * p.tokens_per_sequence;
  if (std::max(profile_tokens, o.test_out.empty() ? 0 : test_tokens) > UINT32_MAX)
    throw UsageError(what + ": a split of more than " + std::to_string(UINT32_MAX) +
                     " tokens cannot be counted (nl-layout graph / solve count in uint32)");
  const uint64_t per_neuron = TraceWriterOptions{}.block_tokens / 8 + 8 /*counts*/ + 2 /*prev, background*/ +
                              5ull * p.groups_per_neuron /*gate bit, group index*/ + 8 /*expected frequency*/ +
                              8 /*test split: frequency order, slot map*/;
  const unsigned __int128 mem =
      (unsigned __int128)p.layers * ((unsigned __int128)p.neurons * per_neuron + uint64_t(p.group_count) * 17);
  require_memory(what, mem > UINT64_MAX ? UINT64_MAX : uint64_t(mem));
  auto min_bytes = [&](unsigned __int128 tokens) {
    const unsigned __int128 b = (unsigned __int128)p.layers * p.neurons * tokens / 8 / 1032;
    return b > UINT64_MAX ? UINT64_MAX : uint64_t(b);
  };
  require_disk_space(o.profile_out, min_bytes(profile_tokens), "the profile trace (at least, at deflate's best ratio)");
  if (!o.test_out.empty())
    require_disk_space(o.test_out, min_bytes(test_tokens), "the test trace (at least, at deflate's best ratio)");
}

void synth_main(const SynthOptions& o, const GlobalOptions& g) {
  apply_global_options(g);
  check_paths({{"--preset", o.preset}}, {{"--profile-out", o.profile_out}, {"--test-out", o.test_out}});
  CommitGroup outputs;  // --profile-out and --test-out commit together or not at all
  SynthPreset p = synth_preset_load(o.preset);
  if (o.full_depth) p.layers = p.layers_full;
  if (o.layers) p.layers = o.layers;
  if (o.neurons) p.neurons = o.neurons;
  if (o.active_fraction > 0) p.active_fraction = o.active_fraction;
  if (o.tokens_per_sequence) p.tokens_per_sequence = o.tokens_per_sequence;
  if (o.profile_sequences) p.profile_sequences = o.profile_sequences;
  if (o.test_sequences) p.test_sequences = o.test_sequences;
  if (o.fire_probability >= 0) p.fire_probability = o.fire_probability;
  if (o.background_share >= 0) p.background_share = o.background_share;
  if (o.stay_group >= 0) p.stay_group = o.stay_group;
  if (o.stay_neuron >= 0) p.stay_neuron = o.stay_neuron;
  if (o.stay_global >= 0) p.stay_global = o.stay_global;
  if (o.zipf_exponent >= 0) p.zipf_exponent = o.zipf_exponent;
  if (o.density_swing >= 0) p.density_swing = o.density_swing;
  if (o.group_count) p.group_count = o.group_count;
  if (o.groups_per_neuron) p.groups_per_neuron = o.groups_per_neuron;
  synth_preset_validate(p, o.preset + " (with command-line overrides)");
  refuse_impossible_synth(p, o);
  synth_structure(p, o.seed, 0, o.preset + " (with command-line overrides)");  // reachable density

  info(g, "synth: " + p.name + ": " + std::to_string(p.layers) + " layers x " + std::to_string(p.neurons) +
              " neurons, " + std::to_string(p.profile_sequences) + " + " + std::to_string(p.test_sequences) +
              " sequences of " + std::to_string(p.tokens_per_sequence) + " tokens");
  SynthRun run;
  run.seed = o.seed;
  run.split = SynthSplit::Profile;
  auto draw = [&g](const char* stage) {
    auto prog = std::make_shared<Progress>(stage, 0, !g.quiet, "tokens");
    return [prog](uint64_t done, uint64_t total) {
      if (done == 0) return;
      prog->set_total(total);
      prog->set(done);
      if (done == total) prog->finish();
    };
  };
  run.progress = draw("synth profile");
  SynthStats prof = synth_write(p, run, o.profile_out);
  nlohmann::json out = {{"preset", p.name},   {"model", p.model},     {"seed", o.seed},
                        {"layers", p.layers}, {"neurons", p.neurons}, {"profile", stats_json(p, prof, false)}};
  if (!o.test_out.empty()) {
    run.split = SynthSplit::Test;
    for (const auto& c : prof.counts) run.frequency_order.push_back(synth_frequency_order(c));
    run.progress = draw("synth test");
    SynthStats test = synth_write(p, run, o.test_out);
    out["test"] = stats_json(p, test, true);
  }
  outputs.commit();
  info(g, "synth: wrote " + o.profile_out + (o.test_out.empty() ? "" : " and " + o.test_out));
  if (!o.stats) return;
  if (g.json) {
    std::printf("%s\n", json_dump(out, 2).c_str());
    return;
  }
  std::printf("%s (%s): %u layers x %u neurons, seed %llu\n", p.name.c_str(), p.model.c_str(), p.layers, p.neurons,
              static_cast<unsigned long long>(o.seed));
  print_stats("profile", out["profile"]);
  if (out.contains("test")) print_stats("test (frequency order from the profile split)", out["test"]);
}

}  // namespace

void add_profile_synth(CLI::App& app, GlobalOptions& g) {
  static SynthOptions o;
  CLI::App* c = app.add_subcommand("synth", "Write paper-shaped synthetic traces (profile + held-out test split)");
  add_input_options(c, o);
  add_output_options(c, o);
  add_shape_options(c, o);
  add_structure_options(c, o);
  c->callback([&g] { synth_main(o, g); });
}

}  // namespace nl::cli
