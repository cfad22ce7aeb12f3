// pnn_fast::class_centroids_fwd / _bwd on CUDA, one block per row.
//
// Scores: a shared list's by for_each_score_tile (cuda_rows.cuh), a tile of rows at a time; per-row
// lists' by each row's threads.
// U_b: a shared list's as a bitmap in shared memory (mark_labeled: each known item looked up in the
// list sorted once a call); otherwise each candidate searched in the user's known list.
// Forward: the row's keys (kept in shared memory when C keys fit, else recomputed on every pass, U_b
// still read off the bitmap when the bitmap alone fits), the hard negative and the radix select of
// cuda_rows.cuh, then the class sums of pnn_rows.h's RowPlan:
// with a shared candidate list the larger class by difference from the sum of all candidates, so
// a row reads only its labeled candidates and its smaller class.  In chunks of kThreads candidates
// each thread classifies one candidate, the block gathers those the sums take (DirectMembers), and
// each thread adds them along its own dims.
// Backward: the same classification recomputed from (threshold, cutoff); the gradient of the larger
// class reaches every shared candidate through one column sum (a [B, d] buffer summed over rows),
// and only the gathered members are scattered with atomics: onto candidate slots [C, d] for a shared
// list (index_add_ takes them to the items), onto the items' rows for per-row lists.
#include <ATen/Context.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <tuple>

#include "common/checks.h"
#include "common/dispatch.h"
#include "cuda/cuda_rows.cuh"

namespace pnn_fast {
namespace {

constexpr const char* kFwd = "pnn_fast::class_centroids_fwd";
constexpr const char* kBwd = "pnn_fast::class_centroids_bwd";

// The sum a candidate of class `cls` adds to under `plan`: its class; kNotUnlabeled for a labeled
// candidate, which the by-difference sum subtracts; -1 when the row's sums skip it (the larger
// class, or a labeled candidate of a row summed directly).
__device__ __forceinline__ int direct_slot(const RowPlan& plan, RowClass cls) {
  if (plan.by_difference) {
    if (cls == kNotUnlabeled) return kNotUnlabeled;
    return cls == plan.smaller ? cls : -1;
  }
  return cls == kNotUnlabeled ? -1 : cls;
}

// One chunk's candidates that a row's sums take, in candidate order: a row of the item table (or
// of the slot buffer) and the slot it adds to.
struct DirectMembers {
  int64_t rows[kThreads];
  int8_t slots[kThreads];
  int counts[kWarps];
};

// Gathers this thread's candidate into `list` when slot >= 0; returns the chunk's count (every
// thread gets it).  block_exclusive_count's first barrier keeps the previous chunk's readers safe.
__device__ int gather_direct(int slot, int64_t table_row, DirectMembers& list) {
  int total = 0;
  const int before = block_exclusive_count(slot >= 0, list.counts, total);
  if (slot >= 0) {
    list.rows[before] = table_row;
    list.slots[before] = static_cast<int8_t>(slot);
  }
  __syncthreads();
  return total;
}

// A shared list sorted by item, for mark_labeled (cuda_rows.cuh); empty for per-row lists and when
// `use` is false.  view() points into it.
struct SortedCandidates {
  at::Tensor items, positions;
  SortedCandidates(const RowInputs& in, bool use) {
    if (use && in.shared && in.num_candidates > 0) std::tie(items, positions) = in.candidates.sort();
  }
  SortedList view() const {
    return items.defined() ? SortedList{items.data_ptr<int64_t>(), positions.data_ptr<int64_t>()}
                           : SortedList{nullptr, nullptr};
  }
};

template <typename scalar_t, typename acc_t, bool kCached>
__global__ void class_centroids_fwd_kernel(RowBatch<scalar_t> batch, int64_t row0, const acc_t* scores,
                                           SortedList sorted, const int64_t* sizes, const acc_t* total,
                                           acc_t* sums, scalar_t* neutral, scalar_t* negative, int64_t* num_neutral,
                                           int64_t* num_negative, acc_t* threshold, int64_t* cutoff, int64_t* hard) {
  using key_t = typename KeyOf<acc_t>::type;
  extern __shared__ unsigned char dynamic_shared[];
  __shared__ SelectShared<key_t> sh;
  __shared__ HardShared<key_t> hard_sh;
  __shared__ DirectMembers list;
  const int64_t b = row0 + blockIdx.x, d = batch.dim, count = batch.num_candidates, rows = batch.num_rows;
  const Row<scalar_t, acc_t> row(batch, b);
  const acc_t* row_scores = scores == nullptr ? nullptr : scores + static_cast<int64_t>(blockIdx.x) * count;
  // with a sorted shared list, U_b as a bitmap after the cached keys (count keys keep it 4-aligned),
  // or alone when the keys do not fit: each pass then rescores but looks up no known lists
  unsigned* labeled = nullptr;
  if (sorted.sorted_items != nullptr) {
    labeled = reinterpret_cast<unsigned*>(dynamic_shared + (kCached ? count * static_cast<int64_t>(sizeof(key_t)) : 0));
    mark_labeled(row, sorted, count, labeled);
  }
  const RowKeys<scalar_t, acc_t, kCached> keys{row, reinterpret_cast<key_t*>(dynamic_shared), count, row_scores,
                                               labeled};
  keys.prepare();
  int64_t row_hard, num_unlabeled;
  block_hard_negative(keys, count, hard_sh, row_hard, num_unlabeled);
  key_t threshold_key;
  int64_t row_cutoff;
  block_bottom_k(keys, count, sizes[b], sh, threshold_key, row_cutoff);
  const int64_t k = sizes[b];
  const int64_t negatives = row_cutoff < 0 ? 0 : (k > num_unlabeled ? num_unlabeled : k);
  const RowPlan plan = plan_row(batch.candidate_row_stride == 0, count, num_unlabeled - negatives, negatives);

  // zeroed [3, B, d] workspace indexed by slot (kNotUnlabeled: the labeled candidates); each
  // thread owns its dims
  acc_t* slot_sum[3] = {sums + b * d, sums + (rows + b) * d, sums + (2 * rows + b) * d};
  for (int64_t j0 = 0; j0 < count; j0 += kThreads) {
    const int64_t j = j0 + threadIdx.x;
    const int slot = j < count ? direct_slot(plan, classify_key(keys(j), j, threshold_key, row_cutoff)) : -1;
    const int members = gather_direct(slot, j < count ? row.item(j) : 0, list);
    for (int64_t dim = threadIdx.x; dim < d; dim += blockDim.x) {
      acc_t add[3] = {0, 0, 0};
      for (int t = 0; t < members; ++t) {
        const acc_t v = static_cast<acc_t>(batch.item_table[list.rows[t] * d + dim]);
        const int s = list.slots[t];
        add[0] += s == 0 ? v : acc_t(0);
        add[1] += s == 1 ? v : acc_t(0);
        add[2] += s == 2 ? v : acc_t(0);
      }
      for (int s = 0; s < 3; ++s) slot_sum[s][dim] += add[s];
    }
  }
  const int64_t class_size[3] = {0, num_unlabeled - negatives, negatives};
  scalar_t* mean_out[3] = {nullptr, neutral + b * d, negative + b * d};
  for (int64_t dim = threadIdx.x; dim < d; dim += blockDim.x) {
    if (plan.by_difference) {
      slot_sum[plan.larger][dim] = total[dim] - slot_sum[kNotUnlabeled][dim] - slot_sum[plan.smaller][dim];
    }
    for (int cls = kNeutral; cls <= kNegative; ++cls) {
      const acc_t scale = acc_t(1) / acc_t(class_size[cls] > 0 ? class_size[cls] : 1);
      mean_out[cls][dim] = static_cast<scalar_t>(slot_sum[cls][dim] * scale);
    }
  }
  if (threadIdx.x == 0) {
    num_neutral[b] = num_unlabeled - negatives;
    num_negative[b] = negatives;
    threshold[b] = row_cutoff < 0 ? neg_infinity<acc_t>() : key_to_score<acc_t>(threshold_key);
    cutoff[b] = row_cutoff;
    hard[b] = row_hard;
  }
}

// member_grads: [2, B, d], each class's gradient divided by its size; column: [B, d], written
// for the rows summed by difference (the host sums it over rows); grad_rows: [C, d] slots for a
// shared list, the [I, d] table for per-row lists.
template <typename scalar_t, typename acc_t>
__global__ void class_centroids_bwd_kernel(RowBatch<scalar_t> batch, int64_t row0, const acc_t* scores,
                                           SortedList sorted, const acc_t* threshold, const int64_t* cutoff,
                                           const int64_t* num_neutral, const int64_t* num_negative,
                                           const acc_t* member_grads, acc_t* column, acc_t* grad_rows) {
  extern __shared__ unsigned char dynamic_shared[];
  __shared__ DirectMembers list;
  const int64_t b = row0 + blockIdx.x, d = batch.dim, count = batch.num_candidates;
  const acc_t* row_scores = scores == nullptr ? nullptr : scores + static_cast<int64_t>(blockIdx.x) * count;
  const bool shared = batch.candidate_row_stride == 0;
  const Row<scalar_t, acc_t> row(batch, b);
  const auto threshold_key = order_key(threshold[b]);
  const RowPlan plan = plan_row(shared, count, num_neutral[b], num_negative[b]);
  unsigned* labeled = nullptr;  // with a sorted shared list, U_b as a bitmap in dynamic shared memory
  if (sorted.sorted_items != nullptr) {
    labeled = reinterpret_cast<unsigned*>(dynamic_shared);
    mark_labeled(row, sorted, count, labeled);
  }
  const acc_t* grad[3] = {nullptr, member_grads + b * d, member_grads + (batch.num_rows + b) * d};
  if (plan.by_difference) {
    for (int64_t dim = threadIdx.x; dim < d; dim += blockDim.x) column[b * d + dim] = grad[plan.larger][dim];
  }
  for (int64_t j0 = 0; j0 < count; j0 += kThreads) {
    const int64_t j = j0 + threadIdx.x;
    int slot = -1;
    if (j < count) {
      const acc_t score = candidate_score(row, row_scores, j);
      slot = direct_slot(plan, classify_key(row_key(row, labeled, j, score), j, threshold_key, cutoff[b]));
    }
    const int members = gather_direct(slot, j < count ? (shared ? j : row.item(j)) : 0, list);
    for (int64_t pair = threadIdx.x; pair < members * d; pair += blockDim.x) {
      const int64_t t = pair / d, dim = pair % d;
      const int s = list.slots[t];
      // by difference, the column sum already gave every candidate the larger class's gradient
      const acc_t value = !plan.by_difference ? grad[s][dim]
                          : s == kNotUnlabeled ? -grad[plan.larger][dim]
                                               : grad[plan.smaller][dim] - grad[plan.larger][dim];
      atomicAdd(&grad_rows[list.rows[t] * d + dim], value);
    }
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
class_centroids_fwd_cuda(const at::Tensor& user_emb, const at::Tensor& item_table, const at::Tensor& users,
                         const at::Tensor& pos_items, const at::Tensor& candidates, const at::Tensor& known_indptr,
                         const at::Tensor& known_indices, const at::Tensor& k, int64_t capacity) {
  RowInputs in =
      prepare_row_inputs(kFwd, user_emb, item_table, users, pos_items, candidates, known_indptr, known_indices);
  check_id_ranges(kFwd, in);
  const at::Tensor k_in = row_state(kFwd, in, k, "k", at::kLong);
  const c10::cuda::CUDAGuard guard(user_emb.device());
  const at::TensorOptions acc_options = user_emb.options().dtype(opmath_dtype(user_emb.scalar_type()));
  at::Tensor neutral = at::empty({in.rows, in.dim}, user_emb.options());
  at::Tensor negative = at::empty({in.rows, in.dim}, user_emb.options());
  at::Tensor num_neutral = at::empty({in.rows}, users.options().dtype(at::kLong));
  at::Tensor num_negative = at::empty({in.rows}, users.options().dtype(at::kLong));
  at::Tensor threshold = at::empty({in.rows}, acc_options);
  at::Tensor cutoff = at::empty({in.rows}, users.options().dtype(at::kLong));
  at::Tensor hard = at::empty({in.rows}, users.options().dtype(at::kLong));
  // the backward rescores every row on the GPU: no scatter groups are saved
  at::Tensor saved_members = saved_members_output(kFwd, in, capacity);
  at::Tensor saved_ends = at::full({in.rows, 2}, -1, users.options().dtype(at::kInt));
  at::Tensor sums = at::zeros({3, in.rows, in.dim}, acc_options);
  // the sum of every shared candidate's embedding, which the by-difference rows subtract from
  const at::Tensor total =
      in.shared ? in.item_table.index_select(0, in.candidates).to(acc_options.dtype()).sum(0)
                : at::zeros({in.dim}, acc_options);
  PNN_DISPATCH_FLOATING_TYPES(in.user_emb.scalar_type(), kFwd, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    using key_t = typename KeyOf<acc_t>::type;
    // the keys when they fit, and for a shared list its labeled bitmap after them (alone when the
    // keys do not fit: an eighth of a float key's bytes, so it fits some 32 times more candidates)
    const int64_t key_bytes = in.num_candidates * static_cast<int64_t>(sizeof(key_t));
    const int64_t bitmap_bytes = in.shared ? labeled_bitmap_bytes(in.num_candidates) : 0;
    const bool cached =
        key_bytes + bitmap_bytes <= dynamic_shared_budget(class_centroids_fwd_kernel<scalar_t, acc_t, true>);
    const auto kernel = cached ? class_centroids_fwd_kernel<scalar_t, acc_t, true>
                               : class_centroids_fwd_kernel<scalar_t, acc_t, false>;
    const SortedCandidates sorted(in, bitmap_bytes <= dynamic_shared_budget(kernel));
    const int64_t shared_bytes = (cached ? key_bytes : 0) + (sorted.items.defined() ? bitmap_bytes : 0);
    const RowBatch<scalar_t> batch = row_batch<scalar_t>(in);
    const auto launch = [&](int64_t row0, int64_t num_rows, const acc_t* scores) {
      launch_rows(kernel, num_rows, shared_bytes, batch, row0, scores, sorted.view(),
                  k_in.data_ptr<int64_t>(), total.data_ptr<acc_t>(), sums.data_ptr<acc_t>(), neutral.data_ptr<scalar_t>(),
                  negative.data_ptr<scalar_t>(), num_neutral.data_ptr<int64_t>(), num_negative.data_ptr<int64_t>(),
                  threshold.data_ptr<acc_t>(), cutoff.data_ptr<int64_t>(), hard.data_ptr<int64_t>());
    };
    // a shared list is scored by tiles (for_each_score_tile); per-row lists, a few candidates a row,
    // by the row kernel's own threads
    if (in.shared && in.num_candidates > 0) {
      for_each_score_tile<scalar_t, acc_t>(batch, acc_options, [&](int64_t row0, const at::Tensor& scores) {
        launch(row0, scores.size(0), scores.data_ptr<acc_t>());
      });
    } else {
      launch(0, in.rows, nullptr);
    }
  });
  return {neutral, negative, num_neutral, num_negative, threshold, cutoff, hard, saved_members, saved_ends};
}

at::Tensor class_centroids_bwd_cuda(const at::Tensor& grad_neutral, const at::Tensor& grad_negative,
                                    const at::Tensor& user_emb, const at::Tensor& item_table, const at::Tensor& users,
                                    const at::Tensor& pos_items, const at::Tensor& candidates,
                                    const at::Tensor& known_indptr, const at::Tensor& known_indices,
                                    const at::Tensor& threshold, const at::Tensor& cutoff,
                                    const at::Tensor& num_neutral, const at::Tensor& num_negative,
                                    const at::Tensor& saved_members, const at::Tensor& saved_ends) {
  // float atomicAdds onto the candidates' slots or rows, in an order that varies from run to run
  at::globalContext().alertNotDeterministic(kBwd);
  RowInputs in =
      prepare_row_inputs(kBwd, user_emb, item_table, users, pos_items, candidates, known_indptr, known_indices);
  check_id_ranges(kBwd, in);
  check_saved_members(kBwd, in, saved_members, saved_ends);  // not read: every row is rescored
  const at::ScalarType acc_dtype = opmath_dtype(user_emb.scalar_type());
  const at::TensorOptions acc_options = user_emb.options().dtype(acc_dtype);
  const at::Tensor threshold_in = row_state(kBwd, in, threshold, "threshold", acc_dtype);
  const at::Tensor cutoff_in = row_state(kBwd, in, cutoff, "cutoff", at::kLong);
  const at::Tensor neutral_in = row_state(kBwd, in, num_neutral, "num_neutral", at::kLong);
  const at::Tensor negative_in = row_state(kBwd, in, num_negative, "num_negative", at::kLong);
  const c10::cuda::CUDAGuard guard(user_emb.device());
  const at::Tensor member_grads =
      at::stack({per_member_grad(kBwd, in, grad_neutral, "grad_neutral", num_neutral, "num_neutral"),
                 per_member_grad(kBwd, in, grad_negative, "grad_negative", num_negative, "num_negative")});
  at::Tensor grad_table = at::zeros(in.item_table.sizes(), acc_options);
  const at::Tensor column = at::zeros({in.shared ? in.rows : 0, in.dim}, acc_options);
  const at::Tensor slots = in.shared ? at::zeros({in.num_candidates, in.dim}, acc_options) : grad_table;
  PNN_DISPATCH_FLOATING_TYPES(in.user_emb.scalar_type(), kBwd, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const RowBatch<scalar_t> batch = row_batch<scalar_t>(in);
    const auto kernel = class_centroids_bwd_kernel<scalar_t, acc_t>;
    const int64_t bitmap_bytes = labeled_bitmap_bytes(in.num_candidates);
    const SortedCandidates sorted(in, bitmap_bytes <= dynamic_shared_budget(kernel));
    const int64_t shared_bytes = sorted.items.defined() ? bitmap_bytes : 0;
    const auto launch = [&](int64_t row0, int64_t num_rows, const acc_t* scores) {
      launch_rows(kernel, num_rows, shared_bytes, batch, row0, scores, sorted.view(),
                  threshold_in.data_ptr<acc_t>(), cutoff_in.data_ptr<int64_t>(), neutral_in.data_ptr<int64_t>(),
                  negative_in.data_ptr<int64_t>(), member_grads.data_ptr<acc_t>(), column.data_ptr<acc_t>(),
                  slots.data_ptr<acc_t>());
    };
    if (in.shared && in.num_candidates > 0) {
      for_each_score_tile<scalar_t, acc_t>(batch, acc_options, [&](int64_t row0, const at::Tensor& scores) {
        launch(row0, scores.size(0), scores.data_ptr<acc_t>());
      });
    } else {
      launch(0, in.rows, nullptr);
    }
  });
  if (in.shared) grad_table.index_add_(0, in.candidates, slots + column.sum(0));
  return grad_table.to(item_table.scalar_type());
}

}  // namespace
}  // namespace pnn_fast

TORCH_LIBRARY_IMPL(pnn_fast, CUDA, m) {
  m.impl("class_centroids_fwd", &pnn_fast::class_centroids_fwd_cuda);
  m.impl("class_centroids_bwd", &pnn_fast::class_centroids_bwd_cuda);
}
