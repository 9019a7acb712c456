// Atomic outputs: every file the toolkit writes goes to a temporary name in the same directory, is fsynced,
// and is renamed over the final name only when complete. An existing output is never left half written.
// Also owns the other file checks every command shares: regular-file inputs opened without blocking, size-bounded
// reads, removal of temporary files on SIGINT/SIGTERM, and commit groups (all outputs of a command or none).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace nl {

// Owns a temporary path next to `final_path`: "<final>.tmp.<pid>", the final name cut so that the temporary name
// still fits NAME_MAX. Write to temp_path() (any library may open it), then commit().
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
  // fsync the temporary file, rename it into place, fsync the directory. Throws IoError. Inside a CommitGroup the
  // rename waits for the group's commit().
  void commit();

 private:
  std::string final_, temp_;
  int slot_ = -1;  // in the signal-cleanup registry
  bool committed_ = false;
};

// All outputs of one command commit together or not at all. While a CommitGroup exists (one at a time, on the
// main thread), AtomicPath::commit() only fsyncs and hands its temporary file to the group; the group's commit()
// renames every one into place, in order, holding an exclusive flock on each output folder, so two concurrent runs
// to the same outputs never interleave their renames. A group destroyed without commit() removes every temporary.
class CommitGroup {
 public:
  CommitGroup();
  ~CommitGroup();
  CommitGroup(const CommitGroup&) = delete;
  CommitGroup& operator=(const CommitGroup&) = delete;
  void commit();
  // Called by AtomicPath::commit (takes over the temporary file and its cleanup slot).
  static bool defer(const std::string& temp, const std::string& final_path, int slot);

 private:
  struct Pending {
    std::string temp, final_path;
    int slot;
  };
  std::vector<Pending> pending_;
  bool done_ = false;
};

// Temporary files are removed when the process is stopped by SIGINT, SIGTERM or SIGHUP: call once at start-up (the
// CLIs' run_main does). The handler unlinks what is registered, then re-raises the signal with its default action.
// It also makes std::terminate on std::bad_alloc (thrown in a thread) exit 4 "out of memory", temporaries removed.
void install_cleanup_signal_handlers();
// A file the process created and must remove if it is stopped (the probe's scratch file). Returns a slot for
// cleanup_unregister, or -1 when the registry is full (the file is then only removed on normal paths).
int cleanup_register(const std::string& path);
void cleanup_unregister(int slot);

// Opens an input for reading: O_NONBLOCK so a FIFO cannot block the open, then refuses anything but a regular file
// (InputError naming the kind: FIFO, device, folder, socket). Returns the fd (blocking again). IoError if it cannot
// be opened.
int open_regular_input(const std::string& path);
// The same check without keeping the file open (for readers that open by name, such as libhdf5).
void require_regular_input(const std::string& path);
// "a FIFO", "a folder", "a character device", ... for an st_mode; empty for a regular file.
std::string file_kind_name(unsigned mode);

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

// Work that cannot fit is refused before it starts, with the figure (docs/robustness.md "Impossible work"): an output
// of `bytes` (exact, or a lower bound) to `output_path` when its folder's file system has less free (IoError, exit 4,
// naming the output). The temporary file needs the room even when it replaces an existing output.
void require_disk_space(const std::string& output_path, uint64_t bytes, const std::string& what);
// "1.50 GiB", "512.0 MiB", "12.0 KiB" (binary units, cut, never rounded up: for messages).
std::string format_bytes(uint64_t b);

// Writes a whole text file atomically.
void write_file_atomic(const std::string& path, const std::string& content);
// Reads a whole regular file (open_regular_input); throws IoError when it cannot be opened/read, InputError if
// larger than max_bytes (the message states the bound).
std::string read_file(const std::string& path, uint64_t max_bytes = (1ull << 30));

}  // namespace nl
