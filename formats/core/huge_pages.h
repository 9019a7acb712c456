// Large buffers on transparent huge pages where the kernel grants them (THP "madvise" mode): a layer's 512 MiB
// count matrix or 268 MB mask then takes a few hundred page faults instead of a hundred thousand (each a trap into
// the kernel, and on a virtual machine into the hypervisor too). A hint only: contents and results are unchanged,
// and without THP (or off Linux) the buffers are ordinary.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace nl {

// Below this a buffer holds too few 2 MiB pages to be worth the system call.
inline constexpr size_t kHugePageMinBytes = size_t(8) << 20;
inline constexpr size_t kHugePageBytes = size_t(2) << 20;  // x86-64 and aarch64 (4 KiB granule) PMD size

// Asks for huge pages on the whole 2 MiB pages inside [p, p + bytes) (before they are first touched).
inline void advise_huge_pages(void* p, size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr uintptr_t kHuge = kHugePageBytes;
  const uintptr_t b = (reinterpret_cast<uintptr_t>(p) + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t e = (reinterpret_cast<uintptr_t>(p) + bytes) & ~(kHuge - 1);
  if (e > b) madvise(reinterpret_cast<void*>(b), e - b, MADV_HUGEPAGE);
#else
  (void)p, (void)bytes;
#endif
}

// v.assign(n, value), with fresh storage advised onto huge pages before it is written when it is large.
template <class T>
void assign_huge(std::vector<T>& v, size_t n, const T& value) {
  if (n * sizeof(T) >= kHugePageMinBytes && v.capacity() < n) {
    std::vector<T>().swap(v);  // no copy of the old contents into the new storage
    v.reserve(n);
    advise_huge_pages(v.data(), n * sizeof(T));
  }
  v.assign(n, value);
}

// v.resize(n) for a vector whose new elements are written next (value-initialised like resize), on huge pages
// when large.
template <class T>
void resize_huge(std::vector<T>& v, size_t n) {
  if (n * sizeof(T) >= kHugePageMinBytes && v.capacity() < n) {
    std::vector<T> fresh;
    fresh.reserve(n);
    advise_huge_pages(fresh.data(), n * sizeof(T));
    fresh.assign(v.begin(), v.end());
    v.swap(fresh);
  }
  v.resize(n);
}

}  // namespace nl
