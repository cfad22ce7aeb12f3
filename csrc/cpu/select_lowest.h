// The lowest few of a CPU buffer, and the sample rank that bounds a row's selection: shared by the
// bottom-k of the PNN classes (cpu_rows.h) and the evaluator's top-k (masked_topk_cpu.cpp), which
// both start a long row from a bound taken from a sample of it.
#pragma once

#include <cmath>
#include <cstdint>

#include "common/quickselect.h"

namespace pnn_fast {

// a[0, rank) become the rank lowest of a[0, size) (distinct values), the rank-th lowest last.
template <typename T>
inline void select_lowest(T* a, int64_t size, int64_t rank) {
  select_first(a, size, rank, [](const T& x, const T& y) { return x < y; });
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
