#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>

#include "formats/core/atomic_file.h"
#include "formats/core/error.h"

using namespace nl;

static bool exists(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0;
}

TEST_CASE("atomic writer replaces the output only on commit") {
  std::string p = "atomic_test_out.txt";
  write_file_atomic(p, "old");
  {
    AtomicWriter w(p);
    w.write("new content that is never committed");
    CHECK(read_file(p) == "old");  // the old file is untouched while writing
  }                                // destroyed without commit: temp removed
  CHECK(read_file(p) == "old");
  CHECK(!exists(p + ".tmp." + std::to_string(::getpid())));
  {
    AtomicWriter w(p);
    w.write("abc");
    w.pad_to(8);
    CHECK(w.offset() == 8);
    w.commit();
  }
  CHECK(read_file(p) == std::string("abc\0\0\0\0\0", 8));
  ::unlink(p.c_str());
}

TEST_CASE("read_file errors name the file") {
  try {
    read_file("/nonexistent/dir/x");
    FAIL("no error");
  } catch (const IoError& e) {
    CHECK(std::string(e.what()).find("/nonexistent/dir/x: cannot open") == 0);
  }
  write_file_atomic("big.txt", std::string(100, 'x'));
  CHECK_THROWS_AS(read_file("big.txt", 10), InputError);
  ::unlink("big.txt");
}

TEST_CASE("writing into a missing directory is an I/O error, not a crash") {
  CHECK_THROWS_AS(write_file_atomic("/nonexistent/dir/out.json", "x"), IoError);
}
