// Malformed inputs through the binaries (issue 9): every reader's error reaches the user as exactly one line
// "<binary>: error: <file>: <problem>" and exit code 3, never a crash, a signal or an internal error.
#include <doctest/doctest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <string>

#include "formats/core/atomic_file.h"
#include "formats/core/error.h"
#include "formats/core/image_writer.h"
#include "formats/layout.h"
#include "formats/llama2c.h"
#include "formats/trace.h"
#include "model_test_util.h"

namespace fs = std::filesystem;
using namespace nl;

namespace {

std::string tmp(const std::string& n) {
  fs::create_directories("cli_malformed_tmp");
  return fs::absolute("cli_malformed_tmp/" + n).string();
}

// Runs `binary args`; checks exit 3 and one stderr line naming `file`.
void expect_input_error(const std::string& binary, const std::string& args, const std::string& file,
                        const std::string& needle) {
  const std::string err = tmp("stderr");
  const int st =
      std::system((std::string(NL_BINARY_DIR) + "/cli/" + binary + " " + args + " >/dev/null 2>" + err).c_str());
  INFO(binary << " " << args);
  REQUIRE(WIFEXITED(st));  // not killed by a signal
  const std::string msg = read_file(err);
  INFO(msg);
  CHECK(WEXITSTATUS(st) == kExitInput);
  CHECK(msg.rfind(binary + ": error: " + file + ": ", 0) == 0);
  CHECK(msg.find(needle) != std::string::npos);
  CHECK(std::count(msg.begin(), msg.end(), '\n') == 1);
}

}  // namespace

TEST_CASE("nl-profile, nl-layout and nl-run refuse malformed files with one line and exit 3") {
  // Valid inputs of every kind, written by the toolkit.
  const ModelWeights w = test::random_weights(test::small_config(), 4);
  write_llama2c(tmp("model.bin"), w);
  const std::string model_bytes = read_file(tmp("model.bin"));
  TraceWriterOptions o;
  o.model = "m";
  o.activation = "relu>0";
  o.n_neurons = {37, 37};
  std::vector<LayerMask> masks(2, LayerMask(37, 100));
  for (auto& m : masks)
    for (uint32_t n = 0; n < 37; ++n) m.set(n, (n * 7) % 100);
  trace_write(tmp("trace.h5"), o, masks, {0});
  const std::string trace_bytes = read_file(tmp("trace.h5"));
  image_write_model(tmp("model.nlw"), w, ImageSpec{});
  const std::string manifest = read_file(tmp("model.nlw.json"));

  // Trace: truncated, through inspect, solve and replay.
  write_file_atomic(tmp("trunc.h5"), trace_bytes.substr(0, trace_bytes.size() / 2));
  expect_input_error("nl-profile", "inspect " + tmp("trunc.h5"), tmp("trunc.h5"), "truncated");
  expect_input_error("nl-layout", "solve --trace " + tmp("trunc.h5") + " --out " + tmp("x.json"), tmp("trunc.h5"),
                     "truncated");
  CHECK_FALSE(fs::exists(tmp("x.json")));
  expect_input_error("nl-run", "replay --image " + tmp("model.nlw") + " --trace " + tmp("trunc.h5"), tmp("trunc.h5"),
                     "truncated");

  // Layout: not a permutation, through eval.
  Layout l;
  l.method = "identity";
  l.layers.resize(2);
  for (auto& L : l.layers)
    for (uint32_t i = 0; i < 37; ++i) L.order.push_back(i);
  write_file_atomic(tmp("good.json"), layout_to_json(l));
  l.layers[1].order[5] = 6;
  write_file_atomic(tmp("dup.json"), layout_to_json(l));
  expect_input_error("nl-layout", "eval --trace " + tmp("trace.h5") + " --layout " + tmp("dup.json"), tmp("dup.json"),
                     "not a permutation");

  // Model file: size mismatch and absurd header, through profile run.
  write_file_atomic(tmp("short.bin"), model_bytes.substr(0, model_bytes.size() - 8));
  write_file_atomic(tmp("ids.txt"), "1 2 3\n");
  expect_input_error("nl-profile",
                     "-q run --model " + tmp("short.bin") + " --token-ids " + tmp("ids.txt") + " --out " + tmp("p.h5"),
                     tmp("short.bin"), "truncated");
  std::string absurd = model_bytes;
  const int32_t huge = 1 << 30;
  std::memcpy(absurd.data() + 4, &huge, 4);
  write_file_atomic(tmp("absurd.bin"), absurd);
  expect_input_error("nl-profile",
                     "-q run --model " + tmp("absurd.bin") + " --token-ids " + tmp("ids.txt") + " --out " + tmp("p.h5"),
                     tmp("absurd.bin"), "out of range");
  CHECK_FALSE(fs::exists(tmp("p.h5")));

  // Tokenizer: truncated inside a token.
  write_file_atomic(tmp("tok.bin"), std::string("\x10\0\0\0\0\0\0\0\x05\0\0\0ab", 14));
  expect_input_error("nl-profile",
                     "-q run --model " + tmp("model.bin") + " --tokenizer " + tmp("tok.bin") + " --text " +
                         tmp("ids.txt") + " --out " + tmp("p.h5"),
                     tmp("tok.bin"), "truncated");

  // Manifest: future version and an overlap, through generate.
  std::string future = manifest;
  future.replace(future.find("\"version\": 1"), 12, "\"version\": 7");
  write_file_atomic(tmp("model.nlw.json"), future);
  expect_input_error("nl-run", "generate --image " + tmp("model.nlw") + " --steps 2", tmp("model.nlw.json"), "newer");
  write_file_atomic(tmp("model.nlw.json"), manifest);

  // Device profile: wrong type, through eval.
  write_file_atomic(tmp("dev.json"),
                    R"({"format":"neuralink-device","version":1,"read_latency_us":"fast","bandwidth_MBps":1})");
  expect_input_error(
      "nl-layout", "eval --trace " + tmp("trace.h5") + " --device " + tmp("dev.json") + " --layout " + tmp("good.json"),
      tmp("dev.json"), "read_latency_us");
}
