// The CPU scan of a score row into a LaneTopK (common/topk_row.h): shared by pnn_fast::masked_topk
// (a row of given scores) and pnn_fast::dot_topk (a row computed block by block, one LaneTopK per
// row kept across the blocks).
//
// Once a row has a threshold, a block of kBlock scores is tested against it with one vectorisable
// comparison, and only a block holding a candidate (or a NaN) is walked column by column; with
// AVX-512, a compress store lists the admitted columns of 16 scores at a time instead.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#ifdef __SSE2__
#include <emmintrin.h>
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>  // admitted_columns_avx512, compiled for AVX-512 whatever the baseline
#endif

#include "common/pnn_rows.h"
#include "common/topk_row.h"
#include "cpu/select_lowest.h"
#include "cpu/simd.h"

namespace pnn_fast {

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

#ifdef PNN_SIMD_AVX2_DISPATCH
// Columns per pass of admitted_columns_avx512: a row is scanned in chunks, so that the threshold
// the chunk is tested against is never staler than one chunk.
constexpr int64_t kChunk = 1024;

// The positions i < n (n <= kChunk) with scores[i] above `threshold` or NaN, ascending, into
// `positions`; returns how many.  Each block of 16 scores is one compare and one compress store:
// no branch on the scores, where the block test of the scalar scan mispredicted at about every
// block that held a candidate.
__attribute__((target("avx512f"))) inline int64_t admitted_columns_avx512(const float* scores, int64_t n,
                                                                          float threshold, int32_t* positions) {
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

// Offers the n scores of `row`, columns first_column + [0, n), that may enter to `top`, in
// ascending order.  The columns skipped are those at or below the threshold when they are reached,
// which consider() would turn away: every path gives `top` the same state, so the same result.
// `positions` is scratch (kChunk entries where AVX-512 is used).
template <typename scalar_t, typename acc_t, typename Exclusions>
void scan_row(const scalar_t* row, int64_t n, int64_t first_column, LaneTopK<acc_t>& top, Exclusions& exclusions,
              std::vector<int32_t>& positions) {
#ifdef PNN_SIMD_AVX2_DISPATCH
  if constexpr (std::is_same_v<scalar_t, float>) {
    if (top.selected && simd_level() == kSimdAvx512) {
      positions.resize(kChunk);
      for (int64_t begin = 0; begin < n; begin += kChunk) {
        const int64_t count = admitted_columns_avx512(row + begin, std::min(kChunk, n - begin), top.threshold,
                                                      positions.data());
        for (int64_t i = 0; i < count; ++i) {
          const int64_t j = begin + positions[i];
          top.consider(row[j], first_column + j, exclusions);
        }
      }
      return;
    }
  }
#else
  (void)positions;
#endif
  for (int64_t begin = 0; begin < n; begin += kBlock) {
    const int64_t width = std::min(kBlock, n - begin);
    if (top.selected && !any_may_enter(row + begin, width, top.threshold)) continue;
    for (int64_t j = begin; j < begin + width; ++j) top.consider(static_cast<acc_t>(row[j]), first_column + j, exclusions);
  }
}

// Rows from this long start from a sampled threshold; every kSampleStride-th column is sampled.
constexpr int64_t kSampledRow = 256;
constexpr int64_t kSampleStride = 16;

// A starting threshold for a row: the sampled_rank-th best score among its sampled columns that
// are neither excluded nor NaN, or false when there are too few of them or it is -inf (no use
// as a bound).  Keys are ~order_key, so the best score is the lowest key.
template <typename scalar_t, typename acc_t, typename Exclusions>
bool sampled_threshold(const scalar_t* row, int64_t cols, int64_t k, Exclusions& exclusions,
                       std::vector<typename KeyOf<acc_t>::type>& sample, acc_t& threshold) {
  using key_t = typename KeyOf<acc_t>::type;
  sample.resize(cols / kSampleStride + 1);
  int64_t size = 0;
  for (int64_t j = 0; j < cols; j += kSampleStride) {  // without a branch on the column
    const acc_t score = static_cast<acc_t>(row[j]);
    sample[size] = key_t(~order_key(score));
    size += (score == score) & !exclusions.excludes(j);
  }
  const int64_t rank = sampled_rank(k, kSampleStride) + 1;  // admission is strictly above it
  if (rank > size) return false;
  select_lowest(sample.data(), size, rank);
  threshold = key_to_score<acc_t>(key_t(~sample[rank - 1]));
  return threshold > neg_infinity<acc_t>();
}

// Offers the first n columns of a row to a fresh `top`, from a threshold sampled from them when
// n >= kSampledRow, so that the scan buffers little more than the k best: from no threshold it
// buffered about 250 columns of a 3,628-column row at k = 20, and the selections that kept its
// best were most of masked_topk's time.  When fewer than k of the n columns score above the
// sampled bound, columns it turned away may belong to the k best: the n columns are offered again
// with no bound, after rewind() puts `exclusions` back at the row's first column (cursors move
// forward with each lookup; a bit set needs nothing).  Ends with the buffer selected.
template <typename scalar_t, typename acc_t, typename Exclusions, typename Rewind>
void scan_row_from_sample(const scalar_t* row, int64_t n, LaneTopK<acc_t>& top, Exclusions& exclusions,
                          const Rewind& rewind, std::vector<typename KeyOf<acc_t>::type>& sample,
                          std::vector<int32_t>& positions) {
  acc_t threshold;
  const bool bounded = n >= kSampledRow && sampled_threshold(row, n, top.k, exclusions, sample, threshold);
  rewind();
  if (bounded) top.start_above(threshold);
  scan_row(row, n, 0, top, exclusions, positions);
  top.select(exclusions);
  if (!bounded || (top.size == top.k && top.entries[top.k - 1].value > threshold)) return;
  top = LaneTopK<acc_t>{top.entries, top.k, top.capacity};
  rewind();
  scan_row(row, n, 0, top, exclusions, positions);
  top.select(exclusions);
}

// The lowest row whose scan saw a NaN at a column that is not excluded, among rows scanned in
// parallel: the row the error names, whatever the thread count.
class FirstNanRow {
 public:
  void note(int64_t row) {
    int64_t seen = row_.load();
    while (row < seen && !row_.compare_exchange_weak(seen, row)) {
    }
  }
  bool found() const { return row_.load() != kNone; }
  int64_t row() const { return row_.load(); }

 private:
  static constexpr int64_t kNone = std::numeric_limits<int64_t>::max();
  std::atomic<int64_t> row_{kNone};
};

// Ends a scanned row: completes its top-k (every column was offered until k were kept, so it holds
// k entries) and writes them best first to values[0, k) and columns[0, k).  A row whose top-k met a
// NaN writes nothing and is noted in first_nan_row, for the op's error.
template <typename scalar_t, typename acc_t, typename Exclusions>
void finish_row(int64_t r, LaneTopK<acc_t>& top, Exclusions& exclusions, scalar_t* values, int64_t* columns,
                FirstNanRow& first_nan_row) {
  top.finish(exclusions);
  if (top.saw_nan) {
    first_nan_row.note(r);
    return;
  }
  for (int64_t slot = 0; slot < top.k; ++slot) {
    values[slot] = static_cast<scalar_t>(top.entries[slot].value);
    columns[slot] = top.entries[slot].column;
  }
}

}  // namespace pnn_fast
