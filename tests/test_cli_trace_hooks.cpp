// profiler/python/trace_hooks.py (PyTorch forward hooks -> trace v1) against nl-profile run on the same tokens:
// stories260K converted to a Hugging Face folder, run by a tiny torch Llama (tests/torch_llama.py); a ReLU copy of
// it must give identical masks under relu>0, the SiLU original identical masks under abs>0.3 except bits within
// 1e-4 of the threshold (tests/trace_hooks_check.py states the comparison). The toolkit reads the result.
// Distributed: torchrun with 2 gloo ranks on the bundled tiny ReLU model (datasets/tiny-relu), batches of padded
// sequences, shards merged by nl-profile merge, equals the single-process trace bit for bit.
#include <doctest/doctest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "formats/core/atomic_file.h"
#include "formats/trace.h"
#include "model_test_util.h"
#include "skip_util.h"

namespace fs = std::filesystem;

namespace {

int sh(const std::string& cmd) {
  int st = std::system((cmd + " > hooks_out.txt 2> hooks_err.txt").c_str());
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

}  // namespace

TEST_CASE("trace_hooks.py on a torch Llama agrees with nl-profile run" *
          nl::test::needs_models({"llama2c-stories260K/stories260K.bin", "llama2c-stories260K/tok512.bin"}) *
          nl::test::needs_python("torch, h5py", "python3-torch python3-h5py: scripts/bootstrap.sh train")) {
  const std::string bin = std::string(NL_MODELS_DIR) + "/llama2c-stories260K/stories260K.bin";
  const std::string py = NL_PYTHON;
  const std::string prof = std::string(NL_BINARY_DIR) + "/cli/nl-profile";
  fs::remove_all("hooks_tmp");
  fs::create_directories("hooks_tmp");
  REQUIRE(sh(prof + " -q convert --model " + bin + " --out hooks_tmp/silu") == 0);
  // The same weights with a ReLU FFN: a different model, but one both implementations run, where relu>0 is exact.
  fs::create_directories("hooks_tmp/relu");
  fs::copy_file("hooks_tmp/silu/model.safetensors", "hooks_tmp/relu/model.safetensors");
  std::string cfg = nl::read_file("hooks_tmp/silu/config.json");
  size_t p = cfg.find("\"silu\"");
  REQUIRE(p != std::string::npos);
  cfg.replace(p, 6, "\"relu\"");
  nl::write_file_atomic("hooks_tmp/relu/config.json", cfg);
  {
    std::ofstream ids("hooks_tmp/ids.txt");
    std::mt19937 rng(3);
    ids << "# six documents of random token ids\n";
    for (int d = 0; d < 6; ++d) {
      int n = 20 + int(rng() % 70);
      for (int i = 0; i < n; ++i) ids << (i ? " " : "") << 3 + rng() % 509;
      ids << "\n";
    }
  }
  const std::string common = " --token-ids hooks_tmp/ids.txt --seq-len 64 ";
  REQUIRE(sh(prof + " -q run --model hooks_tmp/silu" + common + "--activation 'abs>0.3' --out hooks_tmp/c_silu.h5") ==
          0);
  REQUIRE(sh(prof + " -q run --model hooks_tmp/relu" + common + "--activation 'relu>0' --out hooks_tmp/c_relu.h5") ==
          0);
  const std::string src = NL_SOURCE_DIR;
  int rc = sh(
      py + " " + src + "/tests/trace_hooks_check.py " + src +
      " hooks_tmp/silu hooks_tmp/relu hooks_tmp/ids.txt 64 0.3 hooks_tmp/c_silu.h5 hooks_tmp/c_relu.h5 hooks_tmp/py_");
  INFO(nl::read_file("hooks_out.txt") << nl::read_file("hooks_err.txt"));
  CHECK(rc == 0);
  MESSAGE("trace_hooks vs nl-profile: " << nl::read_file("hooks_out.txt"));
  // The toolkit reads the hook script's traces, and they describe the same tokens.
  for (const char* n : {"relu", "silu"}) {
    nl::TraceReader py_tr(std::string("hooks_tmp/py_") + n + ".h5");
    nl::TraceReader c_tr(std::string("hooks_tmp/c_") + n + ".h5");
    CHECK(py_tr.info().n_tokens == c_tr.info().n_tokens);
    CHECK(py_tr.info().n_neurons == c_tr.info().n_neurons);
    CHECK(py_tr.info().tokens == c_tr.info().tokens);
  }
  // The ReLU traces are identical bit for bit through the C++ reader too.
  nl::TraceReader a("hooks_tmp/py_relu.h5"), b("hooks_tmp/c_relu.h5");
  for (uint32_t l = 0; l < a.info().n_layers; ++l) CHECK(a.read_layer(l).bits == b.read_layer(l).bits);
}

namespace {

bool torchrun_works() {
  // torch.distributed with gloo (Debian's python3-torch has it); torchrun is torch's own module.
  return std::system((std::string(NL_PYTHON) +
                      " -c 'import torch.distributed as d, torch.distributed.run, h5py; assert d.is_gloo_available()'"
                      " >/dev/null 2>&1")
                         .c_str()) == 0;
}

}  // namespace

TEST_CASE("trace_hooks.py under torchrun (2 gloo ranks, batches) + nl-profile merge = one process" *
          nl::test::skip_unless(torchrun_works(), std::string(NL_PYTHON) +
                                                      " lacks torch.distributed with gloo or h5py (install "
                                                      "python3-torch python3-h5py: scripts/bootstrap.sh train)")) {
  const std::string py = NL_PYTHON, src = NL_SOURCE_DIR;
  const std::string prof = std::string(NL_BINARY_DIR) + "/cli/nl-profile";
  fs::remove_all("hooks_dist");
  fs::create_directories("hooks_dist");
  {
    std::ofstream ids("hooks_dist/ids.txt");
    std::mt19937 rng(7);
    ids << "# nine documents of random token ids (vocabulary 2048)\n";
    for (int d = 0; d < 9; ++d) {
      int n = 15 + int(rng() % 135);
      for (int i = 0; i < n; ++i) ids << (i ? " " : "") << 3 + rng() % 2045;
      ids << "\n";
    }
  }
  const std::string args = " " + src + "/profiler/python/trace_hooks.py --model " + src +
                           "/datasets/tiny-relu/model --loader " + src +
                           "/tests/torch_llama.py:load_llama --token-ids hooks_dist/ids.txt --seq-len 64 "
                           "--model-name tiny-relu --device cpu";
  // One thread per process: two ranks on a shared machine, and the same kernels in both runs.
  const std::string env = "OMP_NUM_THREADS=1 ";
  int rc = sh(env + py + args + " --out hooks_dist/single.h5");
  INFO(nl::read_file("hooks_out.txt") << nl::read_file("hooks_err.txt"));
  REQUIRE(rc == 0);
  // torchrun (torch's own launcher, as `torchrun`); --redirects 1 --tee 2 works around torch 1.13's Std parsing
  // under Python 3.11 (the default "0" parses to None), keeping stderr on the console.
  rc = sh(env + py + " -m torch.distributed.run --standalone --nproc_per_node 2 --redirects 1 --tee 2" + args +
          " --batch-size 3 --out hooks_dist/dist.h5");
  INFO(nl::read_file("hooks_out.txt") << nl::read_file("hooks_err.txt"));
  REQUIRE(rc == 0);
  REQUIRE(fs::exists("hooks_dist/dist.rank0-of-2.h5"));
  REQUIRE(fs::exists("hooks_dist/dist.rank1-of-2.h5"));
  {
    // Each rank profiled a non-empty, contiguous share: shard 0 starts the corpus, shard 1 continues it.
    nl::TraceReader s0("hooks_dist/dist.rank0-of-2.h5"), s1("hooks_dist/dist.rank1-of-2.h5");
    CHECK(s0.info().n_tokens > 0);
    CHECK(s1.info().n_tokens > 0);
  }
  REQUIRE(sh(prof + " -q merge hooks_dist/dist.rank0-of-2.h5 hooks_dist/dist.rank1-of-2.h5 --out "
                    "hooks_dist/merged.h5") == 0);
  nl::TraceReader a("hooks_dist/single.h5"), b("hooks_dist/merged.h5");
  CHECK(a.info().model == b.info().model);
  CHECK(a.info().activation == b.info().activation);
  CHECK(a.info().n_tokens == b.info().n_tokens);
  CHECK(a.info().n_neurons == b.info().n_neurons);
  CHECK(a.info().sequences == b.info().sequences);
  CHECK(a.info().tokens == b.info().tokens);
  REQUIRE(a.info().n_layers == 4);
  uint64_t active = 0;
  for (uint32_t l = 0; l < a.info().n_layers; ++l) {
    nl::LayerMask x = a.read_layer(l), y = b.read_layer(l);
    CHECK(x.bits == y.bits);
    for (uint32_t v = 0; v < x.n_neurons; ++v) active += x.count(v);
  }
  CHECK(active > 0);  // a real model's masks, not empty ones
  MESSAGE("torchrun 2 gloo ranks + merge = single process: " << a.info().n_tokens << " tokens, "
                                                             << a.info().sequences.size() << " sequences");
  fs::remove_all("hooks_dist");
}

TEST_CASE("nl-profile merge refuses shards of other models or rules, naming the file") {
  fs::remove_all("merge_tmp");
  fs::create_directories("merge_tmp");
  nl::LayerMask m(10, 100);
  for (uint64_t t = 0; t < 100; ++t) m.set(uint32_t(t % 10), t);
  auto write = [&](const std::string& path, const std::string& model, const std::string& rule, uint32_t n) {
    nl::TraceWriterOptions o;
    o.model = model;
    o.activation = rule;
    o.n_neurons = {n};
    nl::LayerMask mm = m;
    mm.n_neurons = n;
    mm.bits.resize(size_t(n) * mm.words);
    nl::trace_write(path, o, {mm}, {0, 40}, std::vector<int32_t>(100, 5));
  };
  write("merge_tmp/a.h5", "m", "relu>0", 10);
  write("merge_tmp/b.h5", "other", "relu>0", 10);
  write("merge_tmp/c.h5", "m", "abs>0.1", 10);
  write("merge_tmp/d.h5", "m", "relu>0", 9);
  const std::string prof = std::string(NL_BINARY_DIR) + "/cli/nl-profile -q merge merge_tmp/a.h5 ";
  for (auto [other, what] :
       {std::pair<const char*, const char*>{"b", "model 'other'"}, {"c", "rule 'abs>0.1'"}, {"d", "neuron counts"}}) {
    CHECK(sh(prof + "merge_tmp/" + other + ".h5 --out merge_tmp/out.h5") == 3);
    const std::string err = nl::read_file("hooks_err.txt");
    CHECK(err.find(std::string("merge_tmp/") + other + ".h5") != std::string::npos);
    CHECK(err.find(what) != std::string::npos);
    CHECK(!fs::exists("merge_tmp/out.h5"));
  }
  // Two copies of one shard: sequences and tokens are concatenated.
  REQUIRE(sh(prof + "merge_tmp/a.h5 --out merge_tmp/out.h5") == 0);
  nl::TraceReader r("merge_tmp/out.h5");
  CHECK(r.info().n_tokens == 200);
  CHECK(r.info().sequences == std::vector<int64_t>{0, 40, 100, 140});
  nl::LayerMask got = r.read_layer(0);
  for (uint64_t t = 0; t < 200; ++t) CHECK(got.test(uint32_t(t % 10), t) == (t % 10 == (t % 100) % 10));
  fs::remove_all("merge_tmp");
}
