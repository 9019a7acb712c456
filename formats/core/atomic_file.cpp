#include "formats/core/atomic_file.h"

#include <fcntl.h>
#include <limits.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>  // program_invocation_short_name (GNU)
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <new>
#include <vector>

#include "formats/core/error.h"

namespace nl {

std::string errno_text(const std::string& what) { return what + ": " + std::strerror(errno); }

namespace {
std::string dir_of(const std::string& p) {
  auto pos = p.find_last_of('/');
  if (pos == std::string::npos) return ".";
  if (pos == 0) return "/";
  return p.substr(0, pos);
}

void fsync_dir_of(const std::string& path) {
  int dfd = ::open(dir_of(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {  // directory fsync is advisory: some filesystems refuse it
    (void)::fsync(dfd);
    ::close(dfd);
  }
}

// Signal-cleanup registry: fixed storage, so the handler touches no allocator. A slot is in use while its flag is 1.
constexpr int kCleanupSlots = 64;
char g_cleanup_path[kCleanupSlots][PATH_MAX];
std::atomic<int> g_cleanup_used[kCleanupSlots];

extern "C" void cleanup_on_signal(int sig) {
  for (int i = 0; i < kCleanupSlots; ++i)
    if (g_cleanup_used[i].load() == 1) ::unlink(g_cleanup_path[i]);
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

CommitGroup* g_group = nullptr;
}  // namespace

namespace {
// std::bad_alloc thrown where it cannot unwind to the CLI's handler (a worker thread, an OpenMP region) ends in
// std::terminate: that is still the system refusing memory, so exit 4 with one line and no temporary files (the
// documented out-of-memory exit), not an abort.
[[noreturn]] void terminate_out_of_memory() {
  if (std::exception_ptr e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const std::bad_alloc&) {
      for (int i = 0; i < kCleanupSlots; ++i)
        if (g_cleanup_used[i].load() == 1) ::unlink(g_cleanup_path[i]);
      std::fprintf(stderr, "%s: error: out of memory\n", program_invocation_short_name);
      std::_Exit(kExitIo);
    } catch (...) {
    }
  }
  std::abort();
}
}  // namespace

void install_cleanup_signal_handlers() {
  std::set_terminate(terminate_out_of_memory);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
    struct sigaction old {};
    // An ignored signal stays ignored (nohup; SIGINT in a shell's background job): it would not stop us anyway.
    if (::sigaction(sig, nullptr, &old) == 0 && old.sa_handler == SIG_IGN) continue;
    struct sigaction sa {};
    sa.sa_handler = cleanup_on_signal;
    sigemptyset(&sa.sa_mask);
    ::sigaction(sig, &sa, nullptr);
  }
}

int cleanup_register(const std::string& path) {
  if (path.size() >= PATH_MAX) return -1;
  for (int i = 0; i < kCleanupSlots; ++i) {
    int expect = 0;
    if (g_cleanup_used[i].compare_exchange_strong(expect, 2)) {  // 2: being filled, ignored by the handler
      std::memcpy(g_cleanup_path[i], path.c_str(), path.size() + 1);
      g_cleanup_used[i].store(1);
      return i;
    }
  }
  return -1;
}

void cleanup_unregister(int slot) {
  if (slot >= 0 && slot < kCleanupSlots) g_cleanup_used[slot].store(0);
}

std::string file_kind_name(unsigned mode) {
  if (S_ISREG(mode)) return "";
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

int open_regular_input(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) throw IoError(path, errno_text("cannot open"));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    throw IoError(path, errno_text("cannot stat"));
  }
  const std::string kind = file_kind_name(st.st_mode);
  if (!kind.empty()) {
    ::close(fd);
    throw InputError(path, "is " + kind + ", not a regular file");
  }
  int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) (void)::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  return fd;
}

void require_regular_input(const std::string& path) { ::close(open_regular_input(path)); }

AtomicPath::AtomicPath(std::string final_path) : final_(std::move(final_path)) {
  if (final_.empty()) throw UsageError("empty output path");
  const std::string suffix = ".tmp." + std::to_string(::getpid());
  // A legal 255-byte name must not fail because of the suffix: cut the name part of the temporary name instead.
  const size_t slash = final_.find_last_of('/');
  const size_t base_len = final_.size() - (slash == std::string::npos ? 0 : slash + 1);
  const size_t keep = std::min(base_len, size_t(NAME_MAX) - suffix.size());
  temp_ = final_.substr(0, final_.size() - base_len + keep) + suffix;
  ::unlink(temp_.c_str());  // a stale temp from a crashed run of the same pid
  slot_ = cleanup_register(temp_);
}

AtomicPath::~AtomicPath() {
  if (!committed_) {
    ::unlink(temp_.c_str());
    cleanup_unregister(slot_);
  }
}

void AtomicPath::commit() {
  int fd = ::open(temp_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw IoError(temp_, errno_text("cannot reopen temporary output"));
  if (::fsync(fd) != 0) {
    ::close(fd);
    throw IoError(final_, errno_text("fsync failed"));
  }
  ::close(fd);
  if (CommitGroup::defer(temp_, final_, slot_)) {
    committed_ = true;  // the group owns the temporary file now
    return;
  }
  if (::rename(temp_.c_str(), final_.c_str()) != 0) throw IoError(final_, errno_text("rename failed"));
  committed_ = true;
  cleanup_unregister(slot_);
  fsync_dir_of(final_);
}

CommitGroup::CommitGroup() {
  if (g_group) throw InternalError("CommitGroup: one group at a time");
  g_group = this;
}

CommitGroup::~CommitGroup() {
  if (g_group == this) g_group = nullptr;
  if (!done_)
    for (const Pending& p : pending_) {
      ::unlink(p.temp.c_str());
      cleanup_unregister(p.slot);
    }
}

bool CommitGroup::defer(const std::string& temp, const std::string& final_path, int slot) {
  static std::mutex m;  // writers of different outputs may finish on different threads
  std::lock_guard<std::mutex> lock(m);
  if (!g_group) return false;
  g_group->pending_.push_back({temp, final_path, slot});
  return true;
}

void CommitGroup::commit() {
  if (g_group == this) g_group = nullptr;
  // Lock each output folder once, in sorted order (two runs over the same folders cannot deadlock).
  std::vector<std::string> dirs;
  for (const Pending& p : pending_) dirs.push_back(dir_of(p.final_path));
  std::sort(dirs.begin(), dirs.end());
  dirs.erase(std::unique(dirs.begin(), dirs.end()), dirs.end());
  std::vector<int> locks;
  for (const std::string& d : dirs) {
    int dfd = ::open(d.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      while (::flock(dfd, LOCK_EX) != 0 && errno == EINTR) {
      }
      locks.push_back(dfd);
    }
  }
  std::string failed, failed_what;
  for (const Pending& p : pending_) {
    if (failed.empty() && ::rename(p.temp.c_str(), p.final_path.c_str()) != 0) {
      failed = p.final_path;
      failed_what = errno_text("rename failed");
    }
    if (!failed.empty()) ::unlink(p.temp.c_str());
    cleanup_unregister(p.slot);
  }
  for (const std::string& d : dirs) fsync_dir_of(d + "/x");
  for (int fd : locks) ::close(fd);  // releases the flock
  done_ = true;
  if (!failed.empty()) throw IoError(failed, failed_what);
}

AtomicWriter::AtomicWriter(std::string final_path) : path_(std::move(final_path)) {
  fd_ = ::open(path_.temp_path().c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw IoError(path_.final_path(), errno_text("cannot create output"));
  buf_.reserve(1 << 20);
}

AtomicWriter::~AtomicWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void AtomicWriter::flush_buffer() {
  const char* p = buf_.data();
  size_t left = buf_.size();
  while (left > 0) {
    ssize_t w = ::write(fd_, p, left);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw IoError(path_.final_path(), errno_text("write failed"));
    }
    p += w;
    left -= static_cast<size_t>(w);
  }
  buf_.clear();
}

void AtomicWriter::write(const void* data, size_t n) {
  if (n >= (1u << 20)) {
    flush_buffer();
    buf_.assign(static_cast<const char*>(data), n);
    flush_buffer();
  } else {
    buf_.append(static_cast<const char*>(data), n);
    if (buf_.size() >= (1u << 20)) flush_buffer();
  }
  offset_ += n;
}

void AtomicWriter::pad_to(uint64_t alignment) {
  uint64_t rem = offset_ % alignment;
  if (rem == 0) return;
  std::vector<char> zeros(alignment - rem, 0);
  write(zeros.data(), zeros.size());
}

void AtomicWriter::write_at(uint64_t offset, const void* data, size_t n) {
  if (offset + n > offset_) throw InternalError("AtomicWriter::write_at past the bytes written");
  flush_buffer();
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::pwrite(fd_, p, n, static_cast<off_t>(offset));
    if (w < 0) {
      if (errno == EINTR) continue;
      throw IoError(path_.final_path(), errno_text("write failed"));
    }
    p += w;
    offset += static_cast<uint64_t>(w);
    n -= static_cast<size_t>(w);
  }
}

void AtomicWriter::commit() {
  flush_buffer();
  if (::close(fd_) != 0) {
    fd_ = -1;
    throw IoError(path_.final_path(), errno_text("close failed"));
  }
  fd_ = -1;
  path_.commit();
}

void write_file_atomic(const std::string& path, const std::string& content) {
  AtomicWriter w(path);
  w.write(content);
  w.commit();
}

std::string read_file(const std::string& path, uint64_t max_bytes) {
  int fd = open_regular_input(path);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    throw IoError(path, errno_text("cannot stat"));
  }
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    ::close(fd);
    throw InputError(path, "file is " + std::to_string(st.st_size) + " bytes, more than the " +
                               std::to_string(max_bytes) + " allowed for this kind of file");
  }
  std::string out(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < out.size()) {  // a file that grows while read is cut at its size at open: the bound holds
    ssize_t r = ::read(fd, out.data() + got, out.size() - got);
    if (r < 0) {
      if (errno == EINTR) continue;
      ::close(fd);
      throw IoError(path, errno_text("read failed"));
    }
    if (r == 0) break;
    got += static_cast<size_t>(r);
  }
  ::close(fd);
  out.resize(got);
  return out;
}

std::string format_bytes(uint64_t b) {
  // Cut, never rounded up: a budget message must not overstate what fits.
  char buf[64];
  if (b >= (1ULL << 30))
    std::snprintf(buf, sizeof buf, "%.2f GiB", std::floor(double(b) / double(1ULL << 30) * 100) / 100);
  else if (b >= (1ULL << 20))
    std::snprintf(buf, sizeof buf, "%.1f MiB", std::floor(double(b) / double(1ULL << 20) * 10) / 10);
  else
    std::snprintf(buf, sizeof buf, "%.1f KiB", std::floor(double(b) / 1024.0 * 10) / 10);
  return buf;
}

void require_disk_space(const std::string& output_path, uint64_t bytes, const std::string& what) {
  const size_t slash = output_path.find_last_of('/');
  const std::string folder = slash == std::string::npos ? "." : slash == 0 ? "/" : output_path.substr(0, slash);
  struct statvfs vs {};
  if (::statvfs(folder.c_str(), &vs) != 0) return;  // the writer reports an unusable folder in its own words
  const unsigned __int128 avail = (unsigned __int128)vs.f_bavail * vs.f_frsize;
  if (bytes <= avail) return;
  throw IoError(output_path, what + " needs " + format_bytes(bytes) + " (" + std::to_string(bytes) +
                                 " bytes) and its file system has " + format_bytes(uint64_t(avail)) +
                                 " free: refused before writing anything");
}

}  // namespace nl
