// Per-row math of pnn_fast::masked_topk, shared by the CPU (.cpp) and CUDA (.cu) kernels.
//
// A "lane" scans some columns of one score row in ascending column order (the CPU: every column;
// a CUDA warp lane: every 32nd) and keeps the k best.  Ranking: higher score first, equal scores
// by ascending column; a column of an exclusion set counts as -inf.  Every (score, column) key is
// distinct, so "the k best" is one well-defined set on every backend.
//
// The lane appends each column that could enter to a buffer and, when the buffer fills, keeps
// its k best (a quickselect) and raises the admission threshold to the k-th best score.  Because
// a lane's columns ascend, a later column never wins a tie, so "score > threshold" is the whole
// admission test: the hot loop of both kernels is that one comparison.  Exclusions are looked up
// (a CUDA lane with cursors that only move forward, the CPU in a bit set of the row's exclusions)
// and NaN detected only for the buffered columns.
#pragma once

#include <cstdint>

#include "common/pnn_rows.h"
#include "common/quickselect.h"

namespace pnn_fast {

// Exclusion sets per call: a fixed bound keeps a lane's cursors in registers on the GPU.
constexpr int kMaxExcludeSets = 8;

template <typename acc_t>
struct RankedColumn {
  acc_t value;
  int64_t column;
};

// a ranks strictly below b: a lower score, or the same score at a higher column.  Bitwise, not
// short-circuit, operators: the selections below call it in loops that must not branch on it.
template <typename acc_t>
PNN_HD inline bool ranks_below(const RankedColumn<acc_t>& a, const RankedColumn<acc_t>& b) {
  return (a.value < b.value) | ((a.value == b.value) & (a.column > b.column));
}

// a is better than b (the order of the result).
template <typename acc_t>
PNN_HD inline bool ranks_above(const RankedColumn<acc_t>& a, const RankedColumn<acc_t>& b) {
  return ranks_below(b, a);
}

// ranks_above as a function object, the order of select_first.
struct RanksAbove {
  template <typename acc_t>
  PNN_HD bool operator()(const RankedColumn<acc_t>& a, const RankedColumn<acc_t>& b) const {
    return ranks_above(a, b);
  }
};

// Rearrange entries[0, n) (distinct keys, no NaN) so that entries[0, k) are the k best and
// entries[k - 1] is the k-th best.
template <typename acc_t>
PNN_HD inline void select_best(RankedColumn<acc_t>* entries, int64_t n, int64_t k) {
  select_first(entries, n, k, RanksAbove{});
}

// Restore the min-heap property (root = lowest rank) below `at` in heap[0, size).
template <typename acc_t>
PNN_HD inline void sift_down(RankedColumn<acc_t>* heap, int64_t size, int64_t at) {
  const RankedColumn<acc_t> moving = heap[at];
  while (true) {
    int64_t child = 2 * at + 1;
    if (child >= size) break;
    if (child + 1 < size && ranks_below(heap[child + 1], heap[child])) ++child;
    if (!ranks_below(heap[child], moving)) break;
    heap[at] = heap[child];
    at = child;
  }
  heap[at] = moving;
}

// Best-first order: an insertion sort for the few entries of a top-k list (fewer mispredicted
// branches than a heap's sift-downs at k = 20), a heapsort (O(n log n), in place, no recursion)
// beyond.
template <typename acc_t>
PNN_HD inline void sort_best_first(RankedColumn<acc_t>* entries, int64_t n) {
  if (n <= 32) {
    for (int64_t i = 1; i < n; ++i) {
      const RankedColumn<acc_t> moving = entries[i];
      int64_t at = i;
      for (; at > 0 && ranks_above(moving, entries[at - 1]); --at) entries[at] = entries[at - 1];
      entries[at] = moving;
    }
    return;
  }
  for (int64_t at = n / 2 - 1; at >= 0; --at) sift_down(entries, n, at);
  for (int64_t end = n - 1; end > 0; --end) {  // the lowest-ranked goes to the back
    swap_values(entries[0], entries[end]);
    sift_down(entries, end, int64_t{0});
  }
}

// The sorted exclusion rows of one user, with a cursor per set that only moves forward (the
// lane's columns ascend, so the lookups of a row cost the rows' lengths in all): the CUDA lanes'
// exclusion lookup.  The CPU looks columns up in a bit set instead (masked_topk_cpu.cpp); LaneTopK
// takes either, as anything with `bool excludes(int64_t column)`.
struct ExclusionCursors {
  const int64_t* indices[kMaxExcludeSets];
  int64_t next[kMaxExcludeSets];
  int64_t end[kMaxExcludeSets];
  int sets = 0;

  PNN_HD bool excludes(int64_t column) {
    for (int s = 0; s < sets; ++s) {
      while (next[s] < end[s] && indices[s][next[s]] < column) ++next[s];
      if (next[s] < end[s] && indices[s][next[s]] == column) return true;
    }
    return false;
  }
};

// The exclusion sets of a call: CSR rows over users, each row sorted ascending.
struct ExclusionSets {
  const int64_t* indptr[kMaxExcludeSets] = {};
  const int64_t* indices[kMaxExcludeSets] = {};
  int sets = 0;

  PNN_HD ExclusionCursors of_user(int64_t user) const {
    ExclusionCursors cursors;
    cursors.sets = sets;
    for (int s = 0; s < sets; ++s) {
      cursors.indices[s] = indices[s];
      cursors.next[s] = indptr[s][user];
      cursors.end[s] = indptr[s][user + 1];
    }
    return cursors;
  }
};

// One lane's buffer: entries[0, size), of which the first `kept` were selected before (their
// exclusions resolved).  Storage (the kernel's: CPU per task, CUDA in shared memory) holds
// capacity + 1 entries, capacity > k: slot `size` is always free for the next column.
template <typename acc_t>
struct LaneTopK {
  RankedColumn<acc_t>* entries;
  int64_t k;
  int64_t capacity;
  int64_t size = 0;
  int64_t kept = 0;
  bool selected = false;  // a threshold exists once k entries were kept
  acc_t threshold = 0;
  bool saw_nan = false;

  // Whether a column with this score may be among the k best (true for NaN, so that it is seen).
  PNN_HD bool may_enter(acc_t score) const { return !selected || !(score <= threshold); }

  // Admit only scores above `bound` from the first column on: a bound that the caller expects at
  // least k columns to score above.  The result holds when finish() keeps k entries that all score
  // above it; otherwise columns the bound turned away may belong to the k best, and the caller
  // scans again without one.
  PNN_HD void start_above(acc_t bound) {
    selected = true;
    threshold = bound;
  }

  // The next column of the lane (ascending): buffered when it may enter, without a branch on
  // that (it is written to the free slot either way); a full buffer is selected.
  template <typename Exclusions>
  PNN_HD void consider(acc_t score, int64_t column, Exclusions& exclusions) {
    entries[size] = RankedColumn<acc_t>{score, column};
    size += may_enter(score) ? 1 : 0;
    if (size == capacity) select(exclusions);
  }

  // Resolve the new entries' exclusions and NaNs, then keep the k best and raise the threshold.
  template <typename Exclusions>
  PNN_HD void select(Exclusions& exclusions) {
    for (int64_t at = kept; at < size; ++at) {
      RankedColumn<acc_t>& entry = entries[at];
      if (exclusions.excludes(entry.column)) {
        entry.value = neg_infinity<acc_t>();  // excluded: ranked last, and its NaN does not matter
      } else if (entry.value != entry.value) {
        saw_nan = true;
        entry.value = neg_infinity<acc_t>();  // keeps the keys ordered; the caller reports the NaN
      }
    }
    if (size >= k) {
      select_best(entries, size, k);
      size = k;
      // the k-th best, never below a starting bound (kept excluded entries score -inf)
      const acc_t kth = entries[k - 1].value;
      threshold = selected && threshold > kth ? threshold : kth;
      selected = true;
    }
    kept = size;
  }

  // After the scan: the min(size, k) best, best first.
  template <typename Exclusions>
  PNN_HD int64_t finish(Exclusions& exclusions) {
    select(exclusions);
    sort_best_first(entries, size);
    return size;
  }
};

}  // namespace pnn_fast
