// CPU building blocks of the per-row kernels: task sizing, a row's scores and U_b flags, and
// the bottom-k selection.  The decisions themselves are the shared functions of pnn_rows.h.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/Parallel.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>  // BottomK's AVX-512 scan, compiled for AVX-512 whatever the baseline
#endif

#include "common/pnn_rows.h"
#include "cpu/select_lowest.h"
#include "cpu/simd.h"

namespace pnn_fast {

// Rows per at::parallel_for task: about 32K scored (row, candidate, dim) terms per task, so that
// small batches stay on one thread and large ones split evenly.
inline int64_t row_grain(int64_t num_candidates, int64_t dim) {
  return std::max<int64_t>(1, (int64_t{1} << 15) / std::max<int64_t>(1, num_candidates * dim));
}

// Rows per task of the table-lookup loops (embedding_bpr, gathered_norm, ...): about 16K
// multiply-adds each, for `per_row` of them per row.
inline int64_t lookup_grain(int64_t per_row) {
  return std::max<int64_t>(1, (int64_t{1} << 14) / std::max<int64_t>(1, per_row));
}

// A hint to fetch *address into cache ahead of a dependent load (random rows of a table).
inline void prefetch(const void* address) {
#if defined(__GNUC__) || defined(__clang__)
  __builtin_prefetch(address);
#else
  (void)address;
#endif
}

// How many gathers ahead the table-lookup loops ask for a row (prefetch_row): far enough to hide a
// miss to memory behind the multiply-adds of the rows in between, near enough to stay in L1.
constexpr int64_t kPrefetchAhead = 16;

// Fetches the cache lines of [begin, begin + count) elements ahead of their use: the rows a lookup
// loop reads or adds into are random rows of a table, which no hardware prefetcher sees coming.
// Only a hint: the arithmetic, and so every bit of the result, is unchanged.
template <typename T>
inline void prefetch_row(const T* begin, int64_t count) {
  const char* bytes = reinterpret_cast<const char*>(begin);
  const int64_t size = count * static_cast<int64_t>(sizeof(T));
  for (int64_t offset = 0; offset < size; offset += 64) prefetch(bytes + offset);
}

// Runs f(c0, c1) on column blocks [c0, c1) of [0, d), in parallel.  Scatter-adds into table rows
// that several batch entries share are split by columns rather than by rows: a task owns whole
// columns of every output row, so each entry accumulates in the caller's loop order whatever the
// number of threads (deterministic, and no atomics).  `entries` (rows scattered) sizes the tasks.
template <typename F>
void for_column_blocks(int64_t d, int64_t entries, F f) {
  constexpr int64_t kBlock = 16;  // one 64-byte cache line of float
  const int64_t blocks = (d + kBlock - 1) / kBlock;
  const int64_t grain = entries * kBlock < (int64_t{1} << 14) ? blocks : 1;
  at::parallel_for(0, blocks, grain, [&](int64_t begin, int64_t end) {
    f(begin * kBlock, std::min(d, end * kBlock));
  });
}

// out[i] = 1 when items[i] is in U_b of `row` (neither its positive nor a known item of its user),
// else 0: Row::unlabeled for a list of items, with the binary searches over the user's known list
// (pnn_rows.h sorted_contains's search_step) run in lockstep.  Every step's loads are independent
// across the items, so their cache misses overlap; one search at a time waits for each miss in
// turn, which was half of a sampled-candidate row's time.
template <typename scalar_t, typename acc_t>
void unlabeled_flags(const Row<scalar_t, acc_t>& row, const int64_t* items, int64_t count, uint8_t* out) {
  constexpr int64_t kGroup = 16;
  const int64_t* at[kGroup];
  for (int64_t first = 0; first < count; first += kGroup) {
    const int64_t size = std::min(kGroup, count - first);
    const int64_t* item = items + first;
    if (row.num_known <= 0) {
      for (int64_t i = 0; i < size; ++i) out[first + i] = item[i] != row.pos_item;
      continue;
    }
    for (int64_t i = 0; i < size; ++i) at[i] = row.known;
    for (int64_t n = row.num_known; n > 1;) {
      const int64_t half = n >> 1;
      for (int64_t i = 0; i < size; ++i) at[i] = search_step(at[i], half, item[i]);
      n -= half;
    }
    for (int64_t i = 0; i < size; ++i) out[first + i] = (item[i] != row.pos_item) & (*at[i] != item[i]);
  }
}

// a[k] converted to acc_t, into `out` (resized to d).
template <typename scalar_t, typename acc_t>
void to_acc(const scalar_t* a, int64_t d, std::vector<acc_t>& out) {
  out.resize(d);
  for (int64_t k = 0; k < d; ++k) out[k] = acc_t(a[k]);
}

// One call's candidates, prepared once and read by every task.  For a shared list: the
// embeddings tiled for SIMD scoring, the positions of each item in the list (so that a row finds
// its labeled candidates with one lookup per known item, see labeled_positions) and the sum of all
// candidate embeddings (the class sums subtract from it, see class_centroids_cpu.cpp).
template <typename scalar_t, typename acc_t>
struct CandidateSet {
  const RowBatch<scalar_t>& batch;
  bool shared;
  TiledVectors<acc_t> tiles;
  std::vector<int32_t> first_position;  // [num_items]: the smallest j with c_j = item, or -1
  std::vector<int32_t> next_position;   // [C]: the next j' > j with c_j' = c_j, or -1
  std::vector<acc_t> total;             // sum_j item_table[c_j]

  explicit CandidateSet(const RowBatch<scalar_t>& b) : batch(b), shared(b.candidate_row_stride == 0) {
    if (!shared) return;
    const int64_t* items = batch.candidates;
    tiles.load(batch.item_table, items, batch.num_candidates, batch.dim);
    // int32 positions: a shared list is one batch's positives, far below 2^31 (checked by the caller)
    first_position.assign(batch.num_items, -1);
    next_position.resize(batch.num_candidates);
    for (int64_t j = batch.num_candidates - 1; j >= 0; --j) {
      next_position[j] = first_position[items[j]];
      first_position[items[j]] = static_cast<int32_t>(j);
    }
    total.assign(batch.dim, acc_t(0));
    for (int64_t j = 0; j < batch.num_candidates; ++j) {
      const scalar_t* v = batch.item_table + items[j] * batch.dim;
      for (int64_t i = 0; i < batch.dim; ++i) total[i] += acc_t(v[i]);
    }
  }

  // The labeled candidates j of `row` (its item is the row's positive or a known item) of a shared
  // list, into `out`: the first position of each such item in the row's order of items, then the
  // repeats.  One table lookup per known item, O(N_u + labeled candidates) per row whatever C is
  // (a binary search per known item cost a third of an in-batch PNN step).  The first positions
  // are kept without a branch: most known items are not in the batch, and a branch on it
  // mispredicted about as often as not; only the rarer repeats are walked.
  void labeled_positions(const Row<scalar_t, acc_t>& row, std::vector<int64_t>& out) const {
    out.resize(row.num_known + 1);
    int64_t n = 0;
    for (int64_t i = 0; i < row.num_known; ++i) {
      const int32_t j = first_position[row.known[i]];
      out[n] = j;
      n += j >= 0;
    }
    if (!sorted_contains(row.known, row.num_known, row.pos_item)) {
      const int32_t j = first_position[row.pos_item];
      out[n] = j;
      n += j >= 0;
    }
    out.resize(n);
    for (int64_t i = 0; i < n; ++i) {
      for (int32_t j = next_position[out[i]]; j >= 0; j = next_position[j]) out.push_back(j);
    }
  }
};

// Per-task scratch: the scores s_j, the U_b flags and the keys of one row at a time.
template <typename scalar_t, typename acc_t>
class RowScan {
 public:
  using key_t = typename KeyOf<acc_t>::type;

  explicit RowScan(const CandidateSet<scalar_t, acc_t>& set) : set_(set) {}

  // Loads row b of the batch and returns its view.  Rows b to task_end - 1 are the caller's next
  // ones: with a shared list their scores are computed kScoredAhead rows at a time, in one pass
  // over the candidate tiles (TiledVectors::lane_sums_rows, the same values as one row at a time).
  const Row<scalar_t, acc_t>& load(int64_t b, int64_t task_end) {
    const RowBatch<scalar_t>& batch = set_.batch;
    const int64_t count = batch.num_candidates, d = batch.dim;
    row_ = Row<scalar_t, acc_t>(batch, b);
    const acc_t* scores;
    if (set_.shared) {
      if (b < ahead_begin_ || b >= ahead_end_) score_ahead(b, std::min(task_end, b + kScoredAhead));
      scores = ahead_scores_.data() + (b - ahead_begin_) * set_.tiles.padded_count();
    } else {
      // the candidate rows of a later row of the task, fetched while this one is scored: random rows
      // of the table, each a miss to memory on a large catalog, which no hardware prefetcher sees
      // coming (prefetch_row)
      const int64_t later = b + std::max<int64_t>(1, kPrefetchAhead / std::max<int64_t>(count, 1));
      if (later < task_end) {
        const int64_t* items = batch.candidates + later * batch.candidate_row_stride;
        for (int64_t j = 0; j < count; ++j) prefetch_row(batch.item_table + items[j] * d, d);
      }
      own_tiles_.load(row_.item_table, row_.candidates, count, d);
      to_acc(row_.user, d, user_);
      ahead_scores_.resize(own_tiles_.padded_count());
      own_tiles_.lane_sums(user_.data(), DotTerm{}, ahead_scores_.data());
      scores = ahead_scores_.data();
    }
    scores_ = scores;
    keys_.resize(count);
    key_t* keys = keys_.data();
    run_widest([&]() PNN_INLINE_LAMBDA {
      // locals: the closure's fields could alias the stores, which would stop vectorisation
      key_t* out = keys;
      const acc_t* in = scores;
      const int64_t n = count;
      for (int64_t j = 0; j < n; ++j) out[j] = order_key(in[j]);  // vectorised: no branch
    });
    labeled_.clear();
    if (set_.shared) {
      set_.labeled_positions(row_, labeled_);
      for (const int64_t j : labeled_) keys_[j] = key_t(kExcludedKey);
    } else {
      flags_.resize(count);
      unlabeled_flags(row_, row_.candidates, count, flags_.data());
      for (int64_t j = 0; j < count; ++j) keys_[j] = flags_[j] ? keys_[j] : key_t(kExcludedKey);
    }
    return row_;
  }

  int64_t count() const { return static_cast<int64_t>(keys_.size()); }
  const acc_t* scores() const { return scores_; }
  // order_key of s_j for members of U_b, kExcludedKey for the others (as Row::key).
  const key_t* keys() const { return keys_.data(); }

  // The labeled candidates j (not in U_b) of the loaded row, for a shared list only.
  const std::vector<int64_t>& labeled() const { return labeled_; }

  // classify_key(key, j, ...) == (negative ? kNegative : kNeutral) without its branches, for
  // members(): `any` is whether the bottom k is non-empty (cutoff >= 0), `last` the cutoff.
  static inline __attribute__((always_inline)) bool is_member(key_t key, int32_t j, key_t threshold_key,
                                                             int32_t last, bool negative, bool any) {
    const bool bottom = any & ((key < threshold_key) | ((key == threshold_key) & (j <= last)));
    return (key != key_t(kExcludedKey)) & (bottom == negative);
  }

  // The candidates j of class `cls` (kNeutral or kNegative) of the loaded row given its bottom-k
  // state, in increasing j, into `out`: classify_key(keys[j], j, ...) == cls.  A class is a small
  // share of the row, so membership is first a byte per candidate, in one loop of integer
  // compares that the compiler vectorises, and then only the non-zero bytes are visited, eight
  // at a time.
  void members(RowClass cls, key_t threshold_key, int64_t cutoff, std::vector<int64_t>& out) {
    const int64_t count = static_cast<int64_t>(keys_.size());
    const int64_t padded = (count + 7) / 8 * 8;
    const bool negative = cls == kNegative, any = cutoff >= 0;  // an empty bottom k has no member
    const key_t* keys = keys_.data();
    // 32-bit positions (C < 2^31, see prepare_row_inputs) keep the lanes as wide as float keys
    const int32_t last = static_cast<int32_t>(std::min<int64_t>(cutoff, count));
#ifdef PNN_SIMD_AVX2_DISPATCH
    if constexpr (std::is_same_v<key_t, uint32_t>) {
      if (simd_level() == kSimdAvx512) {
        out.resize(count);
        out.resize(members_avx512(keys, count, threshold_key, last, negative, any, out.data()));
        return;
      }
    }
#endif
    flags_.assign(padded, uint8_t{0});
    uint8_t* flags = flags_.data();
    run_widest([&]() PNN_INLINE_LAMBDA {  // unsigned compares: SSE2 has none, AVX2 has them
      // locals: the byte stores could alias the closure's fields, which would stop vectorisation
      const key_t* in = keys;
      uint8_t* out = flags;
      const key_t bound = threshold_key;
      const int32_t n = static_cast<int32_t>(count), through = last;
      const bool want_bottom = negative, nonempty = any;
      for (int32_t j = 0; j < n; ++j) out[j] = is_member(in[j], j, bound, through, want_bottom, nonempty);
    });
    static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "byte b of the word is flags[base + b]");
    out.resize(count);
    int64_t n = 0;
    for (int64_t base = 0; base < padded; base += 8) {
      uint64_t word;
      std::memcpy(&word, flags + base, sizeof word);
      for (; word != 0; word &= word - 1) out[n++] = base + (__builtin_ctzll(word) >> 3);
    }
    out.resize(n);
  }

#ifdef PNN_SIMD_AVX2_DISPATCH
  // members() for float keys on AVX-512: each block of 16 keys tested in one vector and its
  // members' positions compress-stored, with no branch on the bytes of a flag word (whose
  // set-bit loop mispredicted on every row).  Writes the same positions, in increasing j.
  __attribute__((target("avx512f"))) static int64_t members_avx512(const uint32_t* keys, int64_t count,
                                                                   uint32_t threshold_key, int32_t last,
                                                                   bool negative, bool any, int64_t* out) {
    const __m512i bound = _mm512_set1_epi32(static_cast<int32_t>(threshold_key));
    const __m512i through = _mm512_set1_epi32(last);
    const __m512i excluded = _mm512_set1_epi32(static_cast<int32_t>(kExcludedKey));
    const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __mmask16 all = any ? __mmask16(0xFFFF) : __mmask16(0);
    int64_t n = 0, begin = 0;
    for (; begin + 16 <= count; begin += 16) {
      const __m512i key = _mm512_loadu_si512(keys + begin);
      const __m512i j = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int32_t>(begin)), lanes);
      const __mmask16 bottom =
          all & (_mm512_cmplt_epu32_mask(key, bound) |
                 (_mm512_cmpeq_epi32_mask(key, bound) & _mm512_cmple_epi32_mask(j, through)));
      const __mmask16 member = _mm512_cmpneq_epi32_mask(key, excluded) & (negative ? bottom : __mmask16(~bottom));
      const __m512i low = _mm512_cvtepu32_epi64(_mm512_castsi512_si256(j));
      const __m512i high = _mm512_cvtepu32_epi64(_mm512_extracti64x4_epi64(j, 1));
      const int64_t low_count = __builtin_popcount(member & 0xFFu);
      _mm512_mask_compressstoreu_epi64(out + n, static_cast<__mmask8>(member & 0xFFu), low);
      _mm512_mask_compressstoreu_epi64(out + n + low_count, static_cast<__mmask8>(member >> 8), high);
      n += low_count + __builtin_popcount(member >> 8);
    }
    for (int64_t j = begin; j < count; ++j) {
      out[n] = j;
      n += is_member(keys[j], static_cast<int32_t>(j), threshold_key, last, negative, any);
    }
    return n;
  }
#endif

  // (argmax_{j in U_b} s_j with the smallest j on ties or -1, |U_b|) of the loaded row: the
  // largest key, then its first position (hard_better's order, in two simple loops).
  std::pair<int64_t, int64_t> hard_negative() const {
    key_t best = 0;
    int32_t members = 0;  // C < 2^31 (prepare_row_inputs); a count as wide as float keys vectorises
    const key_t* keys = keys_.data();
    const int64_t count = static_cast<int64_t>(keys_.size());
    run_widest([&]() PNN_INLINE_LAMBDA {  // an unsigned max: SSE2 has none, AVX2 has it
      key_t row_best = 0;  // locals, not the captured references, so that they stay in registers
      int32_t row_members = 0;
      const key_t* in = keys;
      const int64_t n = count;
      for (int64_t j = 0; j < n; ++j) {
        row_members += in[j] != key_t(kExcludedKey);
        row_best = in[j] > row_best ? in[j] : row_best;
      }
      best = row_best;
      members = row_members;
    });
    if (members == 0) return {-1, 0};
    return {std::find(keys_.begin(), keys_.end(), best) - keys_.begin(), members};
  }

 private:
  // Rows scored per pass over a shared list's tiles: a multiple of every row group of
  // tile_chains_rows_dispatch, and few enough that their scores stay in cache ([8, C] acc_t).
  static constexpr int64_t kScoredAhead = 8;

  // Scores of rows [begin, end) of a shared list, row r at ahead_scores_[(r - begin) * padded C].
  void score_ahead(int64_t begin, int64_t end) {
    const RowBatch<scalar_t>& batch = set_.batch;
    const int64_t rows = end - begin, d = batch.dim, padded = set_.tiles.padded_count();
    user_.resize(rows * d);
    ahead_scores_.resize(rows * padded);
    const acc_t* users[kScoredAhead];
    acc_t* outs[kScoredAhead];
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t k = 0; k < d; ++k) user_[r * d + k] = acc_t(batch.user_emb[(begin + r) * d + k]);
      users[r] = user_.data() + r * d;
      outs[r] = ahead_scores_.data() + r * padded;
    }
    set_.tiles.lane_sums_rows(users, rows, DotTerm{}, outs);
    ahead_begin_ = begin;
    ahead_end_ = end;
  }

  const CandidateSet<scalar_t, acc_t>& set_;
  Row<scalar_t, acc_t> row_;
  TiledVectors<acc_t> own_tiles_;
  std::vector<acc_t> user_;
  std::vector<acc_t> ahead_scores_;  // [rows, padded C]: the rows scored ahead (one row for per-row lists)
  int64_t ahead_begin_ = 0, ahead_end_ = 0;
  const acc_t* scores_ = nullptr;    // the loaded row's scores, in ahead_scores_
  std::vector<key_t> keys_;
  std::vector<int64_t> labeled_;
  std::vector<uint8_t> flags_;  // scratch of load() and members()
};

// Bottom-k selection of one row in one pass over its keys.  Members (keys != kExcludedKey) below
// the admission bound are appended to a buffer; a full buffer keeps its k lowest (key, j) pairs and
// lowers the bound to the k-th of them.  Candidates come in increasing j, so a later one whose key
// equals the bound ranks above all k kept pairs: "key below the bound" is the whole test, and a
// block of kBlock keys is tested at once, in one loop the compiler vectorises.  A long row's first
// bound comes from a sample of its keys, so that little more than k members are buffered (from no
// bound, a row of 2,048 was re-selected two or three times).  The CPU radix select this replaced
// made two or more passes over the row and merged four 256-bin histograms per digit: 38% of
// class_centroids' in-batch forward.  The CUDA kernel keeps its radix select: the same
// (threshold, cutoff), a different route.
template <typename acc_t>
class BottomK {
 public:
  using key_t = typename KeyOf<acc_t>::type;

  // The state (threshold, cutoff) of the k lowest (key, j) among keys[j] != kExcludedKey, j <
  // count; k is clamped to [0, |U_b|].
  void select(const key_t* keys, int64_t count, int64_t k, acc_t& threshold, int64_t& cutoff) {
    const int64_t want = std::max<int64_t>(k, 0);
    threshold = neg_infinity<acc_t>();
    cutoff = -1;
    if (want == 0) return;
    // Keys are compared shifted down by one: kExcludedKey (0) wraps to the largest key, which is
    // never below a bound, so exclusion costs nothing in the scan.
    const int64_t capacity = want + std::max<int64_t>(2 * want, 64);
    buffer_.resize(capacity + kBlock);  // a block's unconditional stores past a nearly full buffer
    // A long row starts from a bound taken from a sample of its keys, so that the scan buffers
    // little more than the k lowest and rarely re-selects.  Fewer than k members below it (a
    // sample that ran low) means the scan is redone from no bound (every member enters).
    key_t bound = count >= kSampledRow ? sampled_bound(keys, count, want) : ~key_t(0);
    int64_t size = scan(keys, count, want, capacity, bound);
    if (size < want && bound != ~key_t(0)) size = scan(keys, count, want, capacity, ~key_t(0));
    const int64_t rank = std::min(want, size);  // size < want: every member is in the buffer
    if (rank == 0) return;
    select_lowest(buffer_.data(), size, rank);
    threshold = key_to_score<acc_t>(shifted_of(buffer_[rank - 1]) + key_t(1));
    cutoff = j_of(buffer_[rank - 1]);
  }

 private:
  static constexpr int64_t kBlock = 16;
  // Rows from this long start from a sampled bound; every kSampleStride-th key is sampled.
  static constexpr int64_t kSampledRow = 256;
  static constexpr int64_t kSampleStride = 8;

  // Buffers the members (keys - 1, j) below `bound`, in increasing j; a full buffer keeps its
  // `want` lowest and lowers the bound to the want-th.  Returns the buffer's size.
  // On AVX-512 a full block of float keys is appended by compress stores, with no branch on the
  // block: at the in-batch shape about 4 blocks in 5 hold a member below the bound, so the block
  // test of the other path mostly mispredicts or walks.  Both paths append the same entries.
  int64_t scan(const key_t* keys, int64_t count, int64_t want, int64_t capacity, key_t bound) {
    int64_t size = 0;
#ifdef PNN_SIMD_AVX2_DISPATCH
    const bool compress = kPacked && simd_level() == kSimdAvx512;
#else
    constexpr bool compress = false;
#endif
    for (int64_t begin = 0; begin < count; begin += kBlock) {
      const int64_t n = std::min(kBlock, count - begin);
      if (compress && n == kBlock) {
#ifdef PNN_SIMD_AVX2_DISPATCH
        if constexpr (kPacked) size += append_below_avx512(keys + begin, begin, bound, buffer_.data() + size);
#endif
      } else if (n < kBlock || any_below(keys + begin, bound)) {
        for (int64_t j = begin; j < begin + n; ++j) {
          const key_t shifted = keys[j] - key_t(1);
          buffer_[size] = entry(shifted, j);
          size += shifted < bound;
        }
      }
      if (size >= capacity) {
        select_lowest(buffer_.data(), size, want);
        size = want;
        bound = shifted_of(buffer_[want - 1]);
      }
    }
    return size;
  }

  // A bound (on keys - 1) just above the sample's share of the `want` lowest members: the
  // sample's sampled_rank-th lowest.  No bound (the largest key) when the sample has too few
  // members.
  key_t sampled_bound(const key_t* keys, int64_t count, int64_t want) {
    sample_.clear();
    for (int64_t j = 0; j < count; j += kSampleStride) sample_.push_back(keys[j] - key_t(1));
    const int64_t rank = sampled_rank(want, kSampleStride);
    if (rank > static_cast<int64_t>(sample_.size())) return ~key_t(0);
    select_lowest(sample_.data(), static_cast<int64_t>(sample_.size()), rank);
    const key_t last = sample_[rank - 1];
    return last >= key_t(~key_t(0) - 1) ? ~key_t(0) : key_t(last + 1);  // admit the sample's rank-th
  }

  // A member's (key - 1, j), ordered lexicographically.  Float keys and j (< 2^31, see
  // prepare_row_inputs) pack into one 64-bit integer, so the selections compare plain integers;
  // double keys keep a pair.
  struct Pair {
    key_t shifted;
    int64_t j;
    bool operator<(const Pair& other) const {
      return shifted < other.shifted || (shifted == other.shifted && j < other.j);
    }
  };
  static constexpr bool kPacked = sizeof(key_t) == 4;
  using Entry = std::conditional_t<kPacked, uint64_t, Pair>;

  static Entry entry(key_t shifted, int64_t j) {
    if constexpr (kPacked) {
      return (uint64_t{shifted} << 32) | static_cast<uint32_t>(j);
    } else {
      return Pair{shifted, j};
    }
  }
  static key_t shifted_of(const Entry& e) {
    if constexpr (kPacked) {
      return static_cast<key_t>(e >> 32);
    } else {
      return e.shifted;
    }
  }
  static int64_t j_of(const Entry& e) {
    if constexpr (kPacked) {
      return static_cast<int64_t>(e & 0xFFFFFFFFu);
    } else {
      return e.j;
    }
  }

  // Appends entry(keys[i] - 1, begin + i) for the i < 16 whose keys[i] - 1 is below `bound`, in
  // increasing i, at `out`; returns how many.  Float keys only (packed entries).
#ifdef PNN_SIMD_AVX2_DISPATCH
  __attribute__((target("avx512f"))) static int64_t append_below_avx512(const uint32_t* keys, int64_t begin,
                                                                        uint32_t bound, uint64_t* out) {
    const __m512i shifted = _mm512_sub_epi32(_mm512_loadu_si512(keys), _mm512_set1_epi32(1));
    const __mmask16 below = _mm512_cmplt_epu32_mask(shifted, _mm512_set1_epi32(static_cast<int32_t>(bound)));
    const __m512i j = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int32_t>(begin)),
                                       _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
    // (shifted << 32) | j, eight lanes at a time
    const __m512i low = _mm512_or_si512(_mm512_slli_epi64(_mm512_cvtepu32_epi64(_mm512_castsi512_si256(shifted)), 32),
                                        _mm512_cvtepu32_epi64(_mm512_castsi512_si256(j)));
    const __m512i high = _mm512_or_si512(
        _mm512_slli_epi64(_mm512_cvtepu32_epi64(_mm512_extracti64x4_epi64(shifted, 1)), 32),
        _mm512_cvtepu32_epi64(_mm512_extracti64x4_epi64(j, 1)));
    const int64_t low_count = __builtin_popcount(below & 0xFFu);
    _mm512_mask_compressstoreu_epi64(out, static_cast<__mmask8>(below & 0xFFu), low);
    _mm512_mask_compressstoreu_epi64(out + low_count, static_cast<__mmask8>(below >> 8), high);
    return low_count + __builtin_popcount(below >> 8);
  }
#endif

  // Whether any of keys[0, kBlock) - 1 is below `bound`.
  static bool any_below(const key_t* keys, key_t bound) {
    bool any = false;
    for (int64_t i = 0; i < kBlock; ++i) any |= key_t(keys[i] - key_t(1)) < bound;
    return any;
  }

  std::vector<Entry> buffer_;
  std::vector<key_t> sample_;  // sampled_bound's keys - 1
};

}  // namespace pnn_fast
