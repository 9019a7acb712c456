// Pieces every reader of the disk shares (the probe and the I/O engines): block-aligned buffers and opening a
// file for direct reads with a buffered fallback where the filesystem refuses O_DIRECT (tmpfs, some FUSE).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

namespace nl {

inline constexpr size_t kIoBlock = 4096;  // alignment of direct reads: offsets, lengths and buffers

inline uint64_t io_align_down(uint64_t v) { return v & ~uint64_t(kIoBlock - 1); }
inline uint64_t io_align_up(uint64_t v) { return (v + kIoBlock - 1) & ~uint64_t(kIoBlock - 1); }

// A zeroed buffer aligned to kIoBlock, usable as an O_DIRECT target. Movable, not copyable.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t bytes) { resize(bytes); }
  // Grows (never shrinks); old contents are not kept.
  void resize(size_t bytes);
  // The same without zeroing (contents undefined), for a buffer the caller overwrites whole: a multi-GB read target
  // is then faulted in once, by the read, instead of by a memset and again by the read.
  void resize_uninit(size_t bytes);
  uint8_t* data() { return p_.get(); }
  const uint8_t* data() const { return p_.get(); }
  size_t size() const { return size_; }

 private:
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  std::unique_ptr<uint8_t, Free> p_;
  size_t size_ = 0;
};

struct OpenedFile {
  int fd = -1;
  bool direct = false;  // O_DIRECT in effect
};

// Opens `path` read-only, with O_DIRECT when `want_direct` and the filesystem accepts it (EINVAL falls back to
// buffered reads; the caller says so once). Throws IoError when the file cannot be opened at all.
OpenedFile open_for_reading(const std::string& path, bool want_direct);

}  // namespace nl
