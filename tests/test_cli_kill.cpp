// Atomic outputs under SIGKILL: nl-profile run, nl-layout solve and nl-layout pack are killed mid-write; the final
// name must then hold either the previous output, byte for byte, or a complete new one, never a partial file.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "formats/core/atomic_file.h"
#include "formats/layout.h"
#include "formats/llama2c.h"
#include "formats/trace.h"
#include "model_test_util.h"

namespace fs = std::filesystem;
using namespace nl;

namespace {

std::string tmp(const std::string& n) {
  fs::create_directories("cli_kill_tmp");
  return fs::absolute("cli_kill_tmp/" + n).string();
}

pid_t spawn(const std::string& binary, const std::vector<std::string>& args) {
  std::vector<std::string> argv = {std::string(NL_BINARY_DIR) + "/cli/" + binary};
  argv.insert(argv.end(), args.begin(), args.end());
  std::fflush(stdout);  // else the child flushes a copy of our buffered output when it reopens stdout
  std::fflush(stderr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    std::vector<char*> p;
    for (auto& a : argv) p.push_back(a.data());
    p.push_back(nullptr);
    const std::string log = tmp(binary + ".log");
    (void)!std::freopen(log.c_str(), "w", stdout);
    (void)!std::freopen(log.c_str(), "a", stderr);
    ::execv(p[0], p.data());
    ::_exit(127);
  }
  REQUIRE(pid > 0);
  return pid;
}

// Waits for the child; returns its exit code, or -signal if a signal ended it.
int reap(pid_t pid) {
  int st = 0;
  REQUIRE(::waitpid(pid, &st, 0) == pid);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
}

bool exists_nonempty(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && st.st_size > 0;
}

// Waits until the child's temporary output (AtomicPath: "<final>.tmp.<pid>") holds bytes, then SIGKILLs it.
// Returns false when the child finished first.
bool kill_mid_write(pid_t pid, const std::string& final_path) {
  const std::string temp = final_path + ".tmp." + std::to_string(pid);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline) {
    if (exists_nonempty(temp)) {
      ::kill(pid, SIGKILL);
      return true;
    }
    int st = 0;
    if (::waitpid(pid, &st, WNOHANG) == pid) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  ::kill(pid, SIGKILL);
  return true;
}

}  // namespace

TEST_CASE("SIGKILL during nl-profile run leaves the previous trace intact and no partial file") {
  // Any real model will do: the bundled tiny ReLU model.
  const std::string bin = std::string(NL_SOURCE_DIR) + "/datasets/tiny-relu/model";
  const std::string tok = bin + "/tokenizer.model";
  {
    std::ofstream t(tmp("story.txt"));
    for (int i = 0; i < 3000; ++i)
      t << "Once upon a time, there was a little dog named Spot " << i << ". He liked to play in the park.\n\n";
  }
  const std::vector<std::string> small = {
      "run",          "-q",  "--model",   bin,  "--tokenizer", tok,        "--text", tmp("story.txt"),
      "--max-tokens", "300", "--seq-len", "64", "--out",       tmp("p.h5")};
  REQUIRE(reap(spawn("nl-profile", small)) == 0);
  const std::string before = read_file(tmp("p.h5"));
  REQUIRE(TraceReader(tmp("p.h5")).info().n_tokens > 0);

  // The same output name, a much longer run (token by token): killed while its temporary file is being written.
  std::vector<std::string> big = small;
  big[9] = "200000";
  big.insert(big.end(), {"--batch", "1"});
  pid_t pid = spawn("nl-profile", big);
  const bool killed = kill_mid_write(pid, tmp("p.h5"));
  const int rc = reap(pid);
  REQUIRE_MESSAGE(killed, "nl-profile finished before it could be killed (exit " << rc << ")");
  CHECK(rc == -SIGKILL);
  CHECK(read_file(tmp("p.h5")) == before);  // previous output intact, byte for byte
  CHECK_NOTHROW(TraceReader(tmp("p.h5")));

  // No previous output: nothing at all appears under the final name.
  big[13] = tmp("fresh.h5");
  pid = spawn("nl-profile", big);
  REQUIRE(kill_mid_write(pid, tmp("fresh.h5")));
  CHECK(reap(pid) == -SIGKILL);
  CHECK_FALSE(fs::exists(tmp("fresh.h5")));
}

TEST_CASE("SIGKILL at any moment of nl-layout solve: the final name holds the old or a complete new layout") {
  // A trace big enough that solving takes a noticeable time.
  std::vector<LayerMask> masks;
  TraceWriterOptions o;
  o.model = "kill";
  o.activation = "synthetic";
  for (uint32_t l = 0; l < 2; ++l) {
    LayerMask m(1024, 2048);
    uint64_t x = 88172645463325252ull + l;
    for (uint32_t n = 0; n < 1024; ++n)
      for (uint64_t t = 0; t < 2048; ++t) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        if (x % 16 == 0 || (n / 32 == t % 32 && x % 3 == 0)) m.set(n, t);
      }
    masks.push_back(std::move(m));
    o.n_neurons.push_back(1024);
  }
  trace_write(tmp("solve.h5"), o, masks, {0});
  const std::string out = tmp("layout.json");
  REQUIRE(reap(spawn("nl-layout", {"-q", "solve", "--trace", tmp("solve.h5"), "--method", "identity", "--out", out})) ==
          0);
  const std::string before = read_file(out);
  int killed_running = 0;
  for (int delay_ms : {0, 5, 20, 50, 100, 200, 400, 800, 1600}) {
    const pid_t pid =
        spawn("nl-layout", {"-q", "solve", "--trace", tmp("solve.h5"), "--method", "greedy+ls", "--out", out});
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    ::kill(pid, SIGKILL);
    const int rc = reap(pid);
    killed_running += rc == -SIGKILL;
    const std::string now = read_file(out);
    if (now != before) {
      // The new layout was renamed into place before the kill: it must be whole and valid. The process may still
      // have been running (printing its summary, exiting) when the kill came, so rc is 0 or SIGKILL.
      CHECK((rc == 0 || rc == -SIGKILL));
      CHECK_NOTHROW(layout_load(out));
      break;
    }
  }
  CHECK(killed_running > 0);
}

TEST_CASE("SIGKILL during nl-layout pack leaves the previous image and manifest intact") {
  // A model big enough (about 40 MB of weights) that writing its image takes a while.
  ModelConfig c = test::small_config();
  c.dim = 256;
  c.hidden_dim = 1024;
  c.n_layers = 8;
  c.n_heads = 8;
  c.n_kv_heads = 8;
  c.vocab_size = 512;
  write_llama2c(tmp("big.bin"), test::random_weights(c, 7));
  const std::string img = tmp("big.nlw");
  REQUIRE(reap(spawn("nl-layout", {"-q", "pack", "--model", tmp("big.bin"), "--out", img})) == 0);
  const std::string image_before = read_file(img), manifest_before = read_file(img + ".json");

  // Another dtype: a different image under the same names, killed while the image is being written.
  pid_t pid = spawn("nl-layout", {"-q", "pack", "--model", tmp("big.bin"), "--dtype", "f16", "--out", img});
  const bool killed = kill_mid_write(pid, img);
  const int rc = reap(pid);
  REQUIRE_MESSAGE(killed, "nl-layout pack finished before it could be killed (exit " << rc << ")");
  CHECK(rc == -SIGKILL);
  CHECK(read_file(img) == image_before);
  CHECK(read_file(img + ".json") == manifest_before);

  pid = spawn("nl-layout", {"-q", "pack", "--model", tmp("big.bin"), "--out", tmp("fresh.nlw")});
  REQUIRE(kill_mid_write(pid, tmp("fresh.nlw")));
  CHECK(reap(pid) == -SIGKILL);
  CHECK_FALSE(fs::exists(tmp("fresh.nlw")));
  CHECK_FALSE(fs::exists(tmp("fresh.nlw.json")));
}
