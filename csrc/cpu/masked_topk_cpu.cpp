// pnn_fast::masked_topk on CPU: each row's k best columns in one pass over its scores, the
// excluded columns looked up only for the few scores that could enter (common/topk_row.h).
//
// Once a row has a threshold, a block of kBlock scores is tested against it with one
// vectorisable comparison, and only a block holding a candidate (or a NaN) is walked column by
// column.  A long row's threshold starts from a sample of its scores, so that the scan buffers
// little more than the k best; from no threshold it buffered about 250 columns of a 3,628-column
// row at k = 20, and the selections that kept its best were most of the op's time.  Rows run in
// parallel, one buffer per task.
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
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>  // admitted_columns_avx512, compiled for AVX-512 whatever the baseline
#endif

#include "common/checks.h"
#include "common/dispatch.h"
#include "common/topk_row.h"
#include "cpu/select_lowest.h"
#include "cpu/simd.h"

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

// Rows from this long start from a sampled threshold; every kSampleStride-th column is sampled.
constexpr int64_t kSampledRow = 256;
constexpr int64_t kSampleStride = 16;

// One user's excluded columns as bits: the sample skips them, and a buffered column is looked up
// in one load, where the sorted rows' cursors (topk_row.h, the CUDA lanes') walked every exclusion
// of the row up to it.  Words are set for a row and cleared after it, touching only the words of
// its exclusions.  An exclusion outside [0, cols) matches no column (the op does not check them):
// it sets no bit.
class ExcludedBits {
 public:
  explicit ExcludedBits(int64_t cols) : cols_(cols), words_((cols + 63) / 64, 0) {}

  void mark(const ExclusionSets& sets, int64_t user) { visit(sets, user, true); }
  void clear(const ExclusionSets& sets, int64_t user) { visit(sets, user, false); }
  bool excludes(int64_t column) const { return (words_[column >> 6] >> (column & 63)) & 1u; }

 private:
  void visit(const ExclusionSets& sets, int64_t user, bool marking) {
    for (int s = 0; s < sets.sets; ++s) {
      for (int64_t at = sets.indptr[s][user]; at < sets.indptr[s][user + 1]; ++at) {
        const int64_t column = sets.indices[s][at];
        if (column < 0 || column >= cols_) continue;
        words_[column >> 6] = marking ? words_[column >> 6] | (uint64_t{1} << (column & 63)) : 0;
      }
    }
  }

  int64_t cols_;
  std::vector<uint64_t> words_;
};

// A starting threshold for a row: the sampled_rank-th best score among its sampled columns that
// are neither excluded nor NaN, or false when there are too few of them or it is -inf (no use
// as a bound).  Keys are ~order_key, so the best score is the lowest key.
template <typename scalar_t, typename acc_t>
bool sampled_threshold(const scalar_t* row, int64_t cols, int64_t k, const ExcludedBits& excluded,
                       std::vector<typename KeyOf<acc_t>::type>& sample, acc_t& threshold) {
  using key_t = typename KeyOf<acc_t>::type;
  sample.resize(cols / kSampleStride + 1);
  int64_t size = 0;
  for (int64_t j = 0; j < cols; j += kSampleStride) {  // without a branch on the column
    const acc_t score = static_cast<acc_t>(row[j]);
    sample[size] = key_t(~order_key(score));
    size += (score == score) & !excluded.excludes(j);
  }
  const int64_t rank = sampled_rank(k, kSampleStride) + 1;  // admission is strictly above it
  if (rank > size) return false;
  select_lowest(sample.data(), size, rank);
  threshold = key_to_score<acc_t>(key_t(~sample[rank - 1]));
  return threshold > neg_infinity<acc_t>();
}

#ifdef PNN_SIMD_AVX2_DISPATCH
// Columns per pass of admitted_columns_avx512: a row is scanned in chunks, so that the threshold
// the chunk is tested against is never staler than one chunk.
constexpr int64_t kChunk = 1024;

// The positions i < n (n <= kChunk) with scores[i] above `threshold` or NaN, ascending, into
// `positions`; returns how many.  Each block of 16 scores is one compare and one compress store:
// no branch on the scores, where the block test of the scalar scan mispredicted at about every
// block that held a candidate.
__attribute__((target("avx512f"))) int64_t admitted_columns_avx512(const float* scores, int64_t n, float threshold,
                                                                   int32_t* positions) {
  const __m512 limit = _mm512_set1_ps(threshold);
  const __m512i step = _mm512_set1_epi32(16);
  __m512i position = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  int64_t count = 0;
  for (int64_t at = 0; at < n; at += 16) {
    const __mmask16 valid = n - at >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - at)) - 1u);
    const __m512 block = _mm512_maskz_loadu_ps(valid, scores + at);
    const __mmask16 admitted = _mm512_mask_cmp_ps_mask(valid, block, limit, _CMP_NLE_UQ);  // NaN too
    _mm512_mask_compressstoreu_epi32(positions + count, admitted, position);
    count += __builtin_popcount(admitted);
    position = _mm512_add_epi32(position, step);
  }
  return count;
}
#endif

// Offers the row's columns that may enter to `top`, in ascending order.  The columns skipped are
// those at or below the threshold when they are reached, which consider() would turn away: every
// path gives `top` the same state, so the same result.  `positions` is scratch of kChunk entries.
template <typename scalar_t, typename acc_t>
void scan_row(const scalar_t* row, int64_t cols, LaneTopK<acc_t>& top, const ExcludedBits& exclusions,
              std::vector<int32_t>& positions) {
#ifdef PNN_SIMD_AVX2_DISPATCH
  if constexpr (std::is_same_v<scalar_t, float>) {
    if (top.selected && simd_level() == kSimdAvx512) {
      positions.resize(kChunk);
      for (int64_t begin = 0; begin < cols; begin += kChunk) {
        const int64_t count = admitted_columns_avx512(row + begin, std::min(kChunk, cols - begin), top.threshold,
                                                      positions.data());
        for (int64_t i = 0; i < count; ++i) {
          const int64_t j = begin + positions[i];
          top.consider(row[j], j, exclusions);
        }
      }
      return;
    }
  }
#else
  (void)positions;
#endif
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
      std::vector<typename KeyOf<acc_t>::type> sample;
      std::vector<int32_t> positions;
      ExcludedBits excluded(cols);
      for (int64_t r = begin; r < end; ++r) {
        const scalar_t* row = S + r * cols;
        LaneTopK<acc_t> top{buffer.data(), k, buffer_capacity(k)};
        excluded.mark(in.sets, user[r]);
        acc_t threshold;
        const bool bounded = cols >= kSampledRow && sampled_threshold(row, cols, k, excluded, sample, threshold);
        if (bounded) top.start_above(threshold);
        scan_row(row, cols, top, excluded, positions);
        const int64_t found = top.finish(excluded);
        if (bounded && !(found == k && top.entries[k - 1].value > threshold)) {
          // fewer than k columns above the sampled threshold: every column is offered again
          top = LaneTopK<acc_t>{buffer.data(), k, buffer_capacity(k)};
          scan_row(row, cols, top, excluded, positions);
          top.finish(excluded);
        }
        excluded.clear(in.sets, user[r]);
        // k entries now: every column was offered until k were kept
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
