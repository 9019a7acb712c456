// The doctest main of every test executable, with a listener that reports skips by name: test cases skipped by
// a decorator (tests/skip_util.h) and parts recorded with skip_part are printed at the end of the run and written to
// BINARY_DIR/tests/skipped/<executable>.txt (removed when nothing was skipped), which `./run.sh test` lists. An
// executable whose every test case was skipped exits 77, which CTest reports as skipped (SKIP_RETURN_CODE), not passed.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace {

std::vector<std::string>& skips() {
  static std::vector<std::string> s;
  return s;
}
std::string& current_test() {
  static std::string s;
  return s;
}
bool g_all_skipped = false;

struct SkipListener : doctest::IReporter {
  const doctest::ContextOptions& opt;
  explicit SkipListener(const doctest::ContextOptions& o) : opt(o) {}
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats& st) override {
    if (opt.count || opt.list_test_cases || opt.list_test_suites || opt.list_reporters) return;
    g_all_skipped = st.numTestCasesPassingFilters == 0 && !skips().empty();
    const std::filesystem::path dir = std::filesystem::path(NL_BINARY_DIR) / "tests" / "skipped";
    const std::filesystem::path file = dir / (std::filesystem::path(opt.binary_name.c_str()).stem().string() + ".txt");
    std::error_code ec;
    std::filesystem::remove(file, ec);
    if (skips().empty()) return;
    std::filesystem::create_directories(dir, ec);
    std::ofstream out(file);
    for (const std::string& s : skips()) {
      std::printf("SKIPPED %s\n", s.c_str());
      out << s << "\n";
    }
  }
  void test_case_start(const doctest::TestCaseData& tc) override { current_test() = tc.m_name; }
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats&) override {}
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData& tc) override {
    if (tc.m_skip && !opt.no_skip)  // a skip decorator, not a command-line filter
      skips().push_back("'" + std::string(tc.m_name) + "': " + (tc.m_description ? tc.m_description : "marked skip"));
  }
};

REGISTER_LISTENER("nl_skips", 1, SkipListener);

}  // namespace

namespace nl::test {
void record_skip(const std::string& why) { skips().push_back("part of '" + current_test() + "': " + why); }
}  // namespace nl::test

int main(int argc, char** argv) {
  doctest::Context ctx(argc, argv);
  const int rc = ctx.run();
  if (ctx.shouldExit()) return rc;
  if (rc == 0 && g_all_skipped) {
    std::printf("every test case was skipped (reasons above): exit 77, reported as skipped\n");
    return 77;
  }
  return rc;
}
