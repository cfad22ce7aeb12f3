// pnn_fast::class_centroids_fwd / _bwd on CPU.
//
// Forward: per row, the scores and U_b flags (RowScan), the hard negative, the bottom-k
// selection (BottomK) and the class sums.  Nothing of size [B, C] is kept.
//
// The class sums follow pnn_rows.h's RowPlan: with a shared candidate list the larger class by
// difference.  The backward mirrors it: the larger class's gradient goes to every candidate
// through one column sum, and each row scatters to two short groups of candidates, the labeled
// ones and the smaller class (by difference) or the two classes.  The forward saves those groups
// for every row whose groups fit in `capacity` entries; the backward rescores only the other rows
// from the saved (threshold, cutoff).  Rescoring was most of the backward: the score product, the
// keys and the member pass cost about 8 of its 12 ms on ML-1M's in-batch step.
// Per-row lists are scattered back by tasks that each own a range of item ids (no atomics, an
// order independent of the thread count).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "common/checks.h"
#include "common/dispatch.h"
#include "cpu/cpu_rows.h"

namespace pnn_fast {
namespace {

constexpr const char* kFwd = "pnn_fast::class_centroids_fwd";
constexpr const char* kBwd = "pnn_fast::class_centroids_bwd";

template <typename scalar_t, typename acc_t>
inline __attribute__((always_inline)) void add_row(acc_t* dst, const scalar_t* v, int64_t d, acc_t sign) {
  for (int64_t i = 0; i < d; ++i) dst[i] += sign * acc_t(v[i]);
}

// add_row(dst, row.embedding(j), d, sign) for each j of `ids` in turn, with the running sum of each
// block of kSumColumns columns held in registers (GCC vectors, AVX-512 or AVX2 under run_widest).
// A sum kept in dst made each row's adds wait for the previous row's stores, a store-to-load chain
// per row, which was most of the class sums' time.  Every element is summed in the same order as
// by add_row: the same bits.
constexpr int64_t kSumColumns = 64;

template <typename scalar_t, typename acc_t>
inline __attribute__((always_inline)) void add_rows(acc_t* dst, const Row<scalar_t, acc_t>& row,
                                                    const std::vector<int64_t>& ids, int64_t d, acc_t sign) {
  int64_t c0 = 0;
#ifdef PNN_SIMD_VECTORS  // GCC and Clang vectors (simd.h); elsewhere every column takes add_row
  if constexpr (std::is_same_v<scalar_t, acc_t>) {  // no conversion: the rows load straight into vectors
    typedef acc_t vec __attribute__((vector_size(64)));
    constexpr int64_t kLanes = 64 / sizeof(acc_t), kVectors = kSumColumns / kLanes;
    for (; c0 + kSumColumns <= d; c0 += kSumColumns) {
      vec sum[kVectors];
      std::memcpy(sum, dst + c0, sizeof sum);
      for (const int64_t j : ids) {
        const acc_t* v = row.embedding(j) + c0;
        for (int64_t q = 0; q < kVectors; ++q) {
          vec x;
          std::memcpy(&x, v + q * kLanes, sizeof x);
          sum[q] += sign * x;
        }
      }
      std::memcpy(dst + c0, sum, sizeof sum);
    }
  }
#endif
  if (c0 == d) return;
  for (const int64_t j : ids) add_row(dst + c0, row.embedding(j) + c0, d - c0, sign);
}

// Writes one row's two scatter groups into its `capacity` entries of saved_members, and their ends
// into saved_ends ({-1, -1} when they do not fit or capacity is -1: the backward then rescores it).
class SavedRow {
 public:
  SavedRow(int32_t* entries, int64_t capacity, int32_t* ends)
      : entries_(entries), capacity_(capacity), ends_(ends), fits_(capacity >= 0) {}

  void add_group(const std::vector<int64_t>& group) {
    const int64_t size = static_cast<int64_t>(group.size());
    if (fits_ && used_ + size <= capacity_) {
      for (int64_t i = 0; i < size; ++i) entries_[used_ + i] = static_cast<int32_t>(group[i]);
    } else {
      fits_ = false;
    }
    used_ += size;
    ends_[groups_++] = fits_ ? static_cast<int32_t>(used_) : -1;
    if (!fits_) ends_[0] = -1;
  }

 private:
  int32_t* entries_;
  int64_t capacity_;
  int32_t* ends_;
  int64_t used_ = 0;
  int groups_ = 0;
  bool fits_;
};

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
class_centroids_fwd_cpu(const at::Tensor& user_emb, const at::Tensor& item_table, const at::Tensor& users,
                        const at::Tensor& pos_items, const at::Tensor& candidates, const at::Tensor& known_indptr,
                        const at::Tensor& known_indices, const at::Tensor& k, int64_t capacity) {
  RowInputs in =
      prepare_row_inputs(kFwd, user_emb, item_table, users, pos_items, candidates, known_indptr, known_indices);
  check_id_ranges(kFwd, in);
  const at::Tensor k_in = row_state(kFwd, in, k, "k", at::kLong);
  const at::TensorOptions long_options = users.options().dtype(at::kLong);
  at::Tensor neutral = at::empty({in.rows, in.dim}, user_emb.options());
  at::Tensor negative = at::empty({in.rows, in.dim}, user_emb.options());
  at::Tensor num_neutral = at::empty({in.rows}, long_options);
  at::Tensor num_negative = at::empty({in.rows}, long_options);
  at::Tensor threshold = at::empty({in.rows}, user_emb.options().dtype(opmath_dtype(user_emb.scalar_type())));
  at::Tensor cutoff = at::empty({in.rows}, long_options);
  at::Tensor hard = at::empty({in.rows}, long_options);
  at::Tensor saved_members = saved_members_output(kFwd, in, capacity);
  at::Tensor saved_ends = at::full({in.rows, 2}, -1, users.options().dtype(at::kInt));
  const int64_t d = in.dim, count = in.num_candidates;
  const int64_t* k_ptr = k_in.data_ptr<int64_t>();
  int32_t* saved_entries = saved_members.data_ptr<int32_t>();
  int32_t* saved_ends_out = saved_ends.data_ptr<int32_t>();
  int64_t* cutoff_out = cutoff.data_ptr<int64_t>();
  int64_t* hard_out = hard.data_ptr<int64_t>();
  int64_t* count_out[3] = {nullptr, num_neutral.data_ptr<int64_t>(), num_negative.data_ptr<int64_t>()};
  PNN_DISPATCH_FLOATING_TYPES(in.user_emb.scalar_type(), kFwd, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const RowBatch<scalar_t> batch = row_batch<scalar_t>(in);
    const CandidateSet<scalar_t, acc_t> set(batch);
    acc_t* threshold_out = threshold.data_ptr<acc_t>();
    scalar_t* mean_out[3] = {nullptr, neutral.data_ptr<scalar_t>(), negative.data_ptr<scalar_t>()};
    at::parallel_for(0, in.rows, row_grain(count, d), [&](int64_t begin, int64_t end) {
      RowScan<scalar_t, acc_t> scan(set);
      BottomK<acc_t> bottom;
      std::vector<acc_t> sums(3 * d);  // indexed by RowClass; slot kNotUnlabeled is unused
      std::vector<int64_t> members;
      for (int64_t b = begin; b < end; ++b) {
        const Row<scalar_t, acc_t>& row = scan.load(b, end);
        int64_t num_unlabeled = 0;
        std::tie(hard_out[b], num_unlabeled) = scan.hard_negative();
        bottom.select(scan.keys(), count, k_ptr[b], threshold_out[b], cutoff_out[b]);
        const int64_t negatives = std::min(std::max<int64_t>(k_ptr[b], 0), num_unlabeled);
        count_out[kNegative][b] = negatives;
        count_out[kNeutral][b] = num_unlabeled - negatives;

        const RowPlan plan = plan_row(in.shared, count, num_unlabeled - negatives, negatives);
        const auto threshold_key = order_key(threshold_out[b]);
        std::fill(sums.begin(), sums.end(), acc_t(0));
        // per-row lists are scattered by item ranges, never from saved groups
        SavedRow saved(saved_entries + b * capacity, in.shared ? capacity : -1, saved_ends_out + 2 * b);
        if (plan.by_difference) {
          acc_t* larger = sums.data() + plan.larger * d;
          acc_t* smaller = sums.data() + plan.smaller * d;
          std::copy(set.total.begin(), set.total.end(), larger);
          scan.members(plan.smaller, threshold_key, cutoff_out[b], members);
          run_widest([&]() PNN_INLINE_LAMBDA {  // element-wise adds in a fixed order: the same bits
            add_rows(larger, row, scan.labeled(), d, acc_t(-1));
            add_rows(smaller, row, members, d, acc_t(1));
            add_row(larger, smaller, d, acc_t(-1));
          });
          saved.add_group(scan.labeled());
          saved.add_group(members);
        } else {
          for (const RowClass cls : {kNeutral, kNegative}) {
            scan.members(cls, threshold_key, cutoff_out[b], members);
            acc_t* sum = sums.data() + cls * d;
            run_widest([&]() PNN_INLINE_LAMBDA {
              add_rows(sum, row, members, d, acc_t(1));
            });
            saved.add_group(members);
          }
        }
        for (const RowClass cls : {kNeutral, kNegative}) {
          const acc_t scale = acc_t(1) / acc_t(std::max<int64_t>(count_out[cls][b], 1));
          for (int64_t i = 0; i < d; ++i) mean_out[cls][b * d + i] = static_cast<scalar_t>(sums[cls * d + i] * scale);
        }
      }
    });
  });
  return {neutral, negative, num_neutral, num_negative, threshold, cutoff, hard, saved_members, saved_ends};
}

// Item-id bounds of `parts` ranges holding about equally many candidate occurrences (quantiles of
// a strided sample of the candidate ids): bounds[p] <= items of part p < bounds[p + 1].
std::vector<int64_t> balanced_item_bounds(const RowInputs& in, int64_t parts) {
  if (parts == 1) return {0, in.item_table.size(0)};  // one thread: no quantiles to sort for
  const int64_t total = in.candidates.numel();
  const int64_t stride = std::max<int64_t>(1, total / (int64_t{1} << 16));
  const int64_t* ids = in.candidates.data_ptr<int64_t>();
  std::vector<int64_t> sample;
  for (int64_t i = 0; i < total; i += stride) sample.push_back(ids[i]);
  std::sort(sample.begin(), sample.end());
  std::vector<int64_t> bounds(parts + 1, 0);
  for (int64_t p = 1; p < parts; ++p) bounds[p] = sample.empty() ? 0 : sample[p * sample.size() / parts];
  bounds[parts] = in.item_table.size(0);
  return bounds;
}

// The saved groups of the rows that have them, checked: ends {-1, -1} or 0 <= e0 <= e1 <= capacity,
// and every entry of a group a candidate index.
void check_saved_values(const RowInputs& in, const at::Tensor& saved_members, const at::Tensor& saved_ends) {
  const int64_t capacity = saved_members.size(1);
  const int32_t* entries = saved_members.data_ptr<int32_t>();
  const int32_t* ends = saved_ends.data_ptr<int32_t>();
  for (int64_t b = 0; b < in.rows; ++b) {
    const int32_t first = ends[2 * b], last = ends[2 * b + 1];
    if (first == -1 && last == -1) continue;
    TORCH_CHECK(0 <= first && first <= last && last <= capacity, kBwd, ": saved_ends[", b, "] = (", first, ", ",
                last, ") is neither (-1, -1) nor within [0, ", capacity, "]");
    for (int64_t i = 0; i < last; ++i) {
      const int32_t j = entries[b * capacity + i];
      TORCH_CHECK(0 <= j && j < in.num_candidates, kBwd, ": saved_members[", b, ", ", i, "] = ", j,
                  " is not a candidate index in [0, ", in.num_candidates, ")");
    }
  }
}

at::Tensor class_centroids_bwd_cpu(const at::Tensor& grad_neutral, const at::Tensor& grad_negative,
                                   const at::Tensor& user_emb, const at::Tensor& item_table, const at::Tensor& users,
                                   const at::Tensor& pos_items, const at::Tensor& candidates,
                                   const at::Tensor& known_indptr, const at::Tensor& known_indices,
                                   const at::Tensor& threshold, const at::Tensor& cutoff,
                                   const at::Tensor& num_neutral, const at::Tensor& num_negative,
                                   const at::Tensor& saved_members, const at::Tensor& saved_ends) {
  RowInputs in =
      prepare_row_inputs(kBwd, user_emb, item_table, users, pos_items, candidates, known_indptr, known_indices);
  check_id_ranges(kBwd, in);
  check_saved_members(kBwd, in, saved_members, saved_ends);
  const at::Tensor saved_in = saved_members.contiguous(), saved_ends_in = saved_ends.contiguous();
  if (in.shared) check_saved_values(in, saved_in, saved_ends_in);
  const at::ScalarType acc_dtype = opmath_dtype(user_emb.scalar_type());
  const at::TensorOptions acc_options = user_emb.options().dtype(acc_dtype);
  const at::Tensor threshold_in = row_state(kBwd, in, threshold, "threshold", acc_dtype);
  const at::Tensor cutoff_in = row_state(kBwd, in, cutoff, "cutoff", at::kLong);
  const at::Tensor counts[3] = {at::Tensor(), row_state(kBwd, in, num_neutral, "num_neutral", at::kLong),
                                row_state(kBwd, in, num_negative, "num_negative", at::kLong)};
  const at::Tensor member_grad[3] = {
      at::Tensor(), per_member_grad(kBwd, in, grad_neutral, "grad_neutral", num_neutral, "num_neutral"),
      per_member_grad(kBwd, in, grad_negative, "grad_negative", num_negative, "num_negative")};
  at::Tensor grad_table = at::zeros(in.item_table.sizes(), acc_options);
  const int64_t d = in.dim, count = in.num_candidates;
  const int64_t threads = at::get_num_threads();
  // shared list: per thread, the gradient of each candidate slot [C, d] and the column sum [d]
  // every slot receives; per-row lists: each task owns a range of item ids
  at::Tensor slot_grads = in.shared ? at::zeros({threads, count + 1, d}, acc_options) : at::Tensor();
  const std::vector<int64_t> bounds = in.shared ? std::vector<int64_t>() : balanced_item_bounds(in, threads);
  PNN_DISPATCH_FLOATING_TYPES(in.user_emb.scalar_type(), kBwd, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const RowBatch<scalar_t> batch = row_batch<scalar_t>(in);
    const acc_t* threshold_ptr = threshold_in.data_ptr<acc_t>();
    const int64_t* cutoff_ptr = cutoff_in.data_ptr<int64_t>();
    const int64_t* count_ptr[3] = {nullptr, counts[kNeutral].data_ptr<int64_t>(),
                                   counts[kNegative].data_ptr<int64_t>()};
    const acc_t* grad_ptr[3] = {nullptr, member_grad[kNeutral].data_ptr<acc_t>(),
                                member_grad[kNegative].data_ptr<acc_t>()};
    if (in.shared) {
      const CandidateSet<scalar_t, acc_t> set(batch);
      const int64_t capacity = saved_in.size(1);
      const int32_t* saved_entries = saved_in.data_ptr<int32_t>();
      const int32_t* saved_end = saved_ends_in.data_ptr<int32_t>();
      const auto is_saved = [&](int64_t b) { return saved_end[2 * b + 1] >= 0; };
      at::parallel_for(0, in.rows, row_grain(count, d), [&](int64_t begin, int64_t end) {
        RowScan<scalar_t, acc_t> scan(set);
        acc_t* slots = slot_grads[at::get_thread_num()].data_ptr<acc_t>();
        acc_t* column = slots + count * d;
        std::vector<acc_t> delta(d);
        std::vector<int64_t> groups[2];
        int64_t rescored_end = begin;  // the end of the current run of rows without saved groups
        for (int64_t b = begin; b < end; ++b) {
          const RowPlan plan = plan_row(true, count, count_ptr[kNeutral][b], count_ptr[kNegative][b]);
          if (is_saved(b)) {
            const int32_t* entries = saved_entries + b * capacity;
            for (int g = 0; g < 2; ++g) {
              const int32_t first = g == 0 ? 0 : saved_end[2 * b];
              groups[g].assign(entries + first, entries + saved_end[2 * b + g]);
            }
          } else {
            // rows without saved groups are rescored, several at a time when they are adjacent
            if (rescored_end <= b) {
              rescored_end = b + 1;
              while (rescored_end < end && !is_saved(rescored_end)) ++rescored_end;
            }
            scan.load(b, rescored_end);
            const auto threshold_key = order_key(threshold_ptr[b]);
            if (plan.by_difference) {
              groups[0] = scan.labeled();
              scan.members(plan.smaller, threshold_key, cutoff_ptr[b], groups[1]);
            } else {
              scan.members(kNeutral, threshold_key, cutoff_ptr[b], groups[0]);
              scan.members(kNegative, threshold_key, cutoff_ptr[b], groups[1]);
            }
          }
          // the first group's rows get `first`, the second's `second` (sign times a [d] gradient)
          const acc_t *first, *second;
          acc_t first_sign;
          if (plan.by_difference) {
            // groups: the labeled candidates, then the smaller class
            const acc_t* larger = grad_ptr[plan.larger] + b * d;
            const acc_t* smaller = grad_ptr[plan.smaller] + b * d;
            for (int64_t i = 0; i < d; ++i) {
              column[i] += larger[i];
              delta[i] = smaller[i] - larger[i];
            }
            first = larger, first_sign = acc_t(-1), second = delta.data();
          } else {
            // groups: the neutral class, then the negative class
            first = grad_ptr[kNeutral] + b * d, first_sign = acc_t(1), second = grad_ptr[kNegative] + b * d;
          }
          run_widest([&]() PNN_INLINE_LAMBDA {  // element-wise adds in a fixed order: the same bits
            for (const int64_t j : groups[0]) add_row(slots + j * d, first, d, first_sign);
            for (const int64_t j : groups[1]) add_row(slots + j * d, second, d, acc_t(1));
          });
        }
      });
      return;
    }
    acc_t* grad_out = grad_table.data_ptr<acc_t>();
    at::parallel_for(0, threads, 1, [&](int64_t part_begin, int64_t part_end) {
      std::vector<int64_t> owned;  // the candidates j of a row that this task owns, and their items
      std::vector<int64_t> owned_items;
      std::vector<uint8_t> unlabeled;
      TiledVectors<acc_t> tiles;
      std::vector<acc_t> user, scores;
      for (int64_t part = part_begin; part < part_end; ++part) {
        for (int64_t b = 0; b < in.rows; ++b) {
          const Row<scalar_t, acc_t> row(batch, b);
          owned.clear();
          owned_items.clear();
          for (int64_t j = 0; j < count; ++j) {
            if (bounds[part] <= row.item(j) && row.item(j) < bounds[part + 1]) {
              owned.push_back(j);
              owned_items.push_back(row.item(j));
            }
          }
          if (owned.empty()) continue;
          tiles.load(batch.item_table, owned_items.data(), static_cast<int64_t>(owned.size()), d);
          to_acc(row.user, d, user);
          scores.resize(tiles.padded_count());
          tiles.lane_sums(user.data(), DotTerm{}, scores.data());
          unlabeled.resize(owned.size());
          unlabeled_flags(row, owned_items.data(), static_cast<int64_t>(owned.size()), unlabeled.data());
          const auto threshold_key = order_key(threshold_ptr[b]);
          for (size_t i = 0; i < owned.size(); ++i) {
            const auto key = unlabeled[i] ? order_key(scores[i]) : decltype(threshold_key)(kExcludedKey);
            const RowClass cls = classify_key(key, owned[i], threshold_key, cutoff_ptr[b]);
            if (cls == kNotUnlabeled) continue;
            const acc_t* g = grad_ptr[cls] + b * d;
            acc_t* dst = grad_out + owned_items[i] * d;
            for (int64_t k = 0; k < d; ++k) dst[k] += g[k];
          }
        }
      }
    });
  });
  if (in.shared) {
    const at::Tensor summed = slot_grads.sum(0);  // [C + 1, d]: the slots, then the column sum
    grad_table.index_add_(0, in.candidates, summed.narrow(0, 0, count) + summed.narrow(0, count, 1));
  }
  return grad_table.to(item_table.scalar_type());
}

}  // namespace
}  // namespace pnn_fast

TORCH_LIBRARY_IMPL(pnn_fast, CPU, m) {
  m.impl("class_centroids_fwd", &pnn_fast::class_centroids_fwd_cpu);
  m.impl("class_centroids_bwd", &pnn_fast::class_centroids_bwd_cpu);
}
