// Profiling: run a model over token sequences and stream, per FFN layer and token, which neurons fire into a
// trace v1 file. Also the corpus handling (documents -> fixed-length sequences -> profile/test split) and the
// activation rules (exact ReLU, absolute magnitude, CATS-style per-layer calibrated magnitude).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runtime/model/model.h"

namespace nl {

// Which neurons count as "fired". The rule reads the gate activation a = gate_act(gate x) and h that FfnObserver
// reports: kExact is the model's own exact zeros (relu and fatrelu: a != 0; drelu: a != 0 and h != 0, i.e. gate x > 0
// and up x > 0), a neuron that contributes exactly nothing; kAbs / kCalibrated keep |a| above a magnitude threshold
// (CATS: Lee et al. 2024 threshold |SiLU(gate x)| and skip the up/down work for the rest). The runtime need not read
// the bundle of a neuron that did not fire.
struct ActivationRule {
  enum class Kind { kExact, kAbs, kCalibrated };
  Kind kind = Kind::kExact;
  double value = 0.0;  // kAbs: the threshold; kCalibrated: target active fraction in (0, 1)

  // "exact" (or its old name "relu>0"), "abs>X" or "calibrated:F".
  static ActivationRule parse(const std::string& s);
  // What the trace stores: kExact by the model's activation ("relu>0", "fatrelu>T", "drelu>0"), "abs>X",
  // "abs>calibrated:F".
  std::string trace_name(FfnAct act = FfnAct::kRelu, float threshold = 0.0f) const;
};

// Sequences of token ids, each an independent context that starts at position 0.
struct Corpus {
  std::vector<std::vector<int32_t>> sequences;
  uint64_t n_tokens() const {
    uint64_t n = 0;
    for (const auto& s : sequences) n += s.size();
    return n;
  }
};

// Documents are concatenated into one token stream, which is cut into sequences of `seq_len` tokens: `bos` (when
// >= 0) followed by seq_len-1 stream tokens. `max_tokens` (0 = no limit) caps the total; a final partial sequence
// of at least 2 tokens is kept. `next_document` returns false when no documents are left (encoded lazily, so a large
// corpus is tokenized only as far as max_tokens needs).
Corpus build_corpus(const std::function<bool(std::vector<int32_t>&)>& next_document, int seq_len, uint64_t max_tokens,
                    int bos);

class Tokenizer;
// Text files (plain UTF-8; documents as split_documents() defines them), encoded lazily with `tok`.
Corpus corpus_from_text_files(const std::vector<std::string>& files, const Tokenizer& tok, int seq_len,
                              uint64_t max_tokens);
// Token-id files (read_token_id_file()); `bos` < 0 adds no BOS.
Corpus corpus_from_token_files(const std::vector<std::string>& files, int vocab_size, int seq_len, uint64_t max_tokens,
                               int bos);

// Deterministic split by sequence: sequence i goes to the test side when a seeded hash of i falls below
// `test_fraction`; with test_fraction > 0 and at least two sequences each side gets at least one.
void split_corpus(const Corpus& all, double test_fraction, uint64_t seed, Corpus& profile, Corpus& test);

// Per-layer magnitude thresholds such that a fraction `target` of the (token, neuron) gate activations of
// `calib` exceed them (|a| > t). Uses at most `max_tokens` tokens of `calib` and at most 2^20 samples per layer.
std::vector<double> calibrate_thresholds(Model& model, const Corpus& calib, double target, uint64_t max_tokens);

struct ProfileOptions {
  std::string model_name;  // root attribute `model`
  ActivationRule rule;
  std::vector<double> thresholds;  // per layer, for kCalibrated (from calibrate_thresholds)
  int batch_tokens = 0;            // tokens per forward call; 0 = whole sequence, 1 = token by token
  bool store_tokens = true;
  uint32_t block_tokens = 4096;  // trace writer flush granularity
  // Called after each sequence with (tokens done, tokens total); the CLI prints progress from it.
  std::function<void(uint64_t, uint64_t)> progress;
};

struct ProfileResult {
  uint64_t n_tokens = 0;
  uint64_t n_sequences = 0;
  double seconds = 0.0;                       // wall time of forward passes + mask streaming
  std::vector<uint32_t> n_neurons;            // per layer
  std::vector<std::vector<uint64_t>> counts;  // [layer][neuron]: tokens at which the neuron fired
  std::vector<double> active_fraction;        // per layer
  std::string activation;                     // the rule as stored in the trace
  std::vector<double> thresholds;             // per layer when the rule has one
};

// Runs the dense model over `corpus` and writes the trace to `out_path` (atomic). Sequences are independent, so
// each OpenMP thread runs its own Model instance (context `max_seq`) on its own sequence: no barrier per layer.
// Masks stream to the writer in sequence order, so memory is bounded by one sequence per thread plus the
// writer's block. Returns the in-memory per-neuron counts for checking and summaries.
ProfileResult profile_corpus(const ModelWeights& w, int max_seq, const Corpus& corpus, const std::string& out_path,
                             const ProfileOptions& opts);

}  // namespace nl
