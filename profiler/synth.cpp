// Paper-shaped synthetic traces: preset loading/validation, the latent-factor threshold generator, and the
// figures it measures while writing (active fraction, persistence, identity/frequency read lengths).
#include "profiler/synth.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>
#include <sstream>

#include "formats/core/atomic_file.h"
#include "formats/core/error.h"
#include "formats/core/rng.h"
#include "formats/trace.h"

namespace nl {
namespace {

// A workload preset is a few KB of JSON; the bound keeps a device or a wrong file from being read without end.
constexpr uint64_t kSynthPresetMaxBytes = 1 << 20;

using nlohmann::json;

// ---------------------------------------------------------------- preset file
const json& member(const json& obj, const char* key, const std::string& where, const std::string& path) {
  auto it = obj.find(key);
  if (it == obj.end()) throw InputError(path, "missing key '" + where + key + "'");
  return *it;
}

void only_keys(const json& obj, const std::set<std::string>& allowed, const std::string& where,
               const std::string& path) {
  if (!obj.is_object()) throw InputError(path, "'" + where + "' must be an object");
  for (auto it = obj.begin(); it != obj.end(); ++it)
    if (!allowed.count(it.key()))
      throw InputError(path, "unknown key '" + (where.empty() ? it.key() : where + "." + it.key()) + "'");
}

double get_number(const json& obj, const char* key, const std::string& where, const std::string& path) {
  const json& v = member(obj, key, where + ".", path);
  if (!v.is_number()) throw InputError(path, "'" + where + "." + key + "' must be a number");
  return v.get<double>();
}

uint32_t get_count(const json& obj, const char* key, const std::string& where, const std::string& path) {
  const json& v = member(obj, key, where + ".", path);
  if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > int64_t(UINT32_MAX))
    throw InputError(path, "'" + where + "." + key + "' must be a non-negative integer");
  return static_cast<uint32_t>(v.get<int64_t>());
}

// ---------------------------------------------------------------- random numbers: the project's generator
// (formats/core/rng.h), identical on every platform's standard library, so the files are.

// One independent stream per (seed, layer, purpose).
SplitMix64 stream_rng(uint64_t seed, uint64_t layer, uint64_t purpose) {
  return SplitMix64(
      splitmix64(seed * kSplitMixGamma ^ (layer + 1) * 0xC2B2AE3D27D4EB4Full ^ (purpose + 7) * 0x165667B19E3779F9ull));
}

enum Purpose : uint64_t { kStructure = 0, kProcessBase = 16 };

// Equiprobable nodes of the global factor u ~ N(0,1): expectations over u become plain averages.
std::vector<double> global_nodes() {
  const int k = 32;
  std::vector<double> u(k);
  for (int i = 0; i < k; ++i) u[i] = normal_quantile((i + 0.5) / k);
  return u;
}

// A group's rate under the global factor: shifted in log-odds, so rare groups swing by a factor (e^{σu})
// while groups near the cap stay near it (hot neurons fire on almost every token, whatever the token).
inline double modulated_rate(double q, double swing, double u) {
  return 1.0 / (1.0 + std::exp(-(std::log(q / (1.0 - q)) + swing * u)));
}

// ---------------------------------------------------------------- one layer of the generator
struct Layer {
  const SynthPreset& p;
  const SynthStructure st;
  SplitMix64 rng;
  std::vector<double> rate_now;  // group rates under the current global factor
  std::vector<uint8_t> group_on, gate, background;
  std::vector<uint8_t> prev;  // active at the previous token of this sequence
  bool have_prev = false;

  Layer(const SynthPreset& pr, uint64_t seed, uint32_t layer, SynthSplit split)
      : p(pr), st(synth_structure(pr, seed, layer)), rng(stream_rng(seed, layer, kProcessBase + uint64_t(split))) {
    rate_now.assign(p.group_count, 0);
    group_on.assign(p.group_count, 0);
    gate.assign(size_t(p.neurons) * p.groups_per_neuron, 0);
    background.assign(p.neurons, 0);
    prev.assign(p.neurons, 0);
  }

  void set_modulation(double u) {
    for (uint32_t g = 0; g < p.group_count; ++g) rate_now[g] = modulated_rate(st.group_rate[g], p.density_swing, u);
  }

  void start_sequence() {
    set_modulation(rng.normal());
    for (uint32_t g = 0; g < p.group_count; ++g) group_on[g] = rng.uniform() < rate_now[g];
    for (auto& x : gate) x = rng.uniform() < p.fire_probability;
    for (auto& x : background) x = rng.uniform() < st.background;
    have_prev = false;
  }

  void step() {
    if (rng.uniform() >= p.stay_global) set_modulation(rng.normal());
    redraw_some(group_on, p.stay_group, [&](size_t g) { return rng.uniform() < rate_now[g]; });
    redraw_some(gate, p.stay_neuron, [&](size_t) { return rng.uniform() < p.fire_probability; });
    redraw_some(background, p.stay_neuron, [&](size_t) { return rng.uniform() < st.background; });
  }

  // Redraws each entry independently with probability 1 − stay, jumping between redrawn entries with
  // geometric skips (P(skip ≥ k) = stayᵏ): random numbers per redraw, not per entry.
  template <class Draw>
  void redraw_some(std::vector<uint8_t>& x, double stay, Draw draw) {
    if (stay >= 1.0) return;
    if (stay <= 0.0) {
      for (size_t i = 0; i < x.size(); ++i) x[i] = draw(i);
      return;
    }
    const double inv_log_stay = 1.0 / std::log(stay);
    size_t i = 0;
    for (;;) {
      const double skip = std::floor(std::log(1.0 - rng.uniform()) * inv_log_stay);
      if (skip >= double(x.size() - i)) return;
      i += static_cast<size_t>(skip);
      x[i] = draw(i);
      ++i;
    }
  }

  // Active neurons of the current token, ascending; updates the layer's statistics.
  void emit(std::vector<uint32_t>& out, SynthLayerStats& stats, std::vector<uint64_t>& counts,
            const std::vector<uint32_t>* slot_of, std::vector<uint32_t>& scratch, bool has_next) {
    out.clear();
    const uint32_t n = p.neurons, m = p.groups_per_neuron;
    for (uint32_t v = 0; v < n; ++v) {
      bool on = background[v];
      // data() + offset, not &v[i]: with no groups (m = 0) the vectors are empty and v[i] would be undefined.
      const uint32_t* g = st.groups.data() + size_t(v) * m;
      const uint8_t* gt = gate.data() + size_t(v) * m;
      for (uint32_t j = 0; j < m && !on; ++j) on = gt[j] && group_on[g[j]];
      if (on) out.push_back(v);
    }
    stats.tokens++;
    stats.active += out.size();
    uint64_t runs = 0, persist = 0;
    for (size_t i = 0; i < out.size(); ++i) {
      if (i == 0 || out[i] != out[i - 1] + 1) ++runs;
      counts[out[i]]++;
      if (have_prev && prev[out[i]]) ++persist;
    }
    stats.reads_identity += runs;
    if (have_prev) stats.persist_pairs += persist;
    if (has_next) stats.persist_base += out.size();
    if (slot_of) {
      scratch.clear();
      for (uint32_t v : out) scratch.push_back((*slot_of)[v]);
      std::sort(scratch.begin(), scratch.end());
      for (size_t i = 0; i < scratch.size(); ++i)
        if (i == 0 || scratch[i] != scratch[i - 1] + 1) stats.reads_frequency++;
    }
    std::fill(prev.begin(), prev.end(), 0);
    for (uint32_t v : out) prev[v] = 1;
    have_prev = true;
  }
};

std::string split_name(SynthSplit s) { return s == SynthSplit::Profile ? "profile" : "test"; }

}  // namespace

// ---------------------------------------------------------------- public
double normal_quantile(double p) {
  if (!(p > 0.0 && p < 1.0)) throw InternalError("normal_quantile: p outside (0, 1)");
  // Acklam's rational approximation, then one Halley step on erfc for full double precision.
  static const double a[] = {-3.969683028665376e+01, 2.209460984245205e+02,  -2.759285104469687e+02,
                             1.383577518672690e+02,  -3.066479806614716e+01, 2.506628277459239e+00};
  static const double b[] = {-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02,
                             6.680131188771972e+01, -1.328068155288572e+01};
  static const double c[] = {-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00,
                             -2.549732539343734e+00, 4.374664141464968e+00,  2.938163982698783e+00};
  static const double d[] = {7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00,
                             3.754408661907416e+00};
  double x;
  if (p < 0.02425) {
    double q = std::sqrt(-2 * std::log(p));
    x = (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
        ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
  } else if (p > 1 - 0.02425) {
    double q = std::sqrt(-2 * std::log(1 - p));
    x = -(((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
        ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
  } else {
    double q = p - 0.5, r = q * q;
    x = (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q /
        (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1);
  }
  double e = 0.5 * std::erfc(-x / std::sqrt(2.0)) - p;
  double u = e * std::sqrt(2 * M_PI) * std::exp(x * x / 2);
  return x - u / (1 + x * u / 2);
}

void synth_preset_validate(const SynthPreset& p, const std::string& origin) {
  auto bad = [&](const std::string& what) { throw InputError(origin, what); };
  auto unit = [](double x) { return x >= 0 && x <= 1; };
  if (p.neurons < 2 || p.neurons > (1u << 24)) bad("shape.neurons must be in [2, 16777216]");
  if (p.layers < 1 || p.layers > 1024) bad("shape.layers must be in [1, 1024]");
  if (p.layers_full < 1 || p.layers_full > 1024) bad("shape.layers_full must be in [1, 1024]");
  if (p.tokens_per_sequence < 2) bad("shape.tokens_per_sequence must be at least 2");
  if (p.profile_sequences < 1 || p.test_sequences < 1) bad("shape.profile_sequences and test_sequences must be >= 1");
  if (!(p.active_fraction > 0 && p.active_fraction < 1)) bad("activity.active_fraction must be in (0, 1)");
  if (!(p.zipf_exponent >= 0 && p.zipf_exponent <= 8)) bad("activity.zipf_exponent must be in [0, 8]");
  if (!(p.max_group_rate > 0 && p.max_group_rate < 1)) bad("activity.max_group_rate must be in (0, 1)");
  if (!(p.background_share >= 0 && p.background_share <= 1)) bad("activity.background_share must be in [0, 1]");
  if (p.group_count < 1 || p.group_count > (1u << 24)) bad("groups.count must be in [1, 16777216]");
  if (p.groups_per_neuron > p.group_count) bad("groups.per_neuron must not exceed groups.count");
  if (p.groups_per_neuron > 64) bad("groups.per_neuron must be at most 64");
  if (p.groups_per_neuron == 0 && p.background_share < 1) bad("groups.per_neuron = 0 needs background_share = 1");
  if (!(p.fire_probability > 0 && p.fire_probability <= 1)) bad("groups.fire_probability must be in (0, 1]");
  if (!(p.density_swing >= 0 && p.density_swing <= 4)) bad("global.density_swing must be in [0, 4]");
  if (!unit(p.stay_global) || !unit(p.stay_group) || !unit(p.stay_neuron))
    bad("stay.global, stay.group and stay.neuron must be in [0, 1]");
}

SynthPreset synth_preset_load(const std::string& path) {
  const std::string text = read_file(path, kSynthPresetMaxBytes);  // a preset is a few KB: /dev/zero is refused
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for numbers that overflow
    throw InputError(path, std::string("not valid JSON: ") + e.what());
  }
  if (!j.is_object()) throw InputError(path, "a workload preset must be a JSON object");
  only_keys(
      j,
      {"format", "version", "name", "model", "description", "paper", "shape", "activity", "groups", "global", "stay"},
      "", path);
  const json& fmt = member(j, "format", "", path);
  if (!fmt.is_string() || fmt.get<std::string>() != "neuralink-workload")
    throw InputError(path, "format must be \"neuralink-workload\"");
  const json& ver = member(j, "version", "", path);
  if (!ver.is_number_integer() || ver.get<int64_t>() != 1)
    throw InputError(path, "unsupported workload preset version (this build reads version 1)");
  SynthPreset p;
  const json& name = member(j, "name", "", path);
  const json& model = member(j, "model", "", path);
  if (!name.is_string() || name.get<std::string>().empty()) throw InputError(path, "'name' must be a non-empty string");
  if (!model.is_string()) throw InputError(path, "'model' must be a string");
  p.name = name.get<std::string>();
  p.model = model.get<std::string>();

  const json& shape = member(j, "shape", "", path);
  only_keys(shape, {"neurons", "layers", "layers_full", "tokens_per_sequence", "profile_sequences", "test_sequences"},
            "shape", path);
  p.neurons = get_count(shape, "neurons", "shape", path);
  p.layers = get_count(shape, "layers", "shape", path);
  p.layers_full = get_count(shape, "layers_full", "shape", path);
  p.tokens_per_sequence = get_count(shape, "tokens_per_sequence", "shape", path);
  p.profile_sequences = get_count(shape, "profile_sequences", "shape", path);
  p.test_sequences = get_count(shape, "test_sequences", "shape", path);

  const json& act = member(j, "activity", "", path);
  only_keys(act, {"active_fraction", "zipf_exponent", "max_group_rate", "background_share"}, "activity", path);
  p.active_fraction = get_number(act, "active_fraction", "activity", path);
  p.zipf_exponent = get_number(act, "zipf_exponent", "activity", path);
  p.max_group_rate = get_number(act, "max_group_rate", "activity", path);
  p.background_share = get_number(act, "background_share", "activity", path);

  const json& gr = member(j, "groups", "", path);
  only_keys(gr, {"count", "per_neuron", "fire_probability"}, "groups", path);
  p.group_count = get_count(gr, "count", "groups", path);
  p.groups_per_neuron = get_count(gr, "per_neuron", "groups", path);
  p.fire_probability = get_number(gr, "fire_probability", "groups", path);

  const json& gl = member(j, "global", "", path);
  only_keys(gl, {"density_swing"}, "global", path);
  p.density_swing = get_number(gl, "density_swing", "global", path);

  const json& st = member(j, "stay", "", path);
  only_keys(st, {"global", "group", "neuron"}, "stay", path);
  p.stay_global = get_number(st, "global", "stay", path);
  p.stay_group = get_number(st, "group", "stay", path);
  p.stay_neuron = get_number(st, "neuron", "stay", path);
  synth_preset_validate(p, path);
  synth_structure(p, 1, 0, path);  // the caps must leave the target active fraction reachable
  return p;
}

SynthStructure synth_structure(const SynthPreset& p, uint64_t seed, uint32_t layer, const std::string& origin) {
  synth_preset_validate(p, origin);
  SplitMix64 rng = stream_rng(seed, layer, kStructure);
  const uint32_t n = p.neurons, m = p.groups_per_neuron, G = p.group_count;
  SynthStructure s;
  // Popularity ranks land on random group ids and members are drawn at random: hot groups and their
  // neurons are scattered over the index range, as in a trained model.
  std::vector<uint32_t> perm(G);
  std::iota(perm.begin(), perm.end(), 0u);
  shuffle_with(perm.data(), G, rng);
  std::vector<double> weight(G);
  for (uint32_t r = 0; r < G; ++r) weight[perm[r]] = std::pow(double(r + 1), -p.zipf_exponent);
  s.groups.assign(size_t(n) * m, 0);
  for (uint32_t v = 0; v < n; ++v)
    for (uint32_t j = 0; j < m; ++j) {
      uint32_t* row = &s.groups[size_t(v) * m];
      uint32_t g;
      do {
        g = static_cast<uint32_t>(rng.below(G));
      } while (std::find(row, row + j, g) != row + j);
      row[j] = g;
    }
  s.background = p.background_share * p.active_fraction;
  const std::vector<double> nodes = global_nodes();
  // Expected frequency of every neuron for a rate scale: 1 − (1 − b)·Π_j (1 − α·q_g(u)), averaged over u.
  std::vector<double> q(G), qu(size_t(G) * nodes.size());
  auto expected = [&](double scale, std::vector<double>* per_neuron) {
    for (uint32_t g = 0; g < G; ++g) {
      q[g] = std::max(1e-12, std::min(p.max_group_rate, scale * weight[g]));
      for (size_t k = 0; k < nodes.size(); ++k)
        qu[g * nodes.size() + k] = modulated_rate(q[g], p.density_swing, nodes[k]);
    }
    double total = 0;
    for (uint32_t v = 0; v < n; ++v) {
      double f = 0;
      for (size_t k = 0; k < nodes.size(); ++k) {
        double off = 1 - s.background;
        for (uint32_t j = 0; j < m; ++j)
          off *= 1 - p.fire_probability * qu[s.groups[size_t(v) * m + j] * nodes.size() + k];
        f += 1 - off;
      }
      f /= double(nodes.size());
      if (per_neuron) (*per_neuron)[v] = f;
      total += f;
    }
    return total / n;
  };
  // The mean is monotone in the scale: bisect on its logarithm.
  const double most = expected(1e300, nullptr), tol = 1e-9 * p.active_fraction;
  if (most < p.active_fraction - tol)
    throw InputError(origin, "activity.active_fraction is unreachable: at most " + std::to_string(most) +
                                 " with these max_group_rate, fire_probability and background_share");
  double lo = -60, hi = 60;
  if (expected(std::exp(lo), nullptr) > p.active_fraction + tol)
    throw InputError(origin, "activity.background_share alone exceeds activity.active_fraction");
  if (m > 0)
    for (int it = 0; it < 60; ++it) {
      const double mid = 0.5 * (lo + hi);
      (expected(std::exp(mid), nullptr) < p.active_fraction ? lo : hi) = mid;
    }
  s.expected_frequency.assign(n, 0);
  expected(std::exp(hi), &s.expected_frequency);
  s.group_rate = q;
  return s;
}

std::vector<uint32_t> synth_frequency_order(const std::vector<uint64_t>& counts) {
  std::vector<uint32_t> order(counts.size());
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(), [&](uint32_t x, uint32_t y) { return counts[x] > counts[y]; });
  return order;
}

SynthStats synth_write(const SynthPreset& p, const SynthRun& run, const std::string& path) {
  synth_preset_validate(p, "preset '" + p.name + "'");
  const uint32_t L = p.layers;
  const uint32_t seqs =
      run.sequences ? run.sequences : (run.split == SynthSplit::Profile ? p.profile_sequences : p.test_sequences);
  if (!run.frequency_order.empty() && run.frequency_order.size() != L)
    throw InternalError("synth_write: frequency_order must have one order per layer");
  std::vector<std::vector<uint32_t>> slot_of(run.frequency_order.size());
  for (size_t l = 0; l < slot_of.size(); ++l) {
    if (run.frequency_order[l].size() != p.neurons) throw InternalError("synth_write: order has the wrong size");
    slot_of[l].assign(p.neurons, 0);
    for (uint32_t s = 0; s < p.neurons; ++s) slot_of[l][run.frequency_order[l][s]] = s;
  }

  std::vector<std::unique_ptr<Layer>> layer_ptrs(L);
#pragma omp parallel for schedule(dynamic, 1)
  for (uint32_t l = 0; l < L; ++l) layer_ptrs[l] = std::make_unique<Layer>(p, run.seed, l, run.split);

  TraceWriterOptions wo;
  wo.model = "synthetic:" + p.name;
  wo.activation = "synthetic(seed=" + std::to_string(run.seed) + ",split=" + split_name(run.split) + ")";
  wo.n_neurons.assign(L, p.neurons);
  wo.store_tokens = false;
  TraceWriter writer(path, wo);

  SynthStats stats;
  stats.layers.assign(L, {});
  stats.counts.assign(L, std::vector<uint64_t>(p.neurons, 0));
  // Tokens are generated in blocks, layers in parallel; each layer has its own random stream, so the result
  // does not depend on the thread count. Memory: one block of active lists.
  const uint32_t block = std::min<uint32_t>(p.tokens_per_sequence, 512);
  std::vector<std::vector<std::vector<uint32_t>>> act(L, std::vector<std::vector<uint32_t>>(block));
  std::vector<std::vector<uint32_t>> token(L);
  for (uint32_t s = 0; s < seqs; ++s) {
    for (uint32_t t0 = 0; t0 < p.tokens_per_sequence; t0 += block) {
      const uint32_t nb = std::min(block, p.tokens_per_sequence - t0);
#pragma omp parallel for schedule(dynamic, 1)
      for (uint32_t l = 0; l < L; ++l) {
        std::vector<uint32_t> scratch;
        for (uint32_t i = 0; i < nb; ++i) {
          const uint32_t t = t0 + i;
          if (t == 0)
            layer_ptrs[l]->start_sequence();
          else
            layer_ptrs[l]->step();
          layer_ptrs[l]->emit(act[l][i], stats.layers[l], stats.counts[l], slot_of.empty() ? nullptr : &slot_of[l],
                              scratch, t + 1 < p.tokens_per_sequence);
        }
      }
      for (uint32_t i = 0; i < nb; ++i) {
        if (t0 + i == 0) writer.begin_sequence();
        for (uint32_t l = 0; l < L; ++l) token[l].swap(act[l][i]);
        writer.add_token(token);
        for (uint32_t l = 0; l < L; ++l) token[l].swap(act[l][i]);
      }
      if (run.progress)
        run.progress(uint64_t(s) * p.tokens_per_sequence + t0 + nb, uint64_t(seqs) * p.tokens_per_sequence);
    }
  }
  writer.close();
  return stats;
}

}  // namespace nl
