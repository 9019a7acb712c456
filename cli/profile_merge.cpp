// nl-profile merge: concatenate trace shards (e.g. one per torchrun rank of profiler/python/trace_hooks.py) into
// one trace v1 file, in the order given, after checking they come from the same model and activation rule.
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "formats/core/error.h"
#include "formats/core/progress.h"
#include "formats/trace.h"

namespace nl::cli {
namespace {

struct MergeArgs {
  std::vector<std::string> inputs;
  std::string out;
};

// Tokens per block copied at once (a multiple of 64): memory is sum over layers of neurons x block / 8 bytes.
constexpr uint64_t kBlockTokens = 4096;

void merge_main(const MergeArgs& a, const GlobalOptions& g) {
  apply_global_options(g);
  check_paths(named_paths("input", a.inputs), {{"--out", a.out}});
  std::vector<std::unique_ptr<TraceReader>> rs;
  for (const auto& p : a.inputs) rs.push_back(std::make_unique<TraceReader>(p));
  const TraceInfo& first = rs[0]->info();
  uint64_t total = 0;
  bool tokens = true;
  for (const auto& r : rs) {
    const TraceInfo& ti = r->info();
    if (ti.model != first.model)
      throw InputError(ti.path,
                       "is a trace of model '" + ti.model + "' but " + first.path + " is of '" + first.model + "'");
    if (ti.activation != first.activation)
      throw InputError(ti.path, "uses activation rule '" + ti.activation + "' but " + first.path + " uses '" +
                                    first.activation + "'");
    if (ti.n_neurons != first.n_neurons)
      throw InputError(ti.path, "has other layers or neuron counts than " + first.path);
    if (ti.thresholds != first.thresholds)
      throw InputError(ti.path, "has other per-layer thresholds than " + first.path);
    tokens = tokens && !ti.tokens.empty();
    total += ti.n_tokens;
  }
  TraceWriterOptions wo;
  wo.model = first.model;
  wo.activation = first.activation;
  wo.n_neurons = first.n_neurons;
  wo.thresholds = first.thresholds;
  wo.store_tokens = tokens;  // token ids only when every shard has them
  info(g, "merge: " + std::to_string(rs.size()) + " shards, " + std::to_string(total) + " tokens -> " + a.out);
  TraceWriter w(a.out, wo);
  Progress prog("merge", total, !g.quiet, "tokens");
  const uint32_t n_layers = first.n_layers;
  std::vector<std::vector<std::vector<uint32_t>>> act;  // [token in block][layer] -> active neurons
  for (const auto& r : rs) {
    const TraceInfo& ti = r->info();
    size_t si = 0;
    for (uint64_t t0 = 0; t0 < ti.n_tokens; t0 += kBlockTokens) {
      const uint64_t nt = std::min(kBlockTokens, ti.n_tokens - t0), nw = (nt + 63) / 64;
      act.assign(nt, std::vector<std::vector<uint32_t>>(n_layers));
      for (uint32_t l = 0; l < n_layers; ++l) {
        const std::vector<uint64_t> words = r->read_layer_words(l, t0 / 64, nw);
        for (uint32_t v = 0; v < ti.n_neurons[l]; ++v)
          for (uint64_t wi = 0; wi < nw; ++wi)
            for (uint64_t bits = words[size_t(v) * nw + wi]; bits; bits &= bits - 1) {
              const uint64_t t = wi * 64 + uint64_t(__builtin_ctzll(bits));
              if (t < nt) act[t][l].push_back(v);
            }
      }
      for (uint64_t t = 0; t < nt; ++t) {
        while (si < ti.sequences.size() && uint64_t(ti.sequences[si]) == t0 + t) w.begin_sequence(), ++si;
        w.add_token(act[t], tokens ? ti.tokens[t0 + t] : -1);
      }
      prog.add(nt);
    }
  }
  w.close();
  prog.finish();
  if (g.json) {
    nlohmann::json j = {{"out", a.out}, {"inputs", a.inputs}, {"n_tokens", total}, {"tokens_stored", tokens}};
    std::printf("%s\n", json_dump(j, 2).c_str());
    return;
  }
  std::printf("%s: %zu shards merged, %u layers, %llu tokens%s\n", a.out.c_str(), rs.size(), n_layers,
              static_cast<unsigned long long>(total), tokens ? "" : " (no token ids: a shard lacks them)");
}

}  // namespace

void add_profile_merge(CLI::App& app, GlobalOptions& g) {
  static MergeArgs a;
  CLI::App* c =
      app.add_subcommand("merge", "Concatenate trace shards (same model and rule) into one trace, in the order given");
  c->add_option("inputs", a.inputs, "Trace shards, in order (e.g. OUT.rank*-of-NN.h5 from trace_hooks.py)")
      ->required()
      ->check(CLI::ExistingFile);
  c->add_option("--out", a.out, "Merged trace to write (atomically)")->required();
  c->callback([&g] { merge_main(a, g); });
}

}  // namespace nl::cli
