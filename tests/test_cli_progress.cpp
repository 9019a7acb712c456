// Progress on long work (formats/core/progress.h) as users see it: plain "stage: done/total unit (100%)" lines
// when stderr is a file, nothing with --quiet, and a redrawn bar ("\r... [###...]") on a terminal (a pty from
// util-linux `script`). Covers the subcommands that loop over layers, tokens or sequences (pack: the image per
// layer, the permuted export per FFN matrix).
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "formats/core/atomic_file.h"
#include "formats/core/image_writer.h"
#include "formats/llama2c.h"
#include "formats/trace.h"
#include "image_test_util.h"
#include "layout/synthetic.h"
#include "skip_util.h"
#include "trace_test_util.h"

namespace fs = std::filesystem;
using namespace nl;

namespace {

int run(const std::string& cmd) {
  int st = std::system((cmd + " > prog_out.txt 2> prog_err.txt").c_str());
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

void write_trace(const std::string& path, uint32_t layers, uint32_t neurons, uint64_t tokens) {
  test::write_clustered_trace(path, layers, neurons, tokens, 3, "progress");
}

}  // namespace

TEST_CASE("progress: plain lines to a file, silence with --quiet, a bar on a terminal") {
  fs::remove_all("prog_tmp");
  fs::create_directories("prog_tmp");
  write_trace("prog_tmp/t.h5", 3, 128, 640);
  ModelConfig c = test::small_config(64, 96, 2);
  image_write_model("prog_tmp/m.nlw", test::random_weights(c, 5), ImageSpec{});
  write_trace("prog_tmp/rt.h5", 2, 96, 64);
  ModelConfig sc = c;
  sc.act = FfnAct::kSilu;  // llama2.c files store SiLU models only
  write_llama2c("prog_tmp/m.bin", test::random_weights(sc, 6));
  const std::string bin = std::string(NL_BINARY_DIR) + "/cli/";
  struct Case {
    std::string cmd, final_line;
  };
  const std::vector<Case> cases = {
      {bin + "nl-layout graph --trace prog_tmp/t.h5 --out prog_tmp/g.h5 --full --tokens 0:320",
       "graph: 3/3 layers (100%)"},
      {bin + "nl-layout graph --trace prog_tmp/t.h5 --out prog_tmp/g2.h5 --full --tokens 320:640",
       "graph: 3/3 layers (100%)"},
      {bin + "nl-layout graph-merge prog_tmp/g.h5 prog_tmp/g2.h5 --out prog_tmp/gm.h5",
       "graph-merge: 3/3 layers (100%)"},
      {bin + "nl-layout solve --trace prog_tmp/t.h5 --method greedy --out prog_tmp/l.json",
       "solve greedy: 3/3 layers (100%)"},
      {bin + "nl-layout eval --trace prog_tmp/t.h5 --layout prog_tmp/l.json", "eval: 3/3 layers (100%)"},
      {bin + "nl-layout report --trace prog_tmp/t.h5 --layout prog_tmp/l.json --layers all --out prog_tmp/r.html",
       "report: 4/4 steps (100%)"},
      {bin + "nl-profile synth --preset " + std::string(NL_SOURCE_DIR) +
           "/configs/workloads/opt-350m.json --layers 1 --neurons 256 --tokens-per-sequence 64 --profile-sequences 2 "
           "--test-sequences 1 --profile-out prog_tmp/sp.h5 --test-out prog_tmp/st.h5",
       "synth test: 64/64 tokens (100%)"},
      {bin + "nl-run generate --image prog_tmp/m.nlw --steps 5 --prompt-tokens 1", "generate: 5/5 tokens (100%)"},
      {bin + "nl-run replay --image prog_tmp/m.nlw --trace prog_tmp/rt.h5", "replay: 64/64 tokens (100%)"},
      {bin + "nl-layout pack --synthetic-shape 64x96 --layers 3 --out prog_tmp/syn.nlw", "pack: 3/3 layers (100%)"},
      {bin + "nl-layout pack --model prog_tmp/m.bin --out prog_tmp/p.nlw --export-permuted prog_tmp/perm.bin",
       "export: 6/6 FFN matrices (100%)"},
  };
  const bool have_script = run("script --version") == 0;
  if (!have_script) nl::test::skip_part("terminal check: util-linux `script` is absent");
  for (const auto& k : cases) {
    INFO(k.cmd);
    REQUIRE(run(k.cmd) == 0);
    std::string err = read_file("prog_err.txt");
    INFO(err);
    CHECK(err.find(k.final_line) != std::string::npos);
    CHECK(err.find('\r') == std::string::npos);  // no bar redraws into a file
    // --quiet: nothing on stderr, same figures on stdout.
    std::string out = read_file("prog_out.txt");
    REQUIRE(run(k.cmd.substr(0, k.cmd.find(' ')) + " --quiet" + k.cmd.substr(k.cmd.find(' '))) == 0);
    CHECK(read_file("prog_err.txt").empty());
    if (!have_script) continue;
    // On a terminal: the bar, redrawn in place with carriage returns.
    REQUIRE(run("script -qec '" + k.cmd + "' /dev/null") == 0);
    std::string tty = read_file("prog_out.txt");
    const std::string stage = k.final_line.substr(0, k.final_line.find(':'));
    CHECK(tty.find("\r" + stage + " [") != std::string::npos);
    CHECK(tty.find("##############################]") != std::string::npos);  // full bar at the end
  }
}
