#include "formats/core/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
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
}  // namespace

AtomicPath::AtomicPath(std::string final_path) : final_(std::move(final_path)) {
  if (final_.empty()) throw UsageError("empty output path");
  temp_ = final_ + ".tmp." + std::to_string(::getpid());
  ::unlink(temp_.c_str());  // a stale temp from a crashed run of the same pid
}

AtomicPath::~AtomicPath() {
  if (!committed_) ::unlink(temp_.c_str());
}

void AtomicPath::commit() {
  int fd = ::open(temp_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw IoError(temp_, errno_text("cannot reopen temporary output"));
  if (::fsync(fd) != 0) {
    ::close(fd);
    throw IoError(temp_, errno_text("fsync failed"));
  }
  ::close(fd);
  if (::rename(temp_.c_str(), final_.c_str()) != 0) throw IoError(final_, errno_text("rename failed"));
  committed_ = true;
  int dfd = ::open(dir_of(final_).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {  // directory fsync is advisory: some filesystems refuse it
    (void)::fsync(dfd);
    ::close(dfd);
  }
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
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw IoError(path, errno_text("cannot open"));
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
  while (got < out.size()) {
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

}  // namespace nl
