// nl-profile inspect: validate a trace file and print its shape and per-layer active fraction.
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "formats/trace.h"

namespace nl::cli {
namespace {

void inspect_main(const std::string& path, const GlobalOptions& g) {
  apply_global_options(g);
  TraceReader r(path);
  const TraceInfo& ti = r.info();
  nlohmann::json j = {{"path", path},
                      {"model", ti.model},
                      {"activation", ti.activation},
                      {"n_layers", ti.n_layers},
                      {"n_tokens", ti.n_tokens},
                      {"n_sequences", ti.sequences.size()}};
  nlohmann::json layers = nlohmann::json::array();
  for (uint32_t l = 0; l < ti.n_layers; ++l) {
    LayerMask m = r.read_layer(l);
    uint64_t active = 0;
    for (uint32_t n = 0; n < m.n_neurons; ++n) active += m.count(n);
    double frac = (m.n_neurons && m.n_tokens) ? double(active) / (double(m.n_neurons) * double(m.n_tokens)) : 0.0;
    layers.push_back({{"layer", l}, {"n_neurons", m.n_neurons}, {"active_fraction", frac}});
  }
  j["layers"] = layers;
  if (g.json) {
    std::printf("%s\n", json_dump(j, 2).c_str());
    return;
  }
  std::printf("%s: model '%s', activation '%s', %u layers, %llu tokens in %zu sequences\n", path.c_str(),
              ti.model.c_str(), ti.activation.c_str(), ti.n_layers, static_cast<unsigned long long>(ti.n_tokens),
              ti.sequences.size());
  std::printf("%6s %10s %10s\n", "layer", "neurons", "active %");
  for (const auto& l : layers)
    std::printf("%6u %10u %10.3f\n", l["layer"].get<uint32_t>(), l["n_neurons"].get<uint32_t>(),
                100.0 * l["active_fraction"].get<double>());
}

}  // namespace

void add_profile_inspect(CLI::App& app, GlobalOptions& g) {
  static std::string path;
  CLI::App* c = app.add_subcommand("inspect", "Check a trace file and print its shape and active fractions");
  c->add_option("trace", path, "Trace file (HDF5, trace format v1)")->required()->check(CLI::ExistingFile);
  c->callback([&g] { inspect_main(path, g); });
}

}  // namespace nl::cli
