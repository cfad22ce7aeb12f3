// CPU building blocks of the per-row kernels: task sizing, a row's scores and U_b flags, and
// the bottom-k selection.  The decisions themselves are the shared functions of pnn_rows.h.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include <ATen/Parallel.h>

#include "common/pnn_rows.h"
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

// a[k] converted to acc_t, into `out` (resized to d).
template <typename scalar_t, typename acc_t>
void to_acc(const scalar_t* a, int64_t d, std::vector<acc_t>& out) {
  out.resize(d);
  for (int64_t k = 0; k < d; ++k) out[k] = acc_t(a[k]);
}

// One call's candidates, prepared once and read by every task.  For a shared list: the
// embeddings tiled for SIMD scoring, the candidate indices sorted by item (so that a row finds
// its labeled candidates from its sorted known items, see for_each_labeled) and the sum of all
// candidate embeddings (the class sums subtract from it, see class_centroids_cpu.cpp).
template <typename scalar_t, typename acc_t>
struct CandidateSet {
  const RowBatch<scalar_t>& batch;
  bool shared;
  TiledVectors<acc_t> tiles;
  std::vector<int64_t> by_item;       // j sorted by (item, j)
  std::vector<int64_t> sorted_items;  // sorted_items[t] = c_{by_item[t]}: the items in that order
  std::vector<acc_t> total;           // sum_j item_table[c_j]

  explicit CandidateSet(const RowBatch<scalar_t>& b) : batch(b), shared(b.candidate_row_stride == 0) {
    if (!shared) return;
    const int64_t* items = batch.candidates;
    tiles.load(batch.item_table, items, batch.num_candidates, batch.dim);
    by_item.resize(batch.num_candidates);
    std::iota(by_item.begin(), by_item.end(), int64_t{0});
    std::stable_sort(by_item.begin(), by_item.end(), [&](int64_t a, int64_t b) { return items[a] < items[b]; });
    sorted_items.resize(batch.num_candidates);
    for (int64_t t = 0; t < batch.num_candidates; ++t) sorted_items[t] = items[by_item[t]];
    total.assign(batch.dim, acc_t(0));
    for (int64_t j = 0; j < batch.num_candidates; ++j) {
      const scalar_t* v = batch.item_table + items[j] * batch.dim;
      for (int64_t i = 0; i < batch.dim; ++i) total[i] += acc_t(v[i]);
    }
  }

  // Calls f(j) for every index j of the shared list whose item is `item`.
  template <typename F>
  void for_each_position(int64_t item, F f) const {
    auto t = std::lower_bound(sorted_items.begin(), sorted_items.end(), item);
    for (; t != sorted_items.end() && *t == item; ++t) f(by_item[t - sorted_items.begin()]);
  }

  // Calls f(j) once for every labeled candidate j of `row` (its item is the row's positive or a
  // known item) of a shared list.  A light user's labeled candidates are found by N_u + 1 binary
  // searches among the sorted candidates; a heavy user's (N_u log C > C + N_u) by one merge of
  // the sorted candidates with its sorted known items, linear in both.
  template <typename F>
  void for_each_labeled(const Row<scalar_t, acc_t>& row, F f) const {
    const int64_t count = batch.num_candidates, n = row.num_known;
    int64_t log_count = 1;
    while ((int64_t{1} << log_count) < count) ++log_count;
    if ((n + 1) * log_count < count + n) {
      for (int64_t i = 0; i < n; ++i) for_each_position(row.known[i], f);
      if (!sorted_contains(row.known, n, row.pos_item)) for_each_position(row.pos_item, f);
      return;
    }
    int64_t i = 0;
    for (int64_t t = 0; t < count; ++t) {
      const int64_t item = sorted_items[t];
      while (i < n && row.known[i] < item) ++i;
      if (item == row.pos_item || (i < n && row.known[i] == item)) f(by_item[t]);
    }
  }
};

// Per-task scratch: the scores s_j, the U_b flags and the keys of one row at a time.
template <typename scalar_t, typename acc_t>
class RowScan {
 public:
  using key_t = typename KeyOf<acc_t>::type;

  explicit RowScan(const CandidateSet<scalar_t, acc_t>& set) : set_(set) {}

  void load(const Row<scalar_t, acc_t>& row) {
    const int64_t count = set_.batch.num_candidates;
    const TiledVectors<acc_t>* tiles = &set_.tiles;
    if (!set_.shared) {
      own_tiles_.load(row.item_table, row.candidates, count, row.dim);
      tiles = &own_tiles_;
    }
    to_acc(row.user, row.dim, user_);
    scores_.resize(tiles->padded_count());
    tiles->lane_sums(user_.data(), DotTerm{}, scores_.data());
    unlabeled_.resize(count);
    if (set_.shared) {
      std::fill(unlabeled_.begin(), unlabeled_.end(), uint8_t{1});
      set_.for_each_labeled(row, [&](int64_t j) { unlabeled_[j] = 0; });
    } else {
      for (int64_t j = 0; j < count; ++j) unlabeled_[j] = row.unlabeled(j);
    }
    keys_.resize(count);
    for (int64_t j = 0; j < count; ++j) keys_[j] = unlabeled_[j] ? order_key(scores_[j]) : key_t(kExcludedKey);
  }

  int64_t count() const { return static_cast<int64_t>(keys_.size()); }
  const acc_t* scores() const { return scores_.data(); }
  // order_key of s_j for members of U_b, kExcludedKey for the others (as Row::key).
  const key_t* keys() const { return keys_.data(); }

  // (argmax_{j in U_b} s_j with the smallest j on ties or -1, |U_b|) of the loaded row: the
  // largest key, then its first position (hard_better's order, in two simple loops).
  std::pair<int64_t, int64_t> hard_negative() const {
    key_t best = 0;
    int64_t members = 0;
    for (const key_t key : keys_) {
      members += key != key_t(kExcludedKey);
      best = key > best ? key : best;
    }
    if (members == 0) return {-1, 0};
    return {std::find(keys_.begin(), keys_.end(), best) - keys_.begin(), members};
  }

 private:
  const CandidateSet<scalar_t, acc_t>& set_;
  TiledVectors<acc_t> own_tiles_;
  std::vector<acc_t> user_;
  std::vector<acc_t> scores_;
  std::vector<uint8_t> unlabeled_;
  std::vector<key_t> keys_;
};

// Bottom-k selection of one row: the radix select of the CUDA kernel (radix_digit, radix_pick),
// run serially, keeping after each pass only the keys in the chosen digit (stable, so the
// survivors stay in j order).
template <typename acc_t>
class BottomK {
 public:
  using key_t = typename KeyOf<acc_t>::type;

  // The state (threshold, cutoff) of the k lowest (key, j) among keys[j] != kExcludedKey, j <
  // count; k is clamped to [0, |U_b|].
  void select(const key_t* keys, int64_t count, int64_t k, acc_t& threshold, int64_t& cutoff) {
    keys_.clear();
    index_.clear();
    for (int64_t j = 0; j < count; ++j) {
      if (keys[j] == key_t(kExcludedKey)) continue;
      keys_.push_back(keys[j]);
      index_.push_back(j);
    }
    int64_t rank = std::min(std::max<int64_t>(k, 0), static_cast<int64_t>(keys_.size()));
    if (rank == 0) {
      threshold = neg_infinity<acc_t>();
      cutoff = -1;
      return;
    }
    key_t prefix = 0;
    for (int shift = KeyBits<key_t>::value - kRadixBits; shift >= 0; shift -= kRadixBits) {
      int64_t histogram[kRadixSize] = {};
      for (const key_t key : keys_) ++histogram[radix_digit(key, shift)];
      const int digit = radix_pick(histogram, rank);
      prefix |= static_cast<key_t>(digit) << shift;
      size_t kept = 0;
      for (size_t i = 0; i < keys_.size(); ++i) {
        if (radix_digit(keys_[i], shift) != digit) continue;
        keys_[kept] = keys_[i];
        index_[kept++] = index_[i];
      }
      keys_.resize(kept);
      index_.resize(kept);
    }
    // the survivors all equal the threshold key, in j order; `rank` counts among them
    threshold = key_to_score<acc_t>(prefix);
    cutoff = index_[rank - 1];
  }

 private:
  std::vector<key_t> keys_;     // candidates still matching the chosen digits
  std::vector<int64_t> index_;  // their j
};

}  // namespace pnn_fast
