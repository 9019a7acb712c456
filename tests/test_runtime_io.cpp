// I/O engines on real files: every engine returns the file's bytes for scattered and contiguous spans, with
// O_DIRECT on the build disk and the buffered fallback on tmpfs; injected short reads are resumed, injected EIO,
// EOF and a file truncated under a running engine give clear errors.
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <random>

#include "formats/core/atomic_file.h"
#include "formats/core/error.h"
#include "runtime/io/engine.h"
#include "runtime/io/file.h"

using namespace nl;

namespace {

std::string make_file(const std::string& path, size_t bytes, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string s(bytes, '\0');
  for (auto& ch : s) ch = char(rng());
  write_file_atomic(path, s);
  return s;
}

const IoKind kAll[] = {IoKind::kPread, IoKind::kPreadv, IoKind::kUring, IoKind::kMmap};

// Spans of whole blocks: runs of contiguous spans (so preadv/uring can batch), gaps between runs.
struct Plan {
  std::vector<ReadSpan> spans;
  AlignedBuffer buf;
};
Plan make_plan(size_t file_bytes, uint64_t seed, size_t n_runs) {
  std::mt19937_64 rng(seed);
  Plan p;
  std::vector<std::pair<uint64_t, uint64_t>> want;  // offset, bytes
  uint64_t total = 0;
  const uint64_t blocks = file_bytes / kIoBlock;
  for (size_t r = 0; r < n_runs; ++r) {
    uint64_t len = 1 + rng() % 4, b0 = rng() % (blocks - len * 2);
    for (uint64_t k = 0; k < len; ++k) {
      uint64_t bytes = kIoBlock * (1 + (rng() % 2 ? 1 : 0));
      if ((b0 + 2) * kIoBlock + bytes > file_bytes) break;
      want.push_back({b0 * kIoBlock, bytes});
      b0 += bytes / kIoBlock;
      total += bytes;
    }
  }
  p.buf.resize(total);
  uint64_t at = 0;
  for (auto [o, b] : want) {
    p.spans.push_back({o, b, p.buf.data() + at});
    at += b;
  }
  return p;
}

void check_plan(const Plan& p, const std::string& content) {
  size_t bad = 0;
  for (const auto& s : p.spans)
    if (std::memcmp(s.dst, content.data() + s.offset, s.bytes) != 0) ++bad;
  CHECK(bad == 0);
}

struct Fault : IoFaults {
  enum Kind { kShort, kEio, kEofFrom } kind;
  uint64_t at;
  uint64_t hits = 0;
  Fault(Kind k, uint64_t a) : kind(k), at(a) {}
  int64_t filter(uint64_t call, uint64_t, uint64_t, int64_t res) override {
    if (kind == kEofFrom && call >= at) {
      ++hits;
      return res > 0 ? std::min<int64_t>(res, 1000) : res;  // from here on the file "ends" within every read
    }
    if (call != at || res <= 0) return res;
    ++hits;
    if (kind == kShort) return res / 3;  // transient: fewer bytes than asked, not block-aligned
    return -EIO;
  }
};

}  // namespace

TEST_CASE("every engine reads the file's bytes, direct on disk and buffered on tmpfs") {
  const std::string disk = "io_test_data.bin";
  const std::string content = make_file(disk, 4 << 20, 1);
  std::vector<std::string> where = {disk};
  struct stat st {};
  const std::string shm = "/dev/shm/nl_io_test_" + std::to_string(::getpid()) + ".bin";
  if (::stat("/dev/shm", &st) == 0) {
    write_file_atomic(shm, content);
    where.push_back(shm);
  }
  for (const auto& path : where) {
    for (IoKind k : kAll) {
      CAPTURE(path);
      const std::string kind_name = io_kind_name(k);
      CAPTURE(kind_name);
      std::vector<std::string> notes;
      IoOptions o;
      o.kind = k;
      o.queue_depth = 8;
      o.warn = [&](const std::string& s) { notes.push_back(s); };
      auto e = io_open(path, o);
      Plan p = make_plan(content.size(), 3, 300);
      e->read(p.spans.data(), p.spans.size());
      check_plan(p, content);
      Plan p2 = make_plan(content.size(), 4, 50);  // a second batch on the same engine
      e->read(p2.spans.data(), p2.spans.size());
      check_plan(p2, content);
      CHECK(e->counters().spans == p.spans.size() + p2.spans.size());
      if (k == IoKind::kMmap) {
        CHECK(!e->direct());
      } else if (path == disk) {
        CHECK(e->direct());  // ext4 accepts O_DIRECT
        CHECK(notes.empty());
      } else {
        // tmpfs refuses O_DIRECT before Linux 6.6 (one notice, buffered reads); newer kernels accept it.
        CHECK(notes.size() == (e->direct() ? 0u : 1u));
        if (!notes.empty()) CHECK(notes[0].find("O_DIRECT") != std::string::npos);
      }
    }
  }
  if (where.size() > 1) ::unlink(shm.c_str());
}

TEST_CASE("O_DIRECT refused at read time (EINVAL) falls back to buffered reads once, with one notice") {
  const std::string path = "io_test_einval.bin";
  const std::string content = make_file(path, 1 << 20, 12);
  struct Einval : IoFaults {
    int64_t filter(uint64_t call, uint64_t, uint64_t, int64_t res) override { return call == 0 ? -EINVAL : res; }
  };
  for (IoKind k : {IoKind::kPread, IoKind::kPreadv, IoKind::kUring}) {
    const std::string kind_name = io_kind_name(k);
    CAPTURE(kind_name);
    Einval f;
    std::vector<std::string> notes;
    IoOptions o;
    o.kind = k;
    o.faults = &f;
    o.warn = [&](const std::string& s) { notes.push_back(s); };
    auto e = io_open(path, o);
    REQUIRE(e->direct());
    Plan p = make_plan(content.size(), 13, 30);
    e->read(p.spans.data(), p.spans.size());
    check_plan(p, content);
    CHECK(!e->direct());
    CHECK(notes.size() == 1);
  }
}

TEST_CASE("preadv and uring batch contiguous spans into one call; pread issues one per span") {
  const std::string path = "io_test_batch.bin";
  const std::string content = make_file(path, 1 << 20, 2);
  AlignedBuffer buf(64 * kIoBlock);
  std::vector<ReadSpan> spans;
  for (int i = 0; i < 64; ++i) spans.push_back({uint64_t(100 + i) * kIoBlock, kIoBlock, buf.data() + i * kIoBlock});
  for (IoKind k : {IoKind::kPread, IoKind::kPreadv, IoKind::kUring}) {
    IoOptions o;
    o.kind = k;
    auto e = io_open(path, o);
    e->read(spans.data(), spans.size());
    CHECK(std::memcmp(buf.data(), content.data() + 100 * kIoBlock, 64 * kIoBlock) == 0);
    if (k == IoKind::kUring && e->kind() != IoKind::kUring) MESSAGE("io_uring unavailable here: uring ran as pread");
    if (e->kind() == IoKind::kPread)
      CHECK(e->counters().calls == 64);
    else
      CHECK(e->counters().calls == 1);
  }
}

TEST_CASE("injected faults: short reads are resumed, EIO and EOF are clear errors") {
  const std::string path = "io_test_faults.bin";
  const std::string content = make_file(path, 2 << 20, 5);
  for (IoKind k : kAll) {
    const std::string kind_name = io_kind_name(k);
    CAPTURE(kind_name);
    IoOptions o;
    o.kind = k;
    o.queue_depth = 4;
    {
      Fault f(Fault::kShort, 7);
      o.faults = &f;
      auto e = io_open(path, o);
      Plan p = make_plan(content.size(), 9, 40);
      if (k == IoKind::kMmap) {
        // A memcpy cannot come up short: for mmap a short transfer means the file ended.
        CHECK_THROWS_AS(e->read(p.spans.data(), p.spans.size()), InputError);
      } else {
        e->read(p.spans.data(), p.spans.size());
        CHECK(f.hits == 1);
        check_plan(p, content);
      }
    }
    {
      Fault f(Fault::kEio, 5);
      o.faults = &f;
      auto e = io_open(path, o);
      Plan p = make_plan(content.size(), 10, 40);
      std::string msg;
      try {
        e->read(p.spans.data(), p.spans.size());
      } catch (const IoError& err) {
        msg = err.what();
      }
      CHECK(msg.find(path + ": ") == 0);
      CHECK(msg.find("Input/output error") != std::string::npos);
    }
    {
      Fault f(Fault::kEofFrom, 3);
      o.faults = &f;
      auto e = io_open(path, o);
      Plan p = make_plan(content.size(), 11, 40);
      std::string msg;
      try {
        e->read(p.spans.data(), p.spans.size());
      } catch (const InputError& err) {
        msg = err.what();
      }
      CHECK(msg.find(path + ": truncated") == 0);
    }
  }
}

TEST_CASE("a file truncated under a running engine gives a truncation error, not stale bytes") {
  // mmap: the pages past the new end raise SIGBUS, which the engine turns into the same error.
  for (IoKind k : {IoKind::kPread, IoKind::kPreadv, IoKind::kUring, IoKind::kMmap}) {
    const std::string kind_name = io_kind_name(k);
    CAPTURE(kind_name);
    const std::string path = std::string("io_test_trunc_") + io_kind_name(k) + ".bin";
    make_file(path, 1 << 20, 6);
    IoOptions o;
    o.kind = k;
    auto e = io_open(path, o);
    REQUIRE(::truncate(path.c_str(), 512 << 10) == 0);
    AlignedBuffer buf(2 * kIoBlock);
    ReadSpan s{(600u << 10), 2 * kIoBlock, buf.data()};
    CHECK_THROWS_WITH_AS(e->read(&s, 1), doctest::Contains("truncated"), InputError);
    ReadSpan edge{(512u << 10) - kIoBlock, 2 * kIoBlock, buf.data()};  // straddles the new end
    CHECK_THROWS_AS(e->read(&edge, 1), InputError);
  }
}

TEST_CASE("a misaligned span under O_DIRECT is a planner bug, reported as such") {
  const std::string path = "io_test_align.bin";
  make_file(path, 1 << 20, 7);
  IoOptions o;
  auto e = io_open(path, o);
  REQUIRE(e->direct());
  AlignedBuffer buf(2 * kIoBlock);
  ReadSpan s{100, kIoBlock, buf.data()};
  CHECK_THROWS_AS(e->read(&s, 1), InternalError);
}
