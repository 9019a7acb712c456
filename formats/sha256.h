// SHA-256 (FIPS 180-4), small and dependency-free: the layout file records the hash of the trace it was
// learned from. Offline side only (formats/core stays xxhash-only).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace nl {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t n);
  // Lower-case hex digest; the object must not be updated afterwards.
  std::string hex_digest();

 private:
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t buf_len_ = 0;
  uint64_t total_ = 0;
  void block(const uint8_t* p);             // portable rounds
  void blocks(const uint8_t* p, size_t n);  // n whole blocks: SHA-NI where the CPU has it, else block()
};

namespace detail {
extern bool sha256_portable;  // tests: force the portable rounds
}

std::string sha256_hex(const std::string& data);
// Hash of a whole file, streamed; IoError when it cannot be read.
std::string sha256_file(const std::string& path);

}  // namespace nl
