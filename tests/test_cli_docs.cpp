// docs/cli.md cannot rot: every subcommand of the three binaries (from their --help) has a section, every option
// it accepts is named in that section, and the worked example's shell block runs as written (from a scratch
// "repository root" whose build/ and datasets/ point at this build and the bundled models).
#include <doctest/doctest.h>
#include <sys/wait.h>

#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <sstream>
#include <string>

#include "formats/core/atomic_file.h"
#include "skip_util.h"

namespace fs = std::filesystem;

namespace {

int run(const std::string& cmd, std::string* out = nullptr) {
  int st = std::system((cmd + " > docs_out.txt 2> docs_err.txt").c_str());
  if (out) *out = nl::read_file("docs_out.txt");
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

std::string help(const std::string& bin, const std::string& sub) {
  std::string out;
  REQUIRE(run(std::string(NL_BINARY_DIR) + "/cli/" + bin + " " + sub + " --help", &out) == 0);
  return out;
}

std::set<std::string> subcommands(const std::string& bin) {
  std::istringstream in(help(bin, ""));
  std::set<std::string> out;
  bool in_section = false;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("SUBCOMMANDS", 0) == 0 || line.rfind("Subcommands", 0) == 0) {
      in_section = true;
    } else if (in_section && !line.empty() && line[0] == ' ') {
      std::istringstream w(line);
      std::string name;
      w >> name;
      out.insert(name);
    } else if (!line.empty()) {
      in_section = false;
    }
  }
  return out;
}

// Long options listed in a subcommand's help (the first token of lines that start with an option).
std::set<std::string> options(const std::string& text) {
  std::set<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    size_t i = line.find_first_not_of(' ');
    if (i == std::string::npos || i == 0 || line[i] != '-') continue;
    std::string tok = line.substr(i, line.find(' ', i) - i);
    size_t p = tok.find("--");
    if (p == std::string::npos) continue;
    std::string name = tok.substr(p);
    name = name.substr(0, name.find_first_of(",=:{"));  // CLI11 prints negated flags as --flag{false}
    out.insert(name);
  }
  for (const char* g : {"--help", "--quiet", "--json", "--threads", "--version"}) out.erase(g);
  return out;
}

// `opt` occurs as a whole option name (not as the prefix of a longer one).
bool names(const std::string& text, const std::string& opt) {
  for (size_t p = text.find(opt); p != std::string::npos; p = text.find(opt, p + 1)) {
    char next = p + opt.size() < text.size() ? text[p + opt.size()] : ' ';
    if (!(std::isalnum(static_cast<unsigned char>(next)) || next == '-')) return true;
  }
  return false;
}

}  // namespace

TEST_CASE("docs/cli.md names every subcommand and option") {
  const std::string doc = nl::read_file(std::string(NL_SOURCE_DIR) + "/docs/cli.md");
  int subs = 0, opts = 0;
  for (const char* bin : {"nl-profile", "nl-layout", "nl-run"})
    for (const auto& sub : subcommands(bin)) {
      const std::string head = std::string("### `") + bin + " " + sub;
      size_t a = doc.find(head);
      while (a != std::string::npos && doc[a + head.size()] != ' ' && doc[a + head.size()] != '`')
        a = doc.find(head, a + 1);
      CHECK_MESSAGE(a != std::string::npos, "docs/cli.md has no section '" << head << "'");
      if (a == std::string::npos) continue;
      ++subs;
      size_t b = doc.find("\n## ", a);
      size_t c = doc.find("\n### ", a + 1);
      std::string section = doc.substr(a, std::min(b, c) - a);
      for (const auto& o : options(help(bin, sub))) {
        CHECK_MESSAGE(names(section, o), "docs/cli.md section '" << head << "' does not name " << o);
        ++opts;
      }
    }
  MESSAGE(subs << " subcommands, " << opts << " options checked against docs/cli.md");
  CHECK(subs >= 12);
}

TEST_CASE("the worked example in docs/cli.md runs as written" *
          nl::test::needs_file("/usr/share/common-licenses/GPL-3", "Debian base-files, the example's text")) {
  const std::string doc = nl::read_file(std::string(NL_SOURCE_DIR) + "/docs/cli.md");
  size_t h = doc.find("## Worked example");
  REQUIRE(h != std::string::npos);
  size_t a = doc.find("```sh\n", h), b = doc.find("\n```", a + 6);
  REQUIRE(a != std::string::npos);
  const std::string block = doc.substr(a + 6, b - a - 6 + 1);
  // Scratch layout mirroring a checkout: root/build -> this build, root/datasets -> the bundled model.
  fs::remove_all("docs_ex");
  fs::create_directories("docs_ex/root");
  fs::create_directory_symlink(fs::absolute(NL_BINARY_DIR), "docs_ex/root/build");
  fs::create_directory_symlink(std::string(NL_SOURCE_DIR) + "/datasets", "docs_ex/root/datasets");
  nl::write_file_atomic("docs_ex/example.sh", block);
  std::string out;
  int rc = run("(cd docs_ex/root && bash -euo pipefail ../example.sh)", &out);
  INFO(block << "\n--- stdout:\n" << out << "\n--- stderr:\n" << nl::read_file("docs_err.txt"));
  REQUIRE(rc == 0);
  // Issue 57: the documented path is clean (pack warned that the layout was solved for other bundles).
  CHECK(nl::read_file("docs_err.txt").find("warning") == std::string::npos);
  // What the reader is told to expect: a profile, layouts, the eval table with the gate, the report page.
  for (const char* f : {"profile.h5", "test.h5", "identity.json", "greedy.json", "greedy-ls.json", "packed.json",
                        "report.html", "model.nlw", "model.nlw.json"})
    CHECK_MESSAGE(fs::exists(std::string("docs_ex/root/example/") + f), f);
  CHECK(out.find("gate ok: greedy+ls.io_ms <= identity.io_ms") != std::string::npos);
  CHECK(out.find("wrote report.html") != std::string::npos);
  // The sentence: the last line, decoded from the ids generated from the flash image.
  std::string text = out.substr(0, out.size() - 1);
  text = text.substr(text.rfind('\n') + 1);
  MESSAGE("generated from the flash image: " << text);
  size_t letters = 0;
  for (char ch : text) letters += std::isalpha(static_cast<unsigned char>(ch)) != 0;
  CHECK(letters >= 20);
}
