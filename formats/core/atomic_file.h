// Atomic outputs: every file the toolkit writes goes to a temporary name in the same directory, is fsynced,
// and is renamed over the final name only when complete. An existing output is never left half written.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace nl {

// Owns a temporary path next to `final_path`. Write to temp_path() (any library may open it), then commit().
// If the object is destroyed without commit() (error, exception), the temporary file is removed.
// Not thread-safe; one writer per output.
class AtomicPath {
 public:
  explicit AtomicPath(std::string final_path);
  ~AtomicPath();
  AtomicPath(const AtomicPath&) = delete;
  AtomicPath& operator=(const AtomicPath&) = delete;

  const std::string& temp_path() const { return temp_; }
  const std::string& final_path() const { return final_; }
  // fsync the temporary file, rename it into place, fsync the directory. Throws IoError.
  void commit();

 private:
  std::string final_, temp_;
  bool committed_ = false;
};

// A buffered binary writer over an AtomicPath, for formats we write ourselves (JSON, images).
class AtomicWriter {
 public:
  explicit AtomicWriter(std::string final_path);
  ~AtomicWriter();
  AtomicWriter(const AtomicWriter&) = delete;
  AtomicWriter& operator=(const AtomicWriter&) = delete;

  void write(const void* data, size_t n);
  void write(const std::string& s) { write(s.data(), s.size()); }
  // Pads with zero bytes up to a multiple of `alignment`.
  void pad_to(uint64_t alignment);
  uint64_t offset() const { return offset_; }
  // Overwrites bytes already written (e.g. a header whose checksums are known only at the end).
  void write_at(uint64_t offset, const void* data, size_t n);
  void commit();

 private:
  AtomicPath path_;
  int fd_ = -1;
  uint64_t offset_ = 0;
  std::string buf_;
  void flush_buffer();
};

// Writes a whole text file atomically.
void write_file_atomic(const std::string& path, const std::string& content);
// Reads a whole file; throws IoError when it cannot be opened/read, InputError if larger than max_bytes.
std::string read_file(const std::string& path, uint64_t max_bytes = (1ull << 30));

}  // namespace nl
