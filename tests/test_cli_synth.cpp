// nl-profile synth as a user calls it: traces + JSON stats, byte-identical reruns, one-line errors (exit 3).
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "formats/trace.h"

namespace fs = std::filesystem;

namespace {

struct Result {
  int code;
  std::string out, err;
};

std::string slurp(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string tmp(const std::string& n) { return fs::absolute("cli_synth_tmp/" + n).string(); }

Result run(const std::string& args) {
  fs::create_directories("cli_synth_tmp");
  const std::string o = tmp("stdout"), e = tmp("stderr");
  const int rc =
      std::system((std::string(NL_BINARY_DIR) + "/cli/nl-profile synth " + args + " >" + o + " 2>" + e).c_str());
  return {WEXITSTATUS(rc), slurp(o), slurp(e)};
}

const std::string kPreset = std::string(NL_SOURCE_DIR) + "/configs/workloads/opt-350m.json";
const std::string kShape =
    " --layers 2 --neurons 512 --profile-sequences 6 --test-sequences 3 --tokens-per-sequence 40";

}  // namespace

TEST_CASE("nl-profile synth: profile + test traces, JSON stats, byte-identical rerun") {
  Result r = run("--preset " + kPreset + kShape + " --profile-out " + tmp("p.h5") + " --test-out " + tmp("t.h5") +
                 " --stats --json -q");
  INFO(r.err);
  REQUIRE(r.code == 0);
  auto j = nlohmann::json::parse(r.out);
  CHECK(j["preset"] == "opt-350m");
  CHECK(j["profile"]["tokens"] == 240);
  CHECK(j["test"]["tokens"] == 120);
  CHECK(j["test"]["layers"].size() == 2);
  CHECK(j["test"].contains("read_length_frequency"));
  nl::TraceReader t(tmp("t.h5"));
  CHECK(t.info().n_layers == 2);
  CHECK(t.info().n_neurons[0] == 512);
  CHECK(t.info().sequences == std::vector<int64_t>{0, 40, 80});
  const std::string first = slurp(tmp("p.h5"));
  REQUIRE(run("--preset " + kPreset + kShape + " --profile-out " + tmp("p2.h5") + " -q --threads 1").code == 0);
  CHECK(first == slurp(tmp("p2.h5")));
  REQUIRE(run("--preset " + kPreset + kShape + " --profile-out " + tmp("p3.h5") + " -q --seed 2").code == 0);
  CHECK(first != slurp(tmp("p3.h5")));
}

TEST_CASE("nl-profile synth: bad presets and overrides exit 3 with one line naming the file") {
  fs::create_directories("cli_synth_tmp");
  std::ofstream(tmp("bad.json")) << "{\"format\": \"neuralink-workload\", \"version\": 1}";
  Result r = run("--preset " + tmp("bad.json") + " --profile-out " + tmp("x.h5"));
  CHECK(r.code == 3);
  CHECK(r.err == "nl-profile: error: " + tmp("bad.json") + ": missing key 'name'\n");
  CHECK(!fs::exists(tmp("x.h5")));
  // An override that makes the density unreachable is reported against the preset with the overrides.
  r = run("--preset " + kPreset + " --active-fraction 0.99 --profile-out " + tmp("x.h5"));
  CHECK(r.code == 3);
  CHECK(r.err.find("(with command-line overrides)") != std::string::npos);
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  CHECK(!fs::exists(tmp("x.h5")));
  r = run("--preset " + kPreset);  // --profile-out missing
  CHECK(r.code == 2);
}

TEST_CASE("nl-profile synth: structure overrides change the trace and are validated") {
  auto stats = [](const std::string& extra) {
    Result r = run("--preset " + kPreset + kShape + " --profile-out " + tmp("s.h5") + " --stats --json -q" + extra);
    INFO(r.err);
    REQUIRE(r.code == 0);
    return nlohmann::json::parse(r.out)["profile"];
  };
  const auto base = stats("");
  // Stickier state bits: higher token-to-token persistence, about the same density.
  const auto sticky = stats(" --stay-group 0.98 --stay-neuron 0.98");
  CHECK(sticky["persistence"].get<double>() > base["persistence"].get<double>() + 0.05);
  // All firing from background bits: the target density still holds.
  const auto noise = stats(" --background-share 1");
  CHECK(noise["active_fraction"].get<double>() == doctest::Approx(base["active_fraction"].get<double>()).epsilon(0.2));
  // Out of range on the command line: usage error (exit 2); valid alone but inconsistent with the preset: exit 3.
  Result r = run("--preset " + kPreset + kShape + " --profile-out " + tmp("x.h5") + " --fire-probability 1.5");
  CHECK(r.code == 2);
  r = run("--preset " + kPreset + kShape + " --profile-out " + tmp("x.h5") + " --group-count 1 --groups-per-neuron 2");
  CHECK(r.code == 3);
  CHECK(r.err.find("groups.per_neuron must not exceed groups.count") != std::string::npos);
  CHECK(r.err.find("(with command-line overrides)") != std::string::npos);
  CHECK(!fs::exists(tmp("x.h5")));
}
