// profiler/python/trace_hooks.py (PyTorch forward hooks -> trace v1) against nl-profile run on the same tokens:
// stories260K converted to a Hugging Face folder, run by a tiny torch Llama (tests/torch_llama.py); a ReLU copy of
// it must give identical masks under relu>0, the SiLU original identical masks under abs>0.3 except bits within
// 1e-4 of the threshold (tests/trace_hooks_check.py states the comparison). The toolkit reads the result.
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
