// Selection of the lowest few of a CPU buffer, and the sample rank that bounds a row's selection.
// Shared by the bottom-k of the PNN classes (cpu_rows.h) and the evaluator's top-k
// (masked_topk_cpu.cpp), which both start a long row from a bound taken from a sample of it.
#pragma once

#include <cmath>
#include <cstdint>
#include <utility>

namespace pnn_fast {

// a[0, rank) become the rank lowest of a[0, size), the rank-th lowest last (1 <= rank <= size).
// A quickselect whose partition has no data-dependent branch (std::nth_element's mispredicted
// compares cost more than the whole scan of a row): element i swaps with the first element not
// below the pivot, and that boundary advances by the comparison's result.
template <typename T>
inline void select_lowest(T* a, int64_t size, int64_t rank) {
  const int64_t target = rank - 1;
  int64_t lo = 0, hi = size;  // target is in [lo, hi)
  while (hi - lo > 16) {
    const int64_t mid = lo + (hi - lo) / 2, last = hi - 1;
    // the median of the first, middle and last elements, moved to the end as the pivot
    if (a[mid] < a[lo]) std::swap(a[mid], a[lo]);
    if (a[last] < a[lo]) std::swap(a[last], a[lo]);
    if (a[mid] < a[last]) std::swap(a[mid], a[last]);
    const T pivot = a[last];
    int64_t boundary = lo;
    for (int64_t i = lo; i < last; ++i) {
      const T e = a[i];
      const bool below = e < pivot;
      a[i] = a[boundary];
      a[boundary] = e;
      boundary += below;
    }
    std::swap(a[boundary], a[last]);
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
    for (; at > lo && e < a[at - 1]; --at) a[at] = a[at - 1];
    a[at] = e;
  }
}

// The rank, within a sample of every stride-th entry of a row, whose entry bounds the row's
// `want` lowest with high probability: want / stride expected sample entries among them, plus
// three standard deviations of that binomial count, plus one.  A scan admitting the entries up to
// that sample entry buffers about (rank - 1) * stride of them; a sample that ran low shows as
// fewer than `want` admitted, and the caller rescans with no bound.
inline int64_t sampled_rank(int64_t want, int64_t stride) {
  const double expected = static_cast<double>(want) / static_cast<double>(stride);
  return static_cast<int64_t>(expected + 3.0 * std::sqrt(expected)) + 1;
}

}  // namespace pnn_fast
