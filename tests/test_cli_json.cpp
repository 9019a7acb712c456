// --json audit: every subcommand of the three binaries (discovered from their --help, so a new subcommand
// cannot slip through) either prints figures and then accepts --json and prints one JSON document on stdout, or
// is listed here as printing none. Runs each one on small real inputs.
#include <doctest/doctest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>

#include "formats/core/atomic_file.h"
#include "formats/core/image_writer.h"
#include "formats/trace.h"
#include "image_test_util.h"
#include "layout/synthetic.h"
#include "trace_test_util.h"

namespace fs = std::filesystem;
using namespace nl;

namespace {

int run(const std::string& bin, const std::string& args, std::string* out = nullptr) {
  std::string cmd = std::string(NL_BINARY_DIR) + "/cli/" + bin + " " + args + " > json_out.txt 2> json_err.txt";
  int st = std::system(cmd.c_str());
  if (out) *out = read_file("json_out.txt");
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

// Subcommand names from CLI11's help ("SUBCOMMANDS:" then indented "name  description" lines).
std::set<std::string> subcommands(const std::string& bin) {
  std::string help;
  REQUIRE(run(bin, "--help", &help) == 0);
  std::set<std::string> out;
  std::istringstream in(help);
  bool in_section = false;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("SUBCOMMANDS", 0) == 0 || line.rfind("Subcommands", 0) == 0) {
      in_section = true;
      continue;
    }
    if (!in_section) continue;
    if (line.empty() || line[0] != ' ') {
      in_section = !line.empty() ? false : in_section;
      continue;
    }
    std::istringstream w(line);
    std::string name;
    w >> name;
    if (!name.empty()) out.insert(name);
  }
  return out;
}

void write_trace(const std::string& path, uint32_t layers, uint32_t neurons, uint64_t tokens) {
  test::write_clustered_trace(path, layers, neurons, tokens, 7, "json-audit");
}

}  // namespace

TEST_CASE("every subcommand that prints figures accepts --json and prints JSON") {
  // Any real model will do: the bundled tiny ReLU model.
  const std::string bin = std::string(NL_SOURCE_DIR) + "/datasets/tiny-relu/model", tok = bin + "/tokenizer.model";
  fs::remove_all("json_tmp");
  fs::create_directories("json_tmp");
  write_trace("json_tmp/t.h5", 2, 128, 640);
  {
    std::ofstream ids("json_tmp/ids.txt");
    for (int d = 0; d < 3; ++d) {
      for (int i = 0; i < 40; ++i) ids << (i ? " " : "") << 3 + (d * 37 + i * 11) % 500;
      ids << "\n";
    }
  }
  // A small flash image and a trace of its shape for nl-run generate / replay.
  ModelConfig c = test::small_config(64, 96, 2);
  image_write_model("json_tmp/m.nlw", test::random_weights(c, 5), ImageSpec{});
  write_trace("json_tmp/rt.h5", 2, 96, 64);
  // The second slice of t.h5's counts, for graph-merge (slices of one trace must not overlap).
  REQUIRE(run("nl-layout", "-q graph --trace json_tmp/t.h5 --out json_tmp/g2.h5 --full --tokens 320:640") == 0);

  // Invocations (run in order: later ones use earlier outputs); "" = prints no figures, so no --json needed.
  const std::vector<std::pair<std::string, std::string>> table = {
      {"nl-profile run", "run --model " + bin + " --token-ids json_tmp/ids.txt --seq-len 32 --out json_tmp/p.h5"},
      {"nl-profile convert", "convert --model " + bin + " --out json_tmp/hf"},
      {"nl-profile generate", "generate --model " + bin + " --tokenizer " + tok + " --steps 8"},
      {"nl-profile inspect", "inspect json_tmp/t.h5"},
      {"nl-profile decode", "decode --tokenizer " + tok + " --ids \"1 403 407\""},
      {"nl-profile synth", "synth --preset " + std::string(NL_SOURCE_DIR) +
                               "/configs/workloads/opt-350m.json --layers 1 --neurons 256 --tokens-per-sequence 64 "
                               "--profile-sequences 2 --test-sequences 1 --profile-out json_tmp/sp.h5 --test-out "
                               "json_tmp/st.h5 --stats"},
      {"nl-profile merge", "merge json_tmp/t.h5 json_tmp/t.h5 --out json_tmp/tm.h5"},
      {"nl-layout graph", "graph --trace json_tmp/t.h5 --out json_tmp/g.h5 --full --tokens 0:320"},
      {"nl-layout graph-merge", "graph-merge json_tmp/g.h5 json_tmp/g2.h5 --out json_tmp/gm.h5"},
      {"nl-layout solve", "solve --trace json_tmp/t.h5 --method greedy --out json_tmp/l.json"},
      {"nl-layout eval", "eval --trace json_tmp/t.h5 --layout json_tmp/l.json"},
      {"nl-layout report", "report --trace json_tmp/t.h5 --layout json_tmp/l.json --out json_tmp/r.html"},
      {"nl-layout pack", "pack --model " + bin + " --out json_tmp/pack.nlw"},
      {"nl-run probe", "probe --file json_tmp/probe.bin --file-mib 64 --seconds-per-point 0.01"},
      {"nl-run generate", "generate --image json_tmp/m.nlw --steps 4 --prompt-tokens 1"},
      {"nl-run replay", "replay --image json_tmp/m.nlw --trace json_tmp/rt.h5"},
  };
  std::map<std::string, std::string> known(table.begin(), table.end());
  std::set<std::string> present;
  for (const char* b : {"nl-profile", "nl-layout", "nl-run"})
    for (const auto& s : subcommands(b)) {
      present.insert(std::string(b) + " " + s);
      CHECK_MESSAGE(known.count(std::string(b) + " " + s),
                    b << " " << s << ": new subcommand; give it --json and an entry here");
    }
  CHECK(present.size() >= 12);
  int checked = 0;
  for (const auto& [name, args] : table) {
    if (!present.count(name) || args.empty()) continue;
    std::string out;
    const std::string b = name.substr(0, name.find(' '));
    int rc = run(b, "-q " + args + " --json", &out);
    INFO(name << ": " << read_file("json_err.txt"));
    CHECK(rc == 0);
    nlohmann::json j;
    CHECK_NOTHROW(j = nlohmann::json::parse(out));
    CHECK_MESSAGE((j.is_object() && !j.empty()), name << " printed: " << out.substr(0, 200));
    ++checked;
  }
  MESSAGE(checked << " subcommands printed JSON");
}

TEST_CASE("pack --json escapes file names (quotes, backslashes) and reports the image it wrote") {
  fs::create_directories("json_tmp");
  const std::string name = "json_tmp/a\"b\\c.nlw";  // a"b\c.nlw, single-quoted for the shell
  std::string out;
  REQUIRE(run("nl-layout", "-q pack --synthetic-shape 64x96 --layers 2 --out '" + name + "' --json", &out) == 0);
  nlohmann::json j;
  REQUIRE_NOTHROW(j = nlohmann::json::parse(out));
  CHECK(j["image"] == name);
  CHECK(j["manifest"] == name + ".json");
  CHECK(j["image_bytes"].get<uint64_t>() == fs::file_size(name));
  CHECK(j["bundle_bytes"] == 2 * 64 * 2);  // plain bundles (up row + down column), f16
  CHECK(j["layers"] == 2);
  CHECK(j["dtype"] == "f16");
}
