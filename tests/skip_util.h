// Skips that say so: a test case that cannot run here is marked skipped by name with its reason (doctest counts it
// as skipped, never as passed), and a part of a test that cannot run is recorded. tests/doctest_main.cpp prints
// every reason and writes them to BINARY_DIR/tests/skipped/<test>.txt, which `./run.sh test` lists at the end.
#pragma once
#include <doctest/doctest.h>

#include <cstdlib>
#include <deque>
#include <filesystem>
#include <initializer_list>
#include <string>

namespace nl::test {

void record_skip(const std::string& why);  // defined in doctest_main.cpp

// A test-case decorator: skip (with `why` as the description the summary prints) unless `ok`.
struct SkipUnless {
  bool ok;
  std::string why;
  const char* stable() const {
    static std::deque<std::string> keep;  // doctest keeps the pointer for the whole run
    return keep.emplace_back(why).c_str();
  }
  void fill(doctest::detail::TestCase& tc) const {
    if (!ok) tc.m_skip = true, tc.m_description = stable();
  }
  void fill(doctest::detail::TestSuite& ts) const {
    if (!ok) ts.m_skip = true, ts.m_description = stable();
  }
};

inline SkipUnless skip_unless(bool ok, std::string why) { return {ok, std::move(why)}; }

// The pretrained third-party models (NL_MODELS_DIR: bundled in datasets/, datasets/SOURCES.md): tests of those exact
// models skip only when NL_MODELS_DIR was pointed somewhere that lacks them.
inline SkipUnless needs_models(std::initializer_list<const char*> rel) {
  for (const char* r : rel) {
    const std::string p = std::string(NL_MODELS_DIR) + "/" + r;
    if (!std::filesystem::exists(p))
      return {false, p + " is absent (-DNL_MODELS_DIR points where the models are not; the default is datasets/)"};
  }
  return {true, ""};
}

inline SkipUnless needs_file(const std::string& path, const std::string& what) {
  return {std::filesystem::exists(path), path + " is absent (" + what + ")"};
}

// Whether NL_PYTHON imports `modules` (comma-separated), as a decorator.
inline bool python_has(const std::string& modules) {
  return std::system((std::string(NL_PYTHON) + " -c 'import " + modules + "' >/dev/null 2>&1").c_str()) == 0;
}
inline SkipUnless needs_python(const std::string& modules, const std::string& package) {
  return {python_has(modules), std::string(NL_PYTHON) + " lacks " + modules + " (install " + package + ")"};
}

// A part of a running test that cannot run here: printed and recorded (the rest of the test has run).
inline void skip_part(const std::string& why) {
  MESSAGE("SKIPPED part: " << why);
  record_skip(why);
}

}  // namespace nl::test
