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

TEST_CASE("a commit group renames all outputs together, or none (issue 23)") {
  write_file_atomic("group_a.txt", "old a");
  write_file_atomic("group_b.txt", "old b");
  {
    CommitGroup g;
    write_file_atomic("group_a.txt", "new a");  // written and fsynced, rename deferred
    CHECK(read_file("group_a.txt") == "old a");
    AtomicWriter b("group_b.txt");
    b.write("new b, never finished");
  }  // a failure before commit: every temporary removed, both previous outputs as they were
  CHECK(read_file("group_a.txt") == "old a");
  CHECK(read_file("group_b.txt") == "old b");
  CHECK(!exists("group_a.txt.tmp." + std::to_string(::getpid())));
  CHECK(!exists("group_b.txt.tmp." + std::to_string(::getpid())));
  {
    CommitGroup g;
    write_file_atomic("group_a.txt", "new a");
    write_file_atomic("group_b.txt", "new b");
    CHECK(read_file("group_b.txt") == "old b");
    g.commit();
  }
  CHECK(read_file("group_a.txt") == "new a");
  CHECK(read_file("group_b.txt") == "new b");
  write_file_atomic("group_a.txt", "alone");  // no group: committed at once
  CHECK(read_file("group_a.txt") == "alone");
  ::unlink("group_a.txt");
  ::unlink("group_b.txt");
}

TEST_CASE("a legal 255-byte output name gets a legal temporary name (issue 23)") {
  const std::string name(251, 'n');
  write_file_atomic(name + ".txt", "x");
  CHECK(read_file(name + ".txt") == "x");
  ::unlink((name + ".txt").c_str());
}

TEST_CASE("inputs must be regular files: a FIFO is refused without blocking (issue 23)") {
  ::unlink("input_fifo");
  REQUIRE(::mkfifo("input_fifo", 0600) == 0);
  CHECK_THROWS_AS(read_file("input_fifo"), InputError);
  try {
    read_file("input_fifo");
  } catch (const InputError& e) {
    CHECK(std::string(e.what()).find("input_fifo: is a FIFO, not a regular file") == 0);
  }
  CHECK_THROWS_AS(read_file("/dev/zero"), InputError);
  ::unlink("input_fifo");
}
