// pnn_fast::masked_topk on CPU: each row's k best columns in one pass over its scores, the
// excluded columns looked up only for the few scores that could enter (common/topk_row.h).
//
// Once a row has a threshold, a block of kBlock scores is tested against it with one
// vectorisable comparison, and only a block holding a candidate (or a NaN) is walked column by
// column.  Rows run in parallel, one buffer per task.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <atomic>
#include <type_traits>
#include <limits>
#include <vector>

#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "common/checks.h"
#include "common/dispatch.h"
#include "common/topk_row.h"

namespace pnn_fast {
namespace {

constexpr int64_t kBlock = 8;

// Whether any of the n scores is above `lowest` or NaN.  On x86 a full float/double block is
// tested with SSE2 "not less-or-equal" compares (true for NaN too): GCC keeps the plain loop
// scalar, since it may not vectorise a comparison that could trap.
template <typename scalar_t, typename acc_t>
inline bool any_may_enter(const scalar_t* scores, int64_t n, acc_t lowest) {
#ifdef __SSE2__
  if (n == kBlock) {
    if constexpr (std::is_same_v<scalar_t, float>) {
      const __m128 limit = _mm_set1_ps(lowest);
      __m128 found = _mm_setzero_ps();
      for (int64_t at = 0; at < kBlock; at += 4) found = _mm_or_ps(found, _mm_cmpnle_ps(_mm_loadu_ps(scores + at), limit));
      return _mm_movemask_ps(found) != 0;
    } else if constexpr (std::is_same_v<scalar_t, double>) {
      const __m128d limit = _mm_set1_pd(lowest);
      __m128d found = _mm_setzero_pd();
      for (int64_t at = 0; at < kBlock; at += 2) found = _mm_or_pd(found, _mm_cmpnle_pd(_mm_loadu_pd(scores + at), limit));
      return _mm_movemask_pd(found) != 0;
    }
  }
#endif
  bool any = false;
  for (int64_t j = 0; j < n; ++j) any |= !(static_cast<acc_t>(scores[j]) <= lowest);
  return any;
}

// Room beyond the k kept entries: each selection costs O(capacity), so twice k amortises it
// (a larger buffer keeps a staler threshold and buffers more columns).
inline int64_t buffer_capacity(int64_t k) { return k + std::max<int64_t>(2 * k, 32); }

template <typename scalar_t, typename acc_t>
void scan_row(const scalar_t* row, int64_t cols, LaneTopK<acc_t>& top, ExclusionCursors& exclusions) {
  for (int64_t begin = 0; begin < cols; begin += kBlock) {
    const int64_t n = std::min(kBlock, cols - begin);
    if (top.selected && !any_may_enter(row + begin, n, top.threshold)) continue;
    for (int64_t j = begin; j < begin + n; ++j) top.consider(static_cast<acc_t>(row[j]), j, exclusions);
  }
}

std::tuple<at::Tensor, at::Tensor> masked_topk_cpu(const at::Tensor& scores, const at::Tensor& rows,
                                                   at::TensorList exclude_indptr, at::TensorList exclude_indices,
                                                   int64_t k) {
  constexpr const char* op = "pnn_fast::masked_topk";
  const MaskedTopkInputs in = prepare_masked_topk(op, scores, rows, exclude_indptr, exclude_indices, k);
  const int64_t num_rows = in.scores.size(0), cols = in.scores.size(1);
  at::Tensor values = at::empty({num_rows, k}, scores.options());
  at::Tensor columns = at::empty({num_rows, k}, rows.options());
  std::atomic<int64_t> first_nan_row{std::numeric_limits<int64_t>::max()};
  PNN_DISPATCH_FLOATING_TYPES(in.scores.scalar_type(), op, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* S = in.scores.data_ptr<scalar_t>();
    const int64_t* user = in.rows.data_ptr<int64_t>();
    scalar_t* values_out = values.data_ptr<scalar_t>();
    int64_t* columns_out = columns.data_ptr<int64_t>();
    // grain: rows of a few thousand scores each are worth a task on their own
    at::parallel_for(0, num_rows, std::max<int64_t>(1, 16384 / cols), [&](int64_t begin, int64_t end) {
      std::vector<RankedColumn<acc_t>> buffer(buffer_capacity(k) + 1);
      for (int64_t r = begin; r < end; ++r) {
        LaneTopK<acc_t> top{buffer.data(), k, buffer_capacity(k)};
        ExclusionCursors exclusions = in.sets.of_user(user[r]);
        scan_row(S + r * cols, cols, top, exclusions);
        top.finish(exclusions);  // k entries: every column is offered until k are kept
        if (top.saw_nan) {
          int64_t seen = first_nan_row.load();
          while (r < seen && !first_nan_row.compare_exchange_weak(seen, r)) {
          }
          continue;
        }
        for (int64_t slot = 0; slot < k; ++slot) {
          values_out[r * k + slot] = static_cast<scalar_t>(top.entries[slot].value);
          columns_out[r * k + slot] = top.entries[slot].column;
        }
      }
    });
  });
  const int64_t nan_row = first_nan_row.load();
  TORCH_CHECK_VALUE(nan_row == std::numeric_limits<int64_t>::max(), op, ": scores row ", nan_row,
                    " has a NaN at a column that is not excluded");
  return {values, columns};
}

}  // namespace
}  // namespace pnn_fast

TORCH_LIBRARY_IMPL(pnn_fast, CPU, m) {
  m.impl("masked_topk", &pnn_fast::masked_topk_cpu);
}
