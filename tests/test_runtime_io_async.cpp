// The engines' asynchronous interface (submit / wait_some, used by nl-run --overlap): every span is reported once
// with the file's bytes, in any order, on every engine; io_uring keeps reads in flight while the caller computes
// (at most the queue depth); an injected EIO on an asynchronous read is a clear error and leaves nothing pending.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "formats/core/atomic_file.h"
#include "formats/core/error.h"
#include "runtime/io/engine.h"
#include "runtime/io/file.h"
#include "skip_util.h"

using namespace nl;

namespace {

std::string make_file(const std::string& path, size_t bytes, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string s(bytes, '\0');
  for (auto& ch : s) ch = char(rng());
  write_file_atomic(path, s);
  return s;
}

// n scattered spans of one or two blocks each.
std::vector<ReadSpan> spans_for(AlignedBuffer& buf, size_t file_bytes, size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  buf.resize(n * 2 * kIoBlock);
  std::vector<ReadSpan> s;
  const uint64_t blocks = file_bytes / kIoBlock;
  for (size_t i = 0; i < n; ++i) {
    const uint64_t len = (1 + rng() % 2) * kIoBlock;
    s.push_back({(rng() % (blocks - 2)) * kIoBlock, len, buf.data() + i * 2 * kIoBlock});
  }
  return s;
}

struct EioAt : IoFaults {
  uint64_t at;
  explicit EioAt(uint64_t a) : at(a) {}
  int64_t filter(uint64_t call, uint64_t, uint64_t, int64_t res) override { return call == at ? -EIO : res; }
};

}  // namespace

TEST_CASE("submit / wait_some: every span once, with the file's bytes, on every engine") {
  const std::string path = "io_async_data.bin";
  const std::string content = make_file(path, 2 << 20, 7);
  for (IoKind k : {IoKind::kPread, IoKind::kPreadv, IoKind::kUring, IoKind::kMmap}) {
    const std::string kind = io_kind_name(k);
    CAPTURE(kind);
    IoOptions o;
    o.kind = k;
    o.queue_depth = 4;
    auto e = io_open(path, o);
    AlignedBuffer a, b;
    std::vector<ReadSpan> s1 = spans_for(a, content.size(), 40, 1), s2 = spans_for(b, content.size(), 25, 2);
    const uint64_t id1 = e->submit(s1.data(), s1.size());
    const uint64_t id2 = e->submit(s2.data(), s2.size());  // a second batch while the first is pending
    CHECK(id2 == id1 + s1.size());
    CHECK(e->pending() == s1.size() + s2.size());
    std::vector<uint64_t> done;
    size_t max_flight = 0, rounds = 0;
    while (e->pending() > 0) {
      max_flight = std::max(max_flight, e->in_flight());
      e->wait_some(&done);
      ++rounds;
    }
    std::sort(done.begin(), done.end());
    REQUIRE(done.size() == s1.size() + s2.size());
    for (size_t i = 0; i < done.size(); ++i) CHECK(done[i] == id1 + i);
    size_t bad = 0;
    for (const auto* v : {&s1, &s2})
      for (const ReadSpan& s : *v) bad += std::memcmp(s.dst, content.data() + s.offset, s.bytes) != 0;
    CHECK(bad == 0);
    CHECK(max_flight <= 4);
    if (k == IoKind::kUring && e->async()) {
      CHECK(max_flight == 4);  // submit puts reads in the kernel's hands at once, up to the queue depth
    } else {
      CHECK(!e->async());
      CHECK(rounds == done.size());  // a synchronous engine reads one span per wait
    }
    e->wait_some(&done);  // nothing pending: returns at once
    CHECK(done.size() == s1.size() + s2.size());
  }
}

TEST_CASE("io_uring keeps reads in flight between waits (queue depth 1: the next read is in the kernel's hands)" *
          test::skip_unless(io_uring_available(), "io_uring unavailable in this kernel or build")) {
  const std::string path = "io_async_flight.bin";
  const std::string content = make_file(path, 1 << 20, 9);
  IoOptions o;
  o.kind = IoKind::kUring;
  o.queue_depth = 1;
  auto e = io_open(path, o);
  REQUIRE(e->async());
  AlignedBuffer a;
  std::vector<ReadSpan> s = spans_for(a, content.size(), 10, 3);
  e->submit(s.data(), s.size());
  CHECK(e->in_flight() == 1);
  std::vector<uint64_t> done;
  size_t with_flight = 0;
  while (e->pending() > 0) {
    e->wait_some(&done);
    with_flight += e->in_flight() == 1;  // what the caller computes on now overlaps the next read
  }
  CHECK(done.size() == s.size());
  CHECK(with_flight == s.size() - 1);
}

TEST_CASE("an EIO on an asynchronous read is a clear error and leaves nothing pending") {
  const std::string path = "io_async_eio.bin";
  const std::string content = make_file(path, 1 << 20, 11);
  for (IoKind k : {IoKind::kPread, IoKind::kUring}) {
    const std::string kind = io_kind_name(k);
    CAPTURE(kind);
    EioAt f(3);
    IoOptions o;
    o.kind = k;
    o.queue_depth = 8;
    o.faults = &f;
    auto e = io_open(path, o);
    AlignedBuffer a;
    std::vector<ReadSpan> s = spans_for(a, content.size(), 12, 4);
    e->submit(s.data(), s.size());
    std::vector<uint64_t> done;
    std::string err;
    try {
      while (e->pending() > 0) e->wait_some(&done);
    } catch (const IoError& x) {
      err = x.what();
    }
    CHECK(err.find(path) != std::string::npos);
    CHECK(err.find("Input/output error") != std::string::npos);
    CHECK(e->pending() == 0);
    CHECK(e->in_flight() == 0);
    // The engine still reads afterwards.
    f.at = uint64_t(-1);
    e->submit(s.data(), 2);
    done.clear();
    while (e->pending() > 0) e->wait_some(&done);
    CHECK(done.size() == 2);
    CHECK(std::memcmp(s[0].dst, content.data() + s[0].offset, s[0].bytes) == 0);
  }
}
