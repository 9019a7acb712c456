// Large per-layer buffers (a layer's 512 MiB count matrix, its 268 MB mask): on transparent huge pages where the
// kernel grants them (THP "madvise" mode), so that they take a few hundred page faults instead of a hundred thousand
// (each a trap into the kernel, on a virtual machine into the hypervisor too), and reused from one layer to the next
// on the same thread (release_huge), so that the kernel does not zero fresh pages for every layer. Contents and
// results are unchanged; without THP (or off Linux) the buffers are ordinary.
#pragma once
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace nl {

// Below this a buffer holds too few 2 MiB pages to be worth the system call or a spare slot.
inline constexpr size_t kHugePageMinBytes = size_t(8) << 20;

// Asks for huge pages on the whole 2 MiB pages inside [p, p + bytes) (before they are first touched).
inline void advise_huge_pages(void* p, size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr uintptr_t kHuge = uintptr_t(2) << 20;
  const uintptr_t b = (reinterpret_cast<uintptr_t>(p) + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t e = (reinterpret_cast<uintptr_t>(p) + bytes) & ~(kHuge - 1);
  if (e > b) madvise(reinterpret_cast<void*>(b), e - b, MADV_HUGEPAGE);
#else
  (void)p, (void)bytes;
#endif
}

namespace detail {
// The calling thread's spare buffers of element type T (OpenMP threads persist across layers). At most two are
// kept: a layer releases its mask and its count matrix, the next layer on that thread takes them again.
template <class T>
std::vector<std::vector<T>>& huge_spares() {
  thread_local std::vector<std::vector<T>> spares;
  return spares;
}
}  // namespace detail

// Gives v's storage to the calling thread's spares when it is large (v is left empty either way).
template <class T>
void release_huge(std::vector<T>& v) {
  std::vector<T> old;
  old.swap(v);
  if (old.capacity() * sizeof(T) < kHugePageMinBytes) return;
  auto& spares = detail::huge_spares<T>();
  old.clear();
  if (spares.size() >= 2) spares.erase(spares.begin());  // the oldest goes back to the system
  spares.push_back(std::move(old));
}

// Empty storage for n elements in v (whose old contents are dropped), when n elements are large: a spare of the calling
// thread that holds n and is at most twice as large, else fresh storage advised onto huge pages. Small: unchanged.
template <class T>
void reserve_huge(std::vector<T>& v, size_t n) {
  if (n * sizeof(T) < kHugePageMinBytes || v.capacity() >= n) return;
  std::vector<T>().swap(v);
  auto& spares = detail::huge_spares<T>();
  size_t best = spares.size();
  for (size_t i = 0; i < spares.size(); ++i)
    if (spares[i].capacity() >= n && spares[i].capacity() / 2 <= n &&
        (best == spares.size() || spares[i].capacity() < spares[best].capacity()))
      best = i;
  if (best < spares.size()) {
    v.swap(spares[best]);
    spares.erase(spares.begin() + std::ptrdiff_t(best));
    return;
  }
  v.reserve(n);
  advise_huge_pages(v.data(), n * sizeof(T));
}

// v.assign(n, value) on storage from reserve_huge.
template <class T>
void assign_huge(std::vector<T>& v, size_t n, const T& value) {
  if (v.capacity() < n) reserve_huge(v, n);
  v.assign(n, value);
}

// v.resize(n) (new elements value-initialised) for an empty v, on storage from reserve_huge.
template <class T>
void resize_huge(std::vector<T>& v, size_t n) {
  if (v.empty()) reserve_huge(v, n);
  v.resize(n);
}

}  // namespace nl
