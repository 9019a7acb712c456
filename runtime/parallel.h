// OpenMP regions only where they run on more than one thread.
//
// libgomp forms a team for every parallel region it enters, including one whose `if` clause is false and one that
// runs on a single thread, and ends it with a futex wake system call whether or not a thread waits: 1.18 us per
// region on the development host (a virtual machine, where a system call is dear), against 0.001 us for the same loop
// without the region. A token of the 8-layer small-relu model entered ~147 regions, most of them below their work
// threshold: 0.17 ms of a 1.1 ms token at one thread. So the sites below open a region only when it would run on more
// than one thread and call their body inline otherwise. Which thread computes what never changes a number (every
// output is one thread's sum in a fixed order), so the inline and the parallel forms give the same bits.
#pragma once
#include <omp.h>

namespace nl {

// Whether a region is worth opening: `worth` (the site's work threshold) and more than one thread allowed.
inline bool parallel_worth(bool worth) { return worth && omp_get_max_threads() > 1; }

// f(i) for i in [0, n): split over the threads in contiguous blocks (schedule(static)) when parallel_worth(worth),
// in order on the calling thread otherwise.
template <class F>
void parallel_for(long n, bool worth, const F& f) {
  if (parallel_worth(worth)) {
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; ++i) f(i);
  } else {
    for (long i = 0; i < n; ++i) f(i);
  }
}

// f() once per thread of a parallel region when parallel_worth(worth), once on the calling thread otherwise (where
// omp_get_num_threads() is 1 and orphaned worksharing constructs inside f run whole on it, with no team to wake).
template <class F>
void parallel_region(bool worth, const F& f) {
  if (parallel_worth(worth)) {
#pragma omp parallel
    f();
  } else {
    f();
  }
}

}  // namespace nl
