// The four I/O engines behind runtime/io/engine.h, and their shared error and short-read handling.
#include "runtime/io/engine.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <csetjmp>
#include <csignal>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "formats/core/enum_names.h"
#include "formats/core/error.h"
#include "runtime/io/file.h"
#ifdef NL_HAVE_URING
#include <liburing.h>
#endif

namespace nl {

namespace {
constexpr EnumName<IoKind> kIoKindNames[] = {
    {IoKind::kPread, "pread"}, {IoKind::kPreadv, "preadv"}, {IoKind::kUring, "uring"}, {IoKind::kMmap, "mmap"}};
}  // namespace

const char* io_kind_name(IoKind k) { return enum_name(kIoKindNames, k); }

bool io_kind_parse(const std::string& s, IoKind* out) { return enum_parse(kIoKindNames, s, out); }

IoEngine::IoEngine(IoKind kind, std::string path, const IoOptions& o) : kind_(kind), path_(std::move(path)), opt_(o) {}

IoEngine::~IoEngine() {
  if (fd_ >= 0) ::close(fd_);
}

int64_t IoEngine::observe(uint64_t offset, uint64_t bytes, int64_t result) {
  ++counters_.calls;
  if (opt_.faults) result = opt_.faults->filter(call_index_, offset, bytes, result);
  ++call_index_;
  return result;
}

void IoEngine::fail(int err, uint64_t offset, uint64_t bytes) {
  throw IoError(path_, "read of " + std::to_string(bytes) + " bytes at offset " + std::to_string(offset) +
                           " failed: " + std::strerror(err));
}

void IoEngine::fail_eof(uint64_t offset, uint64_t bytes, uint64_t got) {
  throw InputError(path_, "truncated: the file ended " + std::to_string(got) + " bytes into a read of " +
                              std::to_string(bytes) + " bytes at offset " + std::to_string(offset));
}

void IoEngine::check_aligned(const ReadSpan& s) const {
  if (direct_ && ((s.offset | s.bytes | reinterpret_cast<uintptr_t>(s.dst)) & (kIoBlock - 1)))
    throw InternalError("unaligned direct read (offset " + std::to_string(s.offset) + ", " + std::to_string(s.bytes) +
                        " bytes) of " + path_);
}

bool IoEngine::fall_back_to_buffered(int err) {
  if (err != EINVAL || !direct_) return false;
  OpenedFile f = open_for_reading(path_, false);
  ::close(fd_);
  fd_ = f.fd;
  direct_ = false;
  if (opt_.warn) opt_.warn("warning: " + path_ + ": O_DIRECT reads refused; reading through the page cache");
  return true;
}

uint64_t IoEngine::submit(const ReadSpan* s, size_t n) {
  const uint64_t first = next_id_;
  for (size_t i = 0; i < n; ++i) queued_.push_back({next_id_++, s[i]});
  return first;
}

void IoEngine::wait_some(std::vector<uint64_t>* done) {
  if (queued_.empty()) return;
  const auto [id, span] = queued_.front();
  queued_.pop_front();
  try {
    read(&span, 1);
  } catch (...) {
    queued_.clear();
    throw;
  }
  done->push_back(id);
}

void IoEngine::pread_full(uint64_t offset, uint64_t bytes, uint8_t* dst) {
  uint64_t done = 0;
  int stalls = 0;
  while (done < bytes) {
    const uint64_t want = bytes - done;
    ssize_t r = ::pread(fd_, dst + done, want, static_cast<off_t>(offset + done));
    int64_t res = observe(offset + done, want, r < 0 ? -int64_t(errno) : int64_t(r));
    if (res < 0) {
      if (res == -EINTR || res == -EAGAIN) continue;
      if (fall_back_to_buffered(int(-res))) continue;
      fail(int(-res), offset, bytes);
    }
    if (res == 0) fail_eof(offset, bytes, done);
    counters_.bytes += uint64_t(res);
    uint64_t next = done + uint64_t(res);
    // A direct read resumes on a block boundary; a file ending mid-block would otherwise repeat forever.
    if (next < bytes && direct_) next = io_align_down(next);
    if (next <= done) {
      if (++stalls > 3) fail_eof(offset, bytes, done);
    } else {
      stalls = 0;
    }
    done = std::max(done, next);
  }
}

namespace {

// Spans that continue each other in the file, read by one vectored call.
struct SpanGroup {
  size_t first = 0, count = 0;
  uint64_t offset = 0, bytes = 0;
};

constexpr size_t kMaxIov = 1024;  // IOV_MAX on Linux

void group_spans(const ReadSpan* s, size_t n, std::vector<SpanGroup>* groups, std::vector<iovec>* iov) {
  groups->clear();
  iov->resize(n);
  for (size_t i = 0; i < n; ++i) {
    (*iov)[i] = {s[i].dst, s[i].bytes};
    if (!groups->empty()) {
      SpanGroup& g = groups->back();
      if (g.offset + g.bytes == s[i].offset && g.count < kMaxIov) {
        ++g.count;
        g.bytes += s[i].bytes;
        continue;
      }
    }
    groups->push_back({i, 1, s[i].offset, s[i].bytes});
  }
}

class PreadEngine final : public IoEngine {
 public:
  PreadEngine(const std::string& path, const IoOptions& o) : IoEngine(IoKind::kPread, path, o) {}
  void read(const ReadSpan* s, size_t n) override {
    for (size_t i = 0; i < n; ++i) {
      check_aligned(s[i]);
      ++counters_.spans;
      pread_full(s[i].offset, s[i].bytes, static_cast<uint8_t*>(s[i].dst));
    }
  }
};

// Shared by preadv and uring: finish a group whose vectored read stopped after `done` bytes, span by span.
class VectoredEngine : public IoEngine {
 protected:
  using IoEngine::IoEngine;
  std::vector<SpanGroup> groups_;
  std::vector<iovec> iov_;

  void complete_group(const ReadSpan* s, const SpanGroup& g, uint64_t done) {
    uint64_t start = 0;
    for (size_t i = g.first; i < g.first + g.count; ++i) {
      const uint64_t end = start + s[i].bytes;
      if (done < end) {
        uint64_t from = done > start ? done - start : 0;
        if (direct_) from = io_align_down(from);
        pread_full(s[i].offset + from, s[i].bytes - from, static_cast<uint8_t*>(s[i].dst) + from);
      }
      start = end;
    }
  }
};

class PreadvEngine final : public VectoredEngine {
 public:
  PreadvEngine(const std::string& path, const IoOptions& o) : VectoredEngine(IoKind::kPreadv, path, o) {}
  void read(const ReadSpan* s, size_t n) override {
    for (size_t i = 0; i < n; ++i) check_aligned(s[i]);
    counters_.spans += n;
    group_spans(s, n, &groups_, &iov_);
    for (const SpanGroup& g : groups_) {
      for (;;) {
        ssize_t r = ::preadv(fd_, iov_.data() + g.first, int(g.count), static_cast<off_t>(g.offset));
        int64_t res = observe(g.offset, g.bytes, r < 0 ? -int64_t(errno) : int64_t(r));
        if (res < 0) {
          if (res == -EINTR || res == -EAGAIN) continue;
          if (fall_back_to_buffered(int(-res))) continue;
          fail(int(-res), g.offset, g.bytes);
        }
        counters_.bytes += uint64_t(res);
        if (uint64_t(res) < g.bytes) complete_group(s, g, uint64_t(res));
        break;
      }
    }
  }
};

#ifdef NL_HAVE_URING
class UringEngine final : public VectoredEngine {
 public:
  UringEngine(const std::string& path, const IoOptions& o) : VectoredEngine(IoKind::kUring, path, o) {
    depth_ = std::max<uint32_t>(1, o.queue_depth);
    int rc = io_uring_queue_init(depth_, &ring_, 0);
    if (rc != 0) {
      // Kernels or sandboxes without io_uring: serve the same reads with pread rather than failing.
      kind_ = IoKind::kPread;
      if (opt_.warn) opt_.warn(std::string("warning: io_uring unavailable (") + std::strerror(-rc) + "); using pread");
    } else {
      have_ring_ = true;
    }
  }
  ~UringEngine() override {
    if (have_ring_) drain_quietly();
    if (have_ring_) io_uring_queue_exit(&ring_);
  }

  bool async() const override { return have_ring_; }
  size_t pending() const override { return have_ring_ ? waiting_.size() + flying_.size() : IoEngine::pending(); }
  size_t in_flight() const override { return flying_.size(); }

  uint64_t submit(const ReadSpan* s, size_t n) override {
    if (!have_ring_) return IoEngine::submit(s, n);
    for (size_t i = 0; i < n; ++i) check_aligned(s[i]);
    counters_.spans += n;
    const uint64_t first = next_id_;
    for (size_t i = 0; i < n; ++i) waiting_.push_back({next_id_++, s[i]});
    fill();
    return first;
  }

  void wait_some(std::vector<uint64_t>* done) override {
    if (!have_ring_) return IoEngine::wait_some(done);
    if (waiting_.empty() && flying_.empty()) return;
    try {
      fill();
      io_uring_cqe* cqe = nullptr;
      int rc;
      do rc = io_uring_wait_cqe(&ring_, &cqe);
      while (rc == -EINTR);
      if (rc < 0) {
        // The ring is unusable: tearing it down cancels and waits for the reads still writing into buffers.
        io_uring_queue_exit(&ring_);
        have_ring_ = false;
        flying_.clear();
        waiting_.clear();
        throw IoError(path_, std::string("io_uring failed: ") + std::strerror(-rc));
      }
      // Every completion already there, not only the first.
      while (cqe) {
        const uint64_t id = io_uring_cqe_get_data64(cqe);
        const int res = cqe->res;
        io_uring_cqe_seen(&ring_, cqe);
        finish(id, res);
        done->push_back(id);
        cqe = nullptr;
        if (io_uring_peek_cqe(&ring_, &cqe) != 0) cqe = nullptr;
      }
      fill();
    } catch (...) {
      drain_quietly();
      throw;
    }
  }

  void read(const ReadSpan* s, size_t n) override {
    for (size_t i = 0; i < n; ++i) check_aligned(s[i]);
    counters_.spans += n;
    if (!have_ring_) {
      for (size_t i = 0; i < n; ++i) pread_full(s[i].offset, s[i].bytes, static_cast<uint8_t*>(s[i].dst));
      return;
    }
    group_spans(s, n, &groups_, &iov_);
    // Every group in flight up to the queue depth. Nothing is thrown until the ring is drained: the kernel
    // may still be writing into the caller's buffers.
    std::vector<std::pair<size_t, int64_t>> unfinished;  // group, bytes done or -errno
    size_t next = 0, inflight = 0;
    int wait_error = 0;
    while (next < groups_.size() || inflight > 0) {
      size_t queued = 0;
      while (inflight < depth_ && next < groups_.size() && wait_error == 0) {
        io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
        if (!sqe) break;
        const SpanGroup& g = groups_[next];
        io_uring_prep_readv(sqe, fd_, iov_.data() + g.first, unsigned(g.count), g.offset);
        io_uring_sqe_set_data64(sqe, next);
        ++next;
        ++inflight;
        ++queued;
      }
      if (queued > 0) {
        int rc = io_uring_submit(&ring_);
        if (rc < 0 && wait_error == 0) wait_error = -rc;
      }
      if (inflight == 0) break;
      io_uring_cqe* cqe = nullptr;
      int rc = io_uring_wait_cqe(&ring_, &cqe);
      if (rc == -EINTR) continue;
      if (rc < 0) {
        wait_error = -rc;
        break;  // the ring is unusable; completions of in-flight reads cannot be collected
      }
      const size_t gi = size_t(io_uring_cqe_get_data64(cqe));
      const SpanGroup& g = groups_[gi];
      int64_t res = observe(g.offset, g.bytes, cqe->res);
      io_uring_cqe_seen(&ring_, cqe);
      --inflight;
      if (res > 0) counters_.bytes += uint64_t(res);
      if (res < 0 || uint64_t(res) < g.bytes) unfinished.push_back({gi, res});
    }
    if (wait_error != 0) {
      if (inflight > 0) {
        // Buffers may still be written by the kernel: tearing the ring down cancels and waits for them.
        io_uring_queue_exit(&ring_);
        have_ring_ = false;
      }
      throw IoError(path_, std::string("io_uring failed: ") + std::strerror(wait_error));
    }
    if (next < groups_.size()) throw InternalError("io_uring: reads left unsubmitted");
    // Short reads, interrupted or refused reads: finish synchronously (EINVAL under O_DIRECT falls back).
    for (auto [gi, res] : unfinished) {
      const SpanGroup& g = groups_[gi];
      if (res < 0 && res != -EINTR && res != -EAGAIN && !fall_back_to_buffered(int(-res)))
        fail(int(-res), g.offset, g.bytes);
      complete_group(s, g, res < 0 ? 0 : uint64_t(res));
    }
  }

 private:
  io_uring ring_{};
  bool have_ring_ = false;
  uint32_t depth_ = 32;
  std::deque<std::pair<uint64_t, ReadSpan>> waiting_;  // submitted, not yet handed to the kernel
  std::unordered_map<uint64_t, ReadSpan> flying_;      // in the kernel's hands, by id

  // Hands waiting spans to the kernel up to the queue depth.
  void fill() {
    size_t queued = 0;
    while (flying_.size() < depth_ && !waiting_.empty()) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      if (!sqe) break;
      const auto [id, sp] = waiting_.front();
      waiting_.pop_front();
      io_uring_prep_read(sqe, fd_, sp.dst, unsigned(sp.bytes), sp.offset);
      io_uring_sqe_set_data64(sqe, id);
      flying_.emplace(id, sp);
      ++queued;
    }
    if (queued > 0) {
      const int rc = io_uring_submit(&ring_);
      if (rc < 0) throw IoError(path_, std::string("io_uring submit failed: ") + std::strerror(-rc));
    }
  }

  // One completion: short, interrupted or refused reads are finished synchronously (EINVAL under O_DIRECT falls
  // back to buffered reads, as read() does).
  void finish(uint64_t id, int cqe_res) {
    auto it = flying_.find(id);
    if (it == flying_.end()) throw InternalError("io_uring: completion of an unknown read");
    const ReadSpan sp = it->second;
    flying_.erase(it);
    const int64_t res = observe(sp.offset, sp.bytes, cqe_res);
    if (res > 0) counters_.bytes += uint64_t(res);
    if (res >= 0 && uint64_t(res) == sp.bytes) return;
    if (res < 0 && res != -EINTR && res != -EAGAIN && !fall_back_to_buffered(int(-res)))
      fail(int(-res), sp.offset, sp.bytes);
    uint64_t from = res < 0 ? 0 : uint64_t(res);
    if (direct_) from = io_align_down(from);
    pread_full(sp.offset + from, sp.bytes - from, static_cast<uint8_t*>(sp.dst) + from);
  }

  // After an error: waits out every read the kernel still holds, forgets the rest.
  void drain_quietly() {
    waiting_.clear();
    while (!flying_.empty()) {
      io_uring_cqe* cqe = nullptr;
      const int rc = io_uring_wait_cqe(&ring_, &cqe);
      if (rc == -EINTR) continue;
      if (rc < 0) {
        io_uring_queue_exit(&ring_);  // cancels and waits for what is left
        have_ring_ = false;
        break;
      }
      flying_.erase(io_uring_cqe_get_data64(cqe));
      io_uring_cqe_seen(&ring_, cqe);
    }
    flying_.clear();
  }
};
#endif

// A file truncated under a mapping raises SIGBUS on the first touch of a page past the new end. The mmap engine
// turns that into the same truncation error the other engines give: a thread-local jump target is set around its
// memcpy, and a SIGBUS handler, installed while any mmap engine exists, jumps back there. Any other SIGBUS goes to
// the handler that was there before (restored when the last mmap engine closes).
thread_local sigjmp_buf* volatile t_sigbus_target = nullptr;  // volatile: the stores around memcpy must stay
std::mutex g_sigbus_mu;
int g_sigbus_users = 0;
struct sigaction g_sigbus_prev {};

void on_sigbus(int sig, siginfo_t*, void*) {
  if (t_sigbus_target) siglongjmp(*t_sigbus_target, 1);
  ::sigaction(SIGBUS, &g_sigbus_prev, nullptr);
  ::raise(sig);
}

void sigbus_handler_acquire() {
  std::lock_guard<std::mutex> lk(g_sigbus_mu);
  if (g_sigbus_users++ > 0) return;
  struct sigaction sa {};
  sa.sa_sigaction = on_sigbus;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGBUS, &sa, &g_sigbus_prev);
}

void sigbus_handler_release() {
  std::lock_guard<std::mutex> lk(g_sigbus_mu);
  if (--g_sigbus_users == 0) ::sigaction(SIGBUS, &g_sigbus_prev, nullptr);
}

class MmapEngine final : public IoEngine {
 public:
  MmapEngine(const std::string& path, const IoOptions& o) : IoEngine(IoKind::kMmap, path, o) {}
  ~MmapEngine() override {
    if (map_) ::munmap(map_, size_);
    if (handler_) sigbus_handler_release();
  }
  void map() {
    struct stat st {};
    if (::fstat(fd_, &st) != 0) throw IoError(path_, errno_text("cannot stat"));
    size_ = uint64_t(st.st_size);
    if (size_ == 0) return;
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd_, 0);
    if (p == MAP_FAILED) throw IoError(path_, errno_text("cannot mmap"));
    map_ = static_cast<uint8_t*>(p);
    sigbus_handler_acquire();
    handler_ = true;
  }
  void read(const ReadSpan* s, size_t n) override {
    for (size_t i = 0; i < n; ++i) {
      ++counters_.spans;
      const uint64_t avail = s[i].offset < size_ ? std::min(s[i].bytes, size_ - s[i].offset) : 0;
      int64_t res = observe(s[i].offset, s[i].bytes, int64_t(avail));
      if (res < 0) fail(int(-res), s[i].offset, s[i].bytes);
      if (uint64_t(res) < s[i].bytes) fail_eof(s[i].offset, s[i].bytes, uint64_t(res));
      copy(s[i]);  // page faults are the reads
      counters_.bytes += s[i].bytes;
    }
  }

 private:
  uint8_t* map_ = nullptr;
  uint64_t size_ = 0;
  bool handler_ = false;

  void copy(const ReadSpan& s) {
    sigjmp_buf target;
    if (sigsetjmp(target, 1) != 0) {
      t_sigbus_target = nullptr;
      struct stat st {};
      const uint64_t now = ::fstat(fd_, &st) == 0 ? uint64_t(st.st_size) : 0;
      throw InputError(path_, "truncated: the file shrank to " + std::to_string(now) +
                                  " bytes under the mapping (SIGBUS in a read of " + std::to_string(s.bytes) +
                                  " bytes at offset " + std::to_string(s.offset) + ")");
    }
    t_sigbus_target = &target;
    std::memcpy(s.dst, map_ + s.offset, s.bytes);
    t_sigbus_target = nullptr;
  }
};

}  // namespace

std::unique_ptr<IoEngine> io_open(const std::string& path, const IoOptions& o) {
  std::unique_ptr<IoEngine> e;
  switch (o.kind) {
    case IoKind::kPread:
      e = std::make_unique<PreadEngine>(path, o);
      break;
    case IoKind::kPreadv:
      e = std::make_unique<PreadvEngine>(path, o);
      break;
    case IoKind::kUring:
#ifdef NL_HAVE_URING
      e = std::make_unique<UringEngine>(path, o);
#else
      if (o.warn) o.warn("warning: this build has no io_uring (liburing not found); using pread");
      e = std::make_unique<PreadEngine>(path, o);
#endif
      break;
    case IoKind::kMmap: {
      auto m = std::make_unique<MmapEngine>(path, o);
      m->fd_ = open_for_reading(path, false).fd;
      m->map();
      return m;
    }
  }
  OpenedFile f = open_for_reading(path, o.direct);
  e->fd_ = f.fd;
  e->direct_ = f.direct;
  if (o.direct && !f.direct && o.warn)
    o.warn("warning: " + path + ": the filesystem refuses O_DIRECT; reading through the page cache");
  return e;
}

bool io_uring_available() {
#ifdef NL_HAVE_URING
  io_uring ring;
  if (io_uring_queue_init(2, &ring, 0) != 0) return false;
  io_uring_queue_exit(&ring);
  return true;
#else
  return false;
#endif
}

}  // namespace nl
