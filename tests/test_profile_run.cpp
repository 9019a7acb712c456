// Profiling end to end: traces written by profile_corpus read back (C++ and h5py) with exactly the counts the
// profiler computed in memory; batched and token-by-token traces are identical; rules, calibration and the split.
#include <doctest/doctest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "formats/core/atomic_file.h"
#include "formats/core/error.h"
#include "formats/llama2c.h"
#include "formats/trace.h"
#include "model_test_util.h"
#include "profiler/profile.h"
#include "profiler/tokenizer.h"
#include "skip_util.h"

using namespace nl;
namespace fs = std::filesystem;

namespace {

std::string tmp(const std::string& name) {
  fs::create_directories("profile_tmp");
  return fs::absolute("profile_tmp/" + name).string();
}

// A small English text generated here, so the test does not depend on corpus packages.
std::string english_text(int paragraphs) {
  const char* subj[] = {"The little dog", "A girl named Lily", "The old man", "Tom", "The big red ball", "Her mom"};
  const char* verb[] = {"saw", "wanted to play with", "looked at", "was happy with", "ran to", "found"};
  const char* obj[] = {"the park.", "a tree.", "the sun in the sky.", "his friend.", "a small box.", "the cake."};
  std::string s;
  uint32_t x = 7;
  for (int p = 0; p < paragraphs; ++p) {
    for (int k = 0; k < 4; ++k) {
      x = x * 1103515245u + 12345u;
      s += std::string(subj[(x >> 8) % 6]) + " " + verb[(x >> 12) % 6] + " " + obj[(x >> 16) % 6] +
           (k == 1 ? "\n" : " ");
    }
    s += "\n\n";
  }
  return s;
}

Corpus stories_corpus(const Tokenizer& tok, int seq_len, uint64_t max_tokens) {
  const std::string path = tmp("english.txt");
  std::ofstream(path) << english_text(120);
  return corpus_from_text_files({path}, tok, seq_len, max_tokens);
}

}  // namespace

TEST_CASE("stories260K: calibrated trace; counts read back through TraceReader and h5py equal the in-memory counts" *
          test::needs_models({"llama2c-stories260K/stories260K.bin", "llama2c-stories260K/tok512.bin"})) {
  const std::string bin = std::string(NL_MODELS_DIR) + "/llama2c-stories260K/stories260K.bin";
  const ModelWeights w = read_llama2c(bin);
  const auto tok = open_tokenizer(std::string(NL_MODELS_DIR) + "/llama2c-stories260K/tok512.bin");
  const Corpus all = stories_corpus(*tok, 64, 3000);
  CHECK(all.n_tokens() == 3000);
  Corpus prof, test;
  split_corpus(all, 0.2, 5, prof, test);
  CHECK(prof.n_tokens() + test.n_tokens() == 3000);
  CHECK(test.sequences.size() > 0);

  Model m(w, 64);
  ProfileOptions po;
  po.model_name = "stories260K";
  po.rule = ActivationRule::parse("calibrated:0.3");
  po.thresholds = calibrate_thresholds(m, prof, 0.3, 100000);
  po.block_tokens = 256;  // several flushes
  const std::string out = tmp("stories.h5");
  const ProfileResult r = profile_corpus(w, 64, prof, out, po);
  CHECK(r.n_tokens == prof.n_tokens());
  for (double f : r.active_fraction) CHECK(f == doctest::Approx(0.3).epsilon(0.02));  // calibrated on this text

  TraceReader tr(out);
  const TraceInfo& ti = tr.info();
  CHECK(ti.activation == "abs>calibrated:0.3");
  CHECK(ti.n_tokens == r.n_tokens);
  CHECK(ti.thresholds == r.thresholds);
  REQUIRE(ti.sequences.size() == prof.sequences.size());
  int64_t start = 0;
  for (size_t i = 0; i < prof.sequences.size(); ++i) {
    CHECK(ti.sequences[i] == start);
    start += int64_t(prof.sequences[i].size());
  }
  CHECK(ti.tokens.front() == 1);
  for (uint32_t l = 0; l < ti.n_layers; ++l) {
    const LayerMask mask = tr.read_layer(l);
    size_t bad = 0;
    for (uint32_t n = 0; n < mask.n_neurons; ++n) bad += mask.count(n) != r.counts[l][n];
    CHECK(bad == 0);
  }

  if (!test::python_has("h5py")) {
    test::skip_part(NL_PYTHON " has no h5py (install python3-h5py): counts not read back through h5py");
    return;
  }
  const std::string script = tmp("counts.py"), counts = tmp("counts.json");
  std::ofstream(script)
      << "import h5py, json, numpy as np, sys\n"
         "f = h5py.File(sys.argv[1], 'r')\n"
         "n = int(f.attrs['n_tokens'])\n"
         "out = []\n"
         "for l in range(int(f.attrs['n_layers'])):\n"
         "    w = f[f'layers/{l}/mask'][...].astype('<u8').view(np.uint8).reshape(f[f'layers/{l}/mask'].shape[0], -1)\n"
         "    bits = np.unpackbits(w, axis=1, bitorder='little')[:, :n]\n"
         "    out.append(bits.sum(axis=1).tolist())\n"
         "json.dump(out, open(sys.argv[2], 'w'))\n";
  REQUIRE(std::system((std::string(NL_PYTHON) + " " + script + " " + out + " " + counts).c_str()) == 0);
  const auto py = nlohmann::json::parse(read_file(counts)).get<std::vector<std::vector<uint64_t>>>();
  CHECK(py == r.counts);
}

TEST_CASE("batched and token-by-token profiling write identical masks; ReLU rule equals gate > 0") {
  const ModelWeights w = test::random_weights(test::small_config(FfnAct::kRelu), 17);
  Corpus c;
  uint32_t x = 1;
  for (int s = 0; s < 5; ++s) {
    std::vector<int32_t> seq{1};
    for (int i = 0; i < 30 + 7 * s; ++i) seq.push_back(int32_t((x = x * 1664525u + 1013904223u) >> 28) % 19);
    c.sequences.push_back(seq);
  }
  ProfileOptions po;
  po.rule = ActivationRule::parse("relu>0");
  po.block_tokens = 64;
  const ProfileResult a = profile_corpus(w, 64, c, tmp("batched.h5"), po);
  po.batch_tokens = 1;
  const ProfileResult b = profile_corpus(w, 64, c, tmp("single.h5"), po);
  po.batch_tokens = 16;
  const ProfileResult d = profile_corpus(w, 64, c, tmp("chunked.h5"), po);
  CHECK(a.counts == b.counts);
  CHECK(a.counts == d.counts);
  TraceReader ta(tmp("batched.h5")), tb(tmp("single.h5"));
  for (uint32_t l = 0; l < 2; ++l) CHECK(ta.read_layer(l).bits == tb.read_layer(l).bits);

  // Independent check of the rule: gate x > 0 computed here from the observer's pre-activation-free path.
  struct Gate : FfnObserver {
    std::vector<std::vector<uint32_t>> on;  // [layer] -> count per neuron
    void on_ffn(int layer, int, int n, const float* g, const float*) override {
      for (int t = 0; t < n; ++t)
        for (int j = 0; j < 37; ++j) on[size_t(layer)][size_t(j)] += g[t * 37 + j] > 0.0f;
    }
  } gate;
  gate.on.assign(2, std::vector<uint32_t>(37, 0));
  Model m(w, 64);
  m.set_observer(&gate);
  for (const auto& s : c.sequences) m.forward_sequence(s.data(), int(s.size()), 0, nullptr);
  for (size_t l = 0; l < 2; ++l)
    for (size_t j = 0; j < 37; ++j) CHECK(gate.on[l][j] == a.counts[l][j]);
  uint64_t total = 0;
  for (const auto& l : a.counts)
    for (uint64_t v : l) total += v;
  CHECK(total > 0);
  CHECK(total < a.n_tokens * 37 * 2);
}

TEST_CASE("rules: parsing, names, and relu>0 refused for a SiLU model") {
  CHECK(ActivationRule::parse("relu>0").trace_name() == "relu>0");
  CHECK(ActivationRule::parse("exact").trace_name(FfnAct::kRelu) == "relu>0");
  CHECK(ActivationRule::parse("exact").trace_name(FfnAct::kFatRelu, 0.25f) == "fatrelu>0.25");
  CHECK(ActivationRule::parse("exact").trace_name(FfnAct::kDRelu) == "drelu>0");
  CHECK(ActivationRule::parse("abs>0.05").trace_name() == "abs>0.05");
  CHECK(ActivationRule::parse("calibrated:0.3").trace_name() == "abs>calibrated:0.3");
  CHECK(ActivationRule::parse("abs>calibrated:0.25").value == 0.25);
  CHECK_THROWS_AS(ActivationRule::parse("calibrated:1.5"), UsageError);
  CHECK_THROWS_AS(ActivationRule::parse("abs>x"), UsageError);
  CHECK_THROWS_AS(ActivationRule::parse("gelu"), UsageError);
  const ModelWeights w = test::random_weights(test::small_config(FfnAct::kSilu), 1);
  Corpus c;
  c.sequences = {{1, 2, 3}};
  ProfileOptions po;
  CHECK_THROWS_AS(profile_corpus(w, 64, c, tmp("x.h5"), po), UsageError);
  CHECK_FALSE(fs::exists(tmp("x.h5")));
}

TEST_CASE("corpus: fixed-length sequences with BOS, max_tokens, deterministic split") {
  std::vector<std::vector<int32_t>> docs = {{5, 6, 7}, {8, 9}, {10, 11, 12, 13, 14, 15, 16}};
  size_t i = 0;
  auto next = [&](std::vector<int32_t>& d) {
    if (i == docs.size()) return false;
    d = docs[i++];
    return true;
  };
  const Corpus c = build_corpus(next, 4, 0, 1);
  REQUIRE(c.sequences.size() == 4);
  CHECK(c.sequences[0] == std::vector<int32_t>{1, 5, 6, 7});
  CHECK(c.sequences[1] == std::vector<int32_t>{1, 8, 9, 10});
  CHECK(c.sequences[3] == std::vector<int32_t>{1, 14, 15, 16});
  i = 0;
  const Corpus capped = build_corpus(next, 4, 6, 1);
  CHECK(capped.n_tokens() == 6);
  CHECK(capped.sequences.back() == std::vector<int32_t>{1, 8});

  Corpus many;
  for (int s = 0; s < 200; ++s) many.sequences.push_back({1, s});
  Corpus p1, t1, p2, t2, p3, t3;
  split_corpus(many, 0.1, 42, p1, t1);
  split_corpus(many, 0.1, 42, p2, t2);
  split_corpus(many, 0.1, 43, p3, t3);
  CHECK(t1.sequences == t2.sequences);
  CHECK(t1.sequences != t3.sequences);
  CHECK(t1.sequences.size() > 8);
  CHECK(t1.sequences.size() < 35);
  CHECK(p1.sequences.size() + t1.sequences.size() == 200);
}
