// Small HDF5 helpers shared by the HDF5 formats (trace v1 in formats/, graph files in graph/): RAII identifiers,
// input checks and the one set of attribute readers and writers (formats/hdf5_util.cpp).
#pragma once
#include <fcntl.h>
#include <hdf5.h>
#include <unistd.h>

#include <cerrno>
#include <mutex>
#include <string>
#include <vector>

#include "formats/core/atomic_file.h"
#include "formats/core/error.h"

namespace nl::h5 {

// HDF5 prints its own error stack by default; we report one clear line instead. Also: no library shutdown at exit.
// A file whose close failed (a full disk) stays half-closed in libhdf5's tables, and H5_term_library's second try
// crashes (H5F__close_cb, SIGSEGV after the error line). Our writers close every file they commit themselves, and
// the temporary file of a failed write is removed by AtomicPath, so nothing needs the atexit pass. Call before any
// other HDF5 function (every reader and writer calls this first).
inline void silence_hdf5() {
  static std::once_flag once;
  std::call_once(once, [] {
    H5dont_atexit();
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  });
}

// RAII for HDF5 identifiers.
struct Hid {
  hid_t id = -1;
  herr_t (*close)(hid_t) = nullptr;
  Hid() = default;
  Hid(hid_t i, herr_t (*c)(hid_t)) : id(i), close(c) {}
  Hid(Hid&& o) noexcept : id(o.id), close(o.close) { o.id = -1; }
  Hid& operator=(Hid&& o) noexcept {
    reset();
    id = o.id;
    close = o.close;
    o.id = -1;
    return *this;
  }
  ~Hid() { reset(); }
  void reset() { (void)release(); }
  // Closes now and returns the close function's status (H5Fclose flushes: a full disk fails here).
  herr_t release() {
    herr_t rc = 0;
    if (id >= 0 && close) rc = close(id);
    id = -1;
    return rc;
  }
  bool ok() const { return id >= 0; }
  operator hid_t() const { return id; }
};

// A dataset's declared extent is only a claim: unwritten chunks cost no bytes, so a few-kilobyte file can declare
// terabytes. Before allocating, require the bytes the file really stores to account for the extent: deflate
// expands at most 1032:1, so 1100:1 plus 1 MiB of slack accepts every honest file.
inline constexpr uint64_t kMaxStoredRatio = 1100, kStoredSlack = 1ull << 20;
inline void check_stored_bytes(const std::string& path, hid_t ds, uint64_t elems, uint64_t elem_bytes,
                               const std::string& what) {
  constexpr uint64_t kMaxRatio = kMaxStoredRatio, kSlack = kStoredSlack;
  const uint64_t stored = H5Dget_storage_size(ds);
  if (elems > (~uint64_t(0) - kSlack) / kMaxRatio / elem_bytes || elems * elem_bytes > stored * kMaxRatio + kSlack)
    throw InputError(path, what + " declares " + std::to_string(elems) + " elements but the file stores only " +
                               std::to_string(stored) + " bytes of it (truncated or corrupt file?)");
}

// Reads an input through with plain read()s, up to max_bytes: an I/O error (EIO from the device) becomes an
// IoError (exit 4). libhdf5 reports a failed read as a failed open or read, which alone would read as bad input.
inline void throw_if_read_error(const std::string& path, uint64_t max_bytes = ~uint64_t(0)) {
  int fd = open_regular_input(path);
  std::vector<char> buf(1 << 20);
  for (uint64_t done = 0; done < max_bytes;) {
    ssize_t r = ::read(fd, buf.data(), buf.size());
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      const std::string e = errno_text("read failed");
      ::close(fd);
      throw IoError(path, e);
    }
    if (r == 0) break;
    done += uint64_t(r);
  }
  ::close(fd);
}

// A failed libhdf5 open or read of an input: an I/O error when the file cannot be read through (exit 4), else the
// given bad-input message (exit 3).
[[noreturn]] inline void read_failed(const std::string& path, const std::string& what) {
  throw_if_read_error(path);
  throw InputError(path, what);
}

// Before H5Fopen of an input: a regular file (a FIFO would block libhdf5's open), and an HDF5 signature. When
// libhdf5 finds none, the file is read through (up to 64 MiB) so that an I/O error (EIO) is reported as one
// (IoError, exit 4) and not as a file that is not HDF5.
inline void check_hdf5_input(const std::string& path, const std::string& expected) {
  int fd = open_regular_input(path);
  ::close(fd);
  if (H5Fis_hdf5(path.c_str()) > 0) return;
  throw_if_read_error(path, uint64_t(64) << 20);
  throw InputError(path, "not an HDF5 file (or truncated): expected a " + expected);
}

// Attribute writers: a scalar UTF-8 variable-length string, a little-endian int64, an IEEE double. A failure is an
// InternalError naming the attribute (the file itself was created by us moments before).
void write_string_attr(hid_t obj, const char* name, const std::string& value);
void write_int_attr(hid_t obj, const char* name, int64_t value);
void write_double_attr(hid_t obj, const char* name, double value);

// Attribute readers of an input file `path`; `where` (e.g. " of /layers/3", or "") completes the error line. Each
// throws InputError naming the file when the attribute is missing, has the wrong class or is not a scalar.
bool has_attr(hid_t obj, const char* name);
std::string read_string_attr(const std::string& path, hid_t obj, const char* name, const std::string& where);
int64_t read_int_attr(const std::string& path, hid_t obj, const char* name, const std::string& where);
// A scalar float or integer attribute, read as a double.
double read_number_attr(const std::string& path, hid_t obj, const char* name, const std::string& where);

}  // namespace nl::h5
