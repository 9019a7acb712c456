// I/O engines: how the runtime turns a list of planned reads into system calls. One small interface, four engines:
//   pread  - one pread per span, one at a time;
//   preadv - spans that are contiguous in the file become one preadv (scatter into their buffers);
//   uring  - liburing, every span of a batch in flight up to a bounded queue depth (pread where liburing is absent);
//   mmap   - memcpy from a read-only mapping: the llama.cpp-style baseline, page faults do the reading.
// pread/preadv/uring open the file with O_DIRECT and fall back to buffered reads where the filesystem refuses it
// (reported once through the warn callback). Every system call result passes through an optional IoFaults hook,
// so tests inject short reads, EIO or EOF into the real engines. An engine is not thread-safe: one per reader.
#pragma once
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace nl {

// One read: `bytes` from file `offset` into `dst`. With direct I/O all three must be kIoBlock-aligned.
struct ReadSpan {
  uint64_t offset = 0;
  uint64_t bytes = 0;
  void* dst = nullptr;
};

// Test hook: sees every system call's outcome (bytes transferred, or -errno) and returns what the engine observes.
class IoFaults {
 public:
  virtual ~IoFaults() = default;
  virtual int64_t filter(uint64_t call_index, uint64_t offset, uint64_t bytes, int64_t result) = 0;
};

enum class IoKind { kPread, kPreadv, kUring, kMmap };
const char* io_kind_name(IoKind k);
bool io_kind_parse(const std::string& s, IoKind* out);  // "pread" | "preadv" | "uring" | "mmap"

struct IoOptions {
  IoKind kind = IoKind::kPread;
  bool direct = true;                            // ask for O_DIRECT (ignored by mmap)
  uint32_t queue_depth = 32;                     // uring: reads in flight at most
  IoFaults* faults = nullptr;                    // tests only
  std::function<void(const std::string&)> warn;  // one-line notices (fallbacks); may be empty
};

struct IoCounters {
  uint64_t spans = 0;  // spans asked for
  uint64_t calls = 0;  // system calls (pread/preadv) or io_uring submissions entries issued
  uint64_t bytes = 0;  // bytes transferred
};

class IoEngine {
 public:
  virtual ~IoEngine();
  IoKind kind() const { return kind_; }
  const char* name() const { return io_kind_name(kind_); }
  // True while reads bypass the page cache (O_DIRECT accepted by the filesystem).
  bool direct() const { return direct_; }
  const std::string& path() const { return path_; }
  const IoCounters& counters() const { return counters_; }
  // Reads every span completely. Errors: InputError naming the file when it ends before a span does (truncated),
  // IoError for an operating-system failure (EIO, ...), InternalError for a misaligned span under O_DIRECT.
  virtual void read(const ReadSpan* spans, size_t n) = 0;

  // Asynchronous reads, for computing on data as it lands (nl-run --overlap). submit() queues spans and returns the
  // id of the first (ids count up by one per span over the engine's life); uring puts them in flight at once (up to
  // the queue depth), the other engines read nothing yet. wait_some() blocks until at least one pending span is
  // complete and appends the ids of every completed one (uring: completion order; the others read the oldest pending
  // span themselves, so nothing overlaps). Errors as read(); after an error nothing is pending. Each span's buffer
  // must stay valid until its id is reported. Do not mix with read() while spans are pending.
  virtual uint64_t submit(const ReadSpan* spans, size_t n);
  virtual void wait_some(std::vector<uint64_t>* done);
  // Spans submitted and not yet reported.
  virtual size_t pending() const { return queued_.size(); }
  // Spans the kernel is reading right now (uring); always 0 for the synchronous engines.
  virtual size_t in_flight() const { return 0; }
  // Whether submit() really overlaps: reads proceed while the caller computes.
  virtual bool async() const { return false; }

 protected:
  friend std::unique_ptr<IoEngine> io_open(const std::string& path, const IoOptions& o);
  IoEngine(IoKind kind, std::string path, const IoOptions& o);
  IoKind kind_;
  std::string path_;
  IoOptions opt_;
  int fd_ = -1;
  bool direct_ = false;
  uint64_t call_index_ = 0;
  IoCounters counters_;
  uint64_t next_id_ = 0;
  std::deque<std::pair<uint64_t, ReadSpan>> queued_;  // synchronous engines: submitted, not yet read

  // Result of a call as the engine sees it (through the fault hook).
  int64_t observe(uint64_t offset, uint64_t bytes, int64_t result);
  // Reads [offset, offset+bytes) into dst with pread, resuming short reads; throws as read() documents.
  void pread_full(uint64_t offset, uint64_t bytes, uint8_t* dst);
  // EINVAL from a direct read: the filesystem accepted O_DIRECT at open but refuses it here. Reopens buffered
  // (once, with a notice) and returns true; false when already buffered.
  bool fall_back_to_buffered(int err);
  [[noreturn]] void fail(int err, uint64_t offset, uint64_t bytes);
  [[noreturn]] void fail_eof(uint64_t offset, uint64_t bytes, uint64_t got);
  void check_aligned(const ReadSpan& s) const;
};

// Opens `path` with the engine `o.kind`. Throws IoError when it cannot be opened.
std::unique_ptr<IoEngine> io_open(const std::string& path, const IoOptions& o);

// Whether this build has io_uring (NL_HAVE_URING) and the kernel lets us create a ring.
bool io_uring_available();

}  // namespace nl
