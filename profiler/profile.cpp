// Profiling: corpus -> sequences -> forward passes -> per-layer activation masks streamed into trace v1.
#include "profiler/profile.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>

#include "formats/core/atomic_file.h"
#include "formats/core/error.h"
#include "formats/core/rng.h"
#include "formats/trace.h"
#include "profiler/tokenizer.h"

namespace nl {
namespace {

std::string format_threshold(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

// Collects |a| samples per layer (every `stride`-th value, at most `cap`).
struct Sampler : FfnObserver {
  std::vector<std::vector<float>> samples;
  uint64_t stride = 1, seen = 0;
  size_t cap;
  int hidden;
  Sampler(int layers, int hid, size_t cap_) : samples(size_t(layers)), cap(cap_), hidden(hid) {}
  void on_ffn(int layer, int, int n, const float* a, const float*) override {
    auto& s = samples[size_t(layer)];
    const size_t total = size_t(n) * size_t(hidden);
    for (size_t i = 0; i < total; i += stride)
      if (s.size() < cap) s.push_back(std::fabs(a[i]));
  }
};

// Turns gate activations into per-token active lists and per-neuron counts.
struct MaskObserver : FfnObserver {
  const ActivationRule& rule;
  const std::vector<double>& thresholds;
  int hidden;
  std::vector<std::vector<std::vector<uint32_t>>> active;  // [token in block][layer] -> neurons
  std::vector<std::vector<uint64_t>>& counts;
  MaskObserver(const ActivationRule& r, const std::vector<double>& th, int hid, std::vector<std::vector<uint64_t>>& c)
      : rule(r), thresholds(th), hidden(hid), counts(c) {}
  int base = 0;         // position of active[0]
  bool need_h = false;  // kExact on a dReLU model: h != 0 too (up x > 0)
  void on_ffn(int layer, int pos0, int n, const float* a, const float* h) override {
    const float thr = rule.kind == ActivationRule::Kind::kExact ? 0.0f
                      : rule.kind == ActivationRule::Kind::kAbs ? float(rule.value)
                                                                : float(thresholds[size_t(layer)]);
    const bool exact = rule.kind == ActivationRule::Kind::kExact;
    auto& cnt = counts[size_t(layer)];
    for (int t = 0; t < n; ++t) {
      auto& list = active[size_t(pos0 - base + t)][size_t(layer)];
      list.clear();
      const float* row = a + size_t(t) * size_t(hidden);
      const float* hrow = h + size_t(t) * size_t(hidden);
      for (int j = 0; j < hidden; ++j) {
        const bool on = exact ? row[j] > 0.0f && (!need_h || hrow[j] != 0.0f) : std::fabs(row[j]) > thr;
        if (on) {
          list.push_back(uint32_t(j));
          ++cnt[size_t(j)];
        }
      }
    }
  }
};

}  // namespace

ActivationRule ActivationRule::parse(const std::string& s) {
  ActivationRule r;
  auto number = [&s](const std::string& text) {
    char* end = nullptr;
    const double v = std::strtod(text.c_str(), &end);
    if (text.empty() || *end != '\0' || !std::isfinite(v))
      throw UsageError("activation rule '" + s + "': '" + text + "' is not a number");
    return v;
  };
  if (s == "exact" || s == "relu>0") {
    r.kind = Kind::kExact;
  } else if (s.rfind("abs>calibrated:", 0) == 0 || s.rfind("calibrated:", 0) == 0) {
    r.kind = Kind::kCalibrated;
    r.value = number(s.substr(s.find(':') + 1));
    if (!(r.value > 0.0 && r.value < 1.0))
      throw UsageError("activation rule '" + s + "': the target fraction must be in (0, 1)");
  } else if (s.rfind("abs>", 0) == 0) {
    r.kind = Kind::kAbs;
    r.value = number(s.substr(4));
    if (r.value < 0.0) throw UsageError("activation rule '" + s + "': the threshold must be >= 0");
  } else {
    throw UsageError("unknown activation rule '" + s + "' (exact, abs>X, calibrated:F)");
  }
  return r;
}

std::string ActivationRule::trace_name(FfnAct act, float threshold) const {
  switch (kind) {
    case Kind::kExact:
      return act == FfnAct::kFatRelu ? "fatrelu>" + format_threshold(double(threshold))
                                     : std::string(ffn_act_name(act)) + ">0";
    case Kind::kAbs:
      return "abs>" + format_threshold(value);
    case Kind::kCalibrated:
      return "abs>calibrated:" + format_threshold(value);
  }
  return "";
}

Corpus build_corpus(const std::function<bool(std::vector<int32_t>&)>& next_document, int seq_len, uint64_t max_tokens,
                    int bos) {
  if (seq_len < 2) throw UsageError("--seq-len must be at least 2");
  Corpus c;
  std::vector<int32_t> cur;
  uint64_t total = 0;
  auto start = [&] {
    cur.clear();
    if (bos >= 0) cur.push_back(bos);
  };
  start();
  std::vector<int32_t> doc;
  bool full = false;
  while (!full && next_document(doc)) {
    for (int32_t t : doc) {
      cur.push_back(t);
      const bool at_cap = max_tokens && total + cur.size() >= max_tokens;
      if (int(cur.size()) == seq_len || at_cap) {
        total += cur.size();
        c.sequences.push_back(cur);
        start();
        if (at_cap) {
          full = true;
          break;
        }
      }
    }
  }
  if (!full && cur.size() >= 2) c.sequences.push_back(cur);
  return c;
}

Corpus corpus_from_text_files(const std::vector<std::string>& files, const Tokenizer& tok, int seq_len,
                              uint64_t max_tokens) {
  size_t file = 0, doc = 0;
  std::vector<std::string> docs;
  auto next = [&](std::vector<int32_t>& out) {
    while (doc == docs.size()) {
      if (file == files.size()) return false;
      docs = split_documents(read_file(files[file++], 4ull << 30));
      doc = 0;
    }
    out = tok.encode(docs[doc++]);
    return true;
  };
  return build_corpus(next, seq_len, max_tokens, tok.bos_id());
}

Corpus corpus_from_token_files(const std::vector<std::string>& files, int vocab_size, int seq_len, uint64_t max_tokens,
                               int bos) {
  size_t file = 0, doc = 0;
  std::vector<std::vector<int32_t>> docs;
  auto next = [&](std::vector<int32_t>& out) {
    while (doc == docs.size()) {
      if (file == files.size()) return false;
      docs = read_token_id_file(files[file++], vocab_size);
      doc = 0;
    }
    out = std::move(docs[doc++]);
    return true;
  };
  return build_corpus(next, seq_len, max_tokens, bos);
}

void split_corpus(const Corpus& all, double test_fraction, uint64_t seed, Corpus& profile, Corpus& test) {
  profile.sequences.clear();
  test.sequences.clear();
  const uint64_t cut = test_fraction >= 1.0 ? ~uint64_t(0) : uint64_t(test_fraction * 18446744073709551616.0);
  for (size_t i = 0; i < all.sequences.size(); ++i) {
    const bool is_test = test_fraction > 0.0 && splitmix64(seed * 0x100000001b3ull ^ i) < cut;
    (is_test ? test : profile).sequences.push_back(all.sequences[i]);
  }
  if (test_fraction > 0.0 && all.sequences.size() >= 2) {
    // Tiny corpora: keep both sides non-empty, deterministically.
    if (test.sequences.empty()) {
      test.sequences.push_back(profile.sequences.back());
      profile.sequences.pop_back();
    } else if (profile.sequences.empty()) {
      profile.sequences.push_back(test.sequences.front());
      test.sequences.erase(test.sequences.begin());
    }
  }
}

std::vector<double> calibrate_thresholds(Model& model, const Corpus& calib, double target, uint64_t max_tokens) {
  const ModelConfig& c = model.config();
  const size_t cap = size_t(1) << 20;
  Sampler s(c.n_layers, c.hidden_dim, cap);
  const uint64_t tokens = std::min<uint64_t>(calib.n_tokens(), max_tokens ? max_tokens : calib.n_tokens());
  if (tokens == 0) throw UsageError("no tokens to calibrate the activation threshold on");
  s.stride = std::max<uint64_t>(1, tokens * uint64_t(c.hidden_dim) / cap + 1);
  model.set_observer(&s);
  uint64_t done = 0;
  for (const auto& seq : calib.sequences) {
    if (done >= tokens) break;
    const int n = int(std::min<uint64_t>(seq.size(), tokens - done));
    model.forward_sequence(seq.data(), n, 0, nullptr);
    done += uint64_t(n);
  }
  model.set_observer(nullptr);
  std::vector<double> th;
  for (auto& v : s.samples) {
    // Threshold t with a fraction `target` of samples strictly above it: the (1 - target) quantile.
    const size_t k = std::min(v.size() - 1, size_t(double(v.size()) * (1.0 - target)));
    std::nth_element(v.begin(), v.begin() + std::ptrdiff_t(k), v.end());
    th.push_back(double(v[k]));
  }
  return th;
}

ProfileResult profile_corpus(const ModelWeights& w, int max_seq, const Corpus& corpus, const std::string& out_path,
                             const ProfileOptions& opts) {
  const ModelConfig& c = w.config;
  if (opts.rule.kind == ActivationRule::Kind::kExact && !ffn_act_sparse(c.act))
    throw UsageError("activation rule exact needs an FFN with exact zeros (relu, fatrelu, drelu); this model uses " +
                     std::string(ffn_act_name(c.act)) + " (use calibrated:F or abs>X)");
  if (opts.rule.kind == ActivationRule::Kind::kCalibrated && opts.thresholds.size() != size_t(c.n_layers))
    throw InternalError("profile_corpus: calibrated rule without per-layer thresholds");
  if (max_seq <= 0 || max_seq > c.seq_len) max_seq = c.seq_len;
  for (const auto& s : corpus.sequences)
    if (int(s.size()) > max_seq)
      throw UsageError("a sequence of " + std::to_string(s.size()) + " tokens exceeds the model's context of " +
                       std::to_string(max_seq));

  ProfileResult r;
  r.activation = opts.rule.trace_name(c.act, c.fatrelu_threshold);
  r.n_neurons.assign(size_t(c.n_layers), uint32_t(c.hidden_dim));
  if (opts.rule.kind == ActivationRule::Kind::kCalibrated) r.thresholds = opts.thresholds;
  if (opts.rule.kind == ActivationRule::Kind::kAbs) r.thresholds.assign(size_t(c.n_layers), opts.rule.value);

  TraceWriterOptions wo;
  wo.model = opts.model_name;
  wo.activation = r.activation;
  wo.n_neurons = r.n_neurons;
  wo.thresholds = r.thresholds;
  wo.store_tokens = opts.store_tokens;
  wo.block_tokens = opts.block_tokens;
  TraceWriter writer(out_path, wo);

  // One model + observer per thread; counts merged at the end.
  const int n_threads = std::max(1, std::min<int>(omp_get_max_threads(), int(corpus.sequences.size())));
  std::vector<std::unique_ptr<Model>> models;
  std::vector<std::vector<std::vector<uint64_t>>> counts(static_cast<size_t>(n_threads));
  std::vector<std::unique_ptr<MaskObserver>> observers;
  for (int i = 0; i < n_threads; ++i) {
    models.push_back(std::make_unique<Model>(w, max_seq));
    counts[size_t(i)].assign(size_t(c.n_layers), std::vector<uint64_t>(size_t(c.hidden_dim), 0));
    observers.push_back(std::make_unique<MaskObserver>(opts.rule, r.thresholds, c.hidden_dim, counts[size_t(i)]));
    observers.back()->need_h = c.act == FfnAct::kDRelu;
    models.back()->set_observer(observers.back().get());
  }
  const uint64_t total = corpus.n_tokens();
  const auto t0 = std::chrono::steady_clock::now();
  const size_t n_seq = corpus.sequences.size();
  for (size_t g = 0; g < n_seq; g += size_t(n_threads)) {
    const int group = int(std::min(n_seq - g, size_t(n_threads)));
    std::exception_ptr error;
#pragma omp parallel for num_threads(group) schedule(static, 1) if (group > 1)
    for (int i = 0; i < group; ++i) {
      try {
        const auto& seq = corpus.sequences[g + size_t(i)];
        const int n = int(seq.size());
        MaskObserver& obs = *observers[size_t(i)];
        obs.active.resize(size_t(n));
        for (auto& a : obs.active) a.resize(size_t(c.n_layers));
        const int batch = opts.batch_tokens > 0 ? opts.batch_tokens : std::max(n, 1);
        for (int p = 0; p < n; p += batch)
          models[size_t(i)]->forward_sequence(seq.data() + p, std::min(batch, n - p), p, nullptr);
      } catch (...) {
#pragma omp critical(nl_profile_error)
        if (!error) error = std::current_exception();
      }
    }
    if (error) std::rethrow_exception(error);
    for (int i = 0; i < group; ++i) {
      const auto& seq = corpus.sequences[g + size_t(i)];
      if (seq.empty()) continue;
      writer.begin_sequence();
      for (size_t t = 0; t < seq.size(); ++t) writer.add_token(observers[size_t(i)]->active[t], seq[t]);
      r.n_tokens += seq.size();
      ++r.n_sequences;
    }
    if (opts.progress) opts.progress(r.n_tokens, total);
  }
  writer.close();
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.counts.assign(size_t(c.n_layers), std::vector<uint64_t>(size_t(c.hidden_dim), 0));
  for (const auto& tc : counts)
    for (size_t l = 0; l < tc.size(); ++l)
      for (size_t j = 0; j < tc[l].size(); ++j) r.counts[l][j] += tc[l][j];
  for (size_t l = 0; l < r.counts.size(); ++l) {
    uint64_t s = 0;
    for (uint64_t v : r.counts[l]) s += v;
    r.active_fraction.push_back(r.n_tokens ? double(s) / (double(r.n_tokens) * c.hidden_dim) : 0.0);
  }
  return r;
}

}  // namespace nl
