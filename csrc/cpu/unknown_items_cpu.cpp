// pnn_fast::unknown_items on CPU: the sampler's map from a uniform draw to the r-th item a user has
// not interacted with (unknown_by_rank, pnn_rows.h), two ways to the same item:
//  - few draws per row (DNS's 8): branch-free binary searches in the users' CSR rows, groups of draws
//    in lockstep so that the core overlaps their loads (a row is rarely in cache);
//  - many draws per row (SL's 800, 64 candidates): a rank index of the user's row, built once, then
//    about one load and one compare per draw.  Profiled at SL's sizes (ML-1M, 2048 x 800 draws), the
//    searches cost some 60 ns a draw from L1, a chain of dependent loads and compares.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <atomic>
#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "common/checks.h"
#include "common/dispatch.h"
#include "cpu/cpu_rows.h"

namespace pnn_fast {
namespace {

// What a draw with no known item (or a bad one) searches: one entry above every rank, so m = 0.
constexpr int64_t kAboveEveryRank[1] = {std::numeric_limits<int64_t>::max()};

// The bits a non-negative n needs (0 for 0): std::bit_width, which is C++20, and torch builds
// extensions as C++17 before 2.13.
inline int64_t bit_width(int64_t n) { return n == 0 ? 0 : 64 - __builtin_clzll(static_cast<uint64_t>(n)); }

// Rows with at least this many draws are indexed, when their known lists are short enough to pay back.
constexpr int64_t kIndexMinDraws = 32;

// m = #{i : sorted[i] - i <= rank} for many ranks of one user's row sorted[0:n] among free unknown
// items: first[j] = #{i : sorted[i] - i < j << shift}, with buckets of 2^shift ranks sized to hold
// about one known item each, so m is first[rank >> shift] plus a short scan.
class RankIndex {
 public:
  void build(const int64_t* sorted, int64_t n, int64_t free) {
    sorted_ = sorted;
    n_ = n;
    shift_ = 0;
    while ((free >> (shift_ + 1)) >= std::max<int64_t>(n, 1)) ++shift_;
    const int64_t buckets = ((free - 1) >> shift_) + 1;
    first_.resize(buckets);
    int64_t i = 0;
    for (int64_t j = 0; j < buckets; ++j) {
      while (i < n && sorted[i] - i < (j << shift_)) ++i;
      first_[j] = i;
    }
  }
  int64_t unknown(int64_t rank) const {
    int64_t m = first_[rank >> shift_];
    while (m < n_ && sorted_[m] - m <= rank) ++m;
    return rank + m;
  }

 private:
  const int64_t* sorted_ = nullptr;
  int64_t n_ = 0, shift_ = 0;
  std::vector<int64_t> first_;
};

at::Tensor unknown_items_cpu(const at::Tensor& known_indptr, const at::Tensor& known_indices, const at::Tensor& users,
                             const at::Tensor& uniform, int64_t num_items) {
  constexpr const char* op = "pnn_fast::unknown_items";
  KnownDraws in = prepare_known_draws(op, known_indptr, known_indices, users, uniform);
  in.users = ids_in_range(op, in.users, in.num_users, "users");
  at::Tensor items = at::empty(in.uniform.sizes(), users.options());
  const int64_t rows = in.rows, per_row = in.per_row;
  const int64_t* ptr = in.indptr.data_ptr<int64_t>();
  const int64_t* known = in.indices.data_ptr<int64_t>();
  const int64_t* user = in.users.data_ptr<int64_t>();
  const float* u = in.uniform.data_ptr<float>();
  int64_t* out = items.data_ptr<int64_t>();
  std::atomic<bool> bad{false};
  const auto valid = [&](int64_t free, float draw) {
    if (free > 0 && draw >= 0.0f && draw < 1.0f) return true;
    bad = true;
    return false;
  };
  if (per_row >= kIndexMinDraws) {
    at::parallel_for(0, rows, std::max<int64_t>(1, 4096 / per_row), [&](int64_t begin, int64_t end) {
      RankIndex index;
      for (int64_t b = begin; b < end; ++b) {
        const int64_t first = ptr[user[b]], count = ptr[user[b] + 1] - first, free = num_items - count;
        const float* draws = u + b * per_row;
        int64_t* row_out = out + b * per_row;
        // the index costs about count + free / 2^shift (about 2 count) steps, the searches
        // per_row * log2(count) dependent ones
        const bool indexed = per_row * (bit_width(count) + 1) > 2 * count;
        if (indexed && free > 0) index.build(known + first, count, free);
        for (int64_t k = 0; k < per_row; ++k) {
          if (!valid(free, draws[k])) {
            row_out[k] = -1;
            continue;
          }
          const int64_t rank = rank_of_uniform(draws[k], free);
          row_out[k] = indexed ? index.unknown(rank) : unknown_by_rank(known + first, count, rank);
        }
      }
    });
  } else {
    constexpr int64_t kLockstep = 32;
    at::parallel_for(0, rows * per_row, kLockstep * 64, [&](int64_t begin, int64_t end) {
      const int64_t* sorted[kLockstep];
      int64_t at[kLockstep], length[kLockstep], rank[kLockstep];
      // the row b and column k of draw t = b * per_row + k, advanced without a division per draw
      int64_t b = begin / per_row, k = begin % per_row;
      for (int64_t group = begin; group < end; group += kLockstep) {
        const int64_t size = std::min(kLockstep, end - group);
        int64_t longest = 1;
        for (int64_t g = 0; g < size; ++g) {
          const int64_t first = ptr[user[b]], count = ptr[user[b] + 1] - first, free = num_items - count;
          at[g] = 0;
          length[g] = 1;
          sorted[g] = kAboveEveryRank;
          rank[g] = -1;
          const float draw = u[group + g];
          if (valid(free, draw)) {
            rank[g] = rank_of_uniform(draw, free);
            if (count > 0) {
              sorted[g] = known + first;
              length[g] = count;
              longest = std::max(longest, count);
              prefetch(sorted[g] + count / 2);
            }
          }
          if (++k == per_row) {
            k = 0;
            ++b;
          }
        }
        // a span of length n takes ceil(log2 n) steps; a draw whose span is already 1 steps with
        // half = 0, a no-op, so every draw of the group runs the longest one's steps without a branch
        for (int64_t span = longest; span > 1; span -= span >> 1) {
          for (int64_t g = 0; g < size; ++g) {
            const int64_t half = length[g] >> 1;
            at[g] = unknown_step(sorted[g], at[g], half, rank[g]);
            length[g] -= half;
          }
        }
        for (int64_t g = 0; g < size; ++g) out[group + g] = unknown_from_last(sorted[g], at[g], rank[g]);
      }
    });
  }
  record_input_error(op, "uniform must lie in [0, 1) and every user must have an unknown item",
                     at::scalar_tensor(bad.load(), at::kBool));
  return items;
}

}  // namespace
}  // namespace pnn_fast

TORCH_LIBRARY_IMPL(pnn_fast, CPU, m) {
  m.impl("unknown_items", &pnn_fast::unknown_items_cpu);
}
