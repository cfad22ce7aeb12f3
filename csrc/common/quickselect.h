// Selection of the first few elements of a small buffer in a given order, shared by the CPU and
// CUDA kernels: the evaluator's top-k lanes (topk_row.h) and the CPU's bottom-k of the PNN classes
// and sampled bounds (cpu/select_lowest.h).
#pragma once

#include <cstdint>
#include <type_traits>

#include "common/pnn_rows.h"

#if defined(__SSE2__) && !defined(__CUDA_ARCH__)
#include <emmintrin.h>
#endif

namespace pnn_fast {

// to = from, for the partition below: a 16-byte element is copied by one 16-byte load and store
// on x86 hosts, so that a later load of the whole element is served from the store (GCC otherwise
// stores a struct held in registers field by field, and that load waits for both to retire).
template <typename T>
PNN_HD inline void copy_element(T& to, const T& from) {
#if defined(__SSE2__) && !defined(__CUDA_ARCH__)
  if constexpr (sizeof(T) == 16 && std::is_trivially_copyable_v<T>) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(&to), _mm_loadu_si128(reinterpret_cast<const __m128i*>(&from)));
    return;
  }
#endif
  to = from;
}

template <typename T>
PNN_HD inline void swap_values(T& a, T& b) {
  const T t = a;
  a = b;
  b = t;
}

// a[0, rank) become the `rank` first elements of a[0, size) in the order `before` (a strict order
// on the elements, which must be distinct under it), a[rank - 1] the rank-th (1 <= rank <= size).
// A quickselect with a median-of-three pivot, so ascending or descending runs take linear time,
// not quadratic.  Its partition has no data-dependent branch: the boundary advances by the
// comparison's result.  On the CPU a mispredicted comparison per element (std::nth_element's) cost
// more than the scan of a row.  The partition moves a hole rather than swapping: each store copies
// an element as it is in memory, where a swap through a temporary stored its fields one by one and
// the next iteration's load of the whole element waited for them (a failed store forward, a third
// of the top-k selection's time on a 16-byte entry).
template <typename T, typename Before>
PNN_HD inline void select_first(T* a, int64_t size, int64_t rank, Before before) {
  const int64_t target = rank - 1;
  int64_t lo = 0, hi = size;  // target is in [lo, hi)
  while (hi - lo > 16) {
    const int64_t mid = lo + (hi - lo) / 2, last = hi - 1;
    // the median of the first, middle and last elements, moved to the end as the pivot
    if (before(a[mid], a[lo])) swap_values(a[mid], a[lo]);
    if (before(a[last], a[lo])) swap_values(a[last], a[lo]);
    if (before(a[mid], a[last])) swap_values(a[mid], a[last]);
    const T pivot = a[last];
    // a[lo, boundary) are before the pivot, a[boundary, i - 1) are not, a[i - 1] is free (its
    // element is `aside`)
    const T aside = a[lo];
    int64_t boundary = lo;
    for (int64_t i = lo + 1; i < last; ++i) {
      const bool first = before(a[i], pivot);  // a[i] is not stored to before: no wait on a store
      copy_element(a[i - 1], a[boundary]);
      copy_element(a[boundary], a[i]);
      boundary += first ? 1 : 0;
    }
    a[last - 1] = a[boundary];
    a[boundary] = aside;
    boundary += before(aside, pivot) ? 1 : 0;
    swap_values(a[boundary], a[last]);
    if (boundary == target) return;
    if (target < boundary) {
      hi = boundary;
    } else {
      lo = boundary + 1;
    }
  }
  for (int64_t i = lo + 1; i < hi; ++i) {  // insertion sort of the last few
    const T e = a[i];
    int64_t at = i;
    for (; at > lo && before(e, a[at - 1]); --at) a[at] = a[at - 1];
    a[at] = e;
  }
}

}  // namespace pnn_fast
