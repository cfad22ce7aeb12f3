// pnn_fast::class_centroids_fwd / _bwd on CUDA, one block per row.
//
// Forward: the row's keys (kept in shared memory when C keys fit, else rescored on every pass), the hard
// negative and the radix select of cuda_rows.cuh, then the class sums in chunks of kThreads candidates: each thread
// classifies one candidate, then each thread adds the chunk's members along its own dims.
// Backward: the same classification recomputed from (threshold, cutoff), then each member's
// per-member gradient is scattered with atomics, threads spread over (candidate, dim) pairs.
#include <ATen/Context.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include "common/checks.h"
#include "common/dispatch.h"
#include "cuda/cuda_rows.cuh"

namespace pnn_fast {
namespace {

constexpr const char* kFwd = "pnn_fast::class_centroids_fwd";
constexpr const char* kBwd = "pnn_fast::class_centroids_bwd";

template <typename scalar_t, typename acc_t, bool kCached>
__global__ void class_centroids_fwd_kernel(RowBatch<scalar_t> batch, const int64_t* sizes, acc_t* sums,
                                           scalar_t* neutral, scalar_t* negative, int64_t* num_neutral,
                                           int64_t* num_negative, acc_t* threshold, int64_t* cutoff, int64_t* hard) {
  using key_t = typename KeyOf<acc_t>::type;
  extern __shared__ unsigned char dynamic_shared[];
  __shared__ SelectShared<key_t> sh;
  __shared__ HardShared<key_t> hard_sh;
  __shared__ int8_t classes[kThreads];
  __shared__ int64_t items[kThreads];
  const int64_t b = blockIdx.x, d = batch.dim, count = batch.num_candidates;
  const Row<scalar_t, acc_t> row(batch, b);
  const RowKeys<scalar_t, acc_t, kCached> keys{row, reinterpret_cast<key_t*>(dynamic_shared), count};
  keys.prepare();
  int64_t row_hard, num_unlabeled;
  block_hard_negative(keys, count, hard_sh, row_hard, num_unlabeled);
  key_t threshold_key;
  int64_t row_cutoff;
  block_bottom_k(keys, count, sizes[b], sh, threshold_key, row_cutoff);
  const int64_t k = sizes[b];
  const int64_t negatives = row_cutoff < 0 ? 0 : (k > num_unlabeled ? num_unlabeled : k);

  acc_t* sum_neutral = sums + b * d;  // zeroed [2, B, d] workspace; each thread owns its dims
  acc_t* sum_negative = sums + (batch.num_rows + b) * d;
  for (int64_t j0 = 0; j0 < count; j0 += kThreads) {
    const int64_t j = j0 + threadIdx.x;
    classes[threadIdx.x] = j < count ? classify_key(keys(j), j, threshold_key, row_cutoff) : kNotUnlabeled;
    items[threadIdx.x] = j < count ? row.item(j) : 0;
    __syncthreads();
    const int chunk = static_cast<int>(count - j0 < kThreads ? count - j0 : kThreads);
    for (int64_t dim = threadIdx.x; dim < d; dim += blockDim.x) {
      acc_t add_neutral = 0, add_negative = 0;
      for (int t = 0; t < chunk; ++t) {
        if (classes[t] == kNotUnlabeled) continue;
        const acc_t v = static_cast<acc_t>(batch.item_table[items[t] * d + dim]);
        if (classes[t] == kNeutral) {
          add_neutral += v;
        } else {
          add_negative += v;
        }
      }
      sum_neutral[dim] += add_neutral;
      sum_negative[dim] += add_negative;
    }
    __syncthreads();
  }
  const acc_t scale_neutral = acc_t(1) / acc_t(num_unlabeled - negatives > 0 ? num_unlabeled - negatives : 1);
  const acc_t scale_negative = acc_t(1) / acc_t(negatives > 0 ? negatives : 1);
  for (int64_t dim = threadIdx.x; dim < d; dim += blockDim.x) {
    neutral[b * d + dim] = static_cast<scalar_t>(sum_neutral[dim] * scale_neutral);
    negative[b * d + dim] = static_cast<scalar_t>(sum_negative[dim] * scale_negative);
  }
  if (threadIdx.x == 0) {
    num_neutral[b] = num_unlabeled - negatives;
    num_negative[b] = negatives;
    threshold[b] = row_cutoff < 0 ? neg_infinity<acc_t>() : key_to_score<acc_t>(threshold_key);
    cutoff[b] = row_cutoff;
    hard[b] = row_hard;
  }
}

template <typename scalar_t, typename acc_t>
__global__ void class_centroids_bwd_kernel(RowBatch<scalar_t> batch, const acc_t* threshold, const int64_t* cutoff,
                                           const acc_t* member_grads, acc_t* grad_table) {
  __shared__ int8_t classes[kThreads];
  __shared__ int64_t items[kThreads];
  const int64_t b = blockIdx.x, d = batch.dim, count = batch.num_candidates;
  const Row<scalar_t, acc_t> row(batch, b);
  const auto threshold_key = order_key(threshold[b]);
  const acc_t* grad_neutral = member_grads + b * d;
  const acc_t* grad_negative = member_grads + (batch.num_rows + b) * d;
  for (int64_t j0 = 0; j0 < count; j0 += kThreads) {
    const int64_t j = j0 + threadIdx.x;
    if (j < count) {
      classes[threadIdx.x] = row.classify(j, row.score(j), threshold_key, cutoff[b]);
      items[threadIdx.x] = row.item(j);
    }
    __syncthreads();
    const int64_t chunk = count - j0 < kThreads ? count - j0 : kThreads;
    for (int64_t pair = threadIdx.x; pair < chunk * d; pair += blockDim.x) {
      const int64_t t = pair / d, dim = pair % d;
      if (classes[t] == kNotUnlabeled) continue;
      atomicAdd(&grad_table[items[t] * d + dim], (classes[t] == kNeutral ? grad_neutral : grad_negative)[dim]);
    }
    __syncthreads();
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> class_centroids_fwd_cuda(
    const at::Tensor& user_emb, const at::Tensor& item_table, const at::Tensor& users, const at::Tensor& pos_items,
    const at::Tensor& candidates, const at::Tensor& known_indptr, const at::Tensor& known_indices,
    const at::Tensor& k) {
  const RowInputs in =
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
  at::Tensor sums = at::zeros({2, in.rows, in.dim}, acc_options);
  PNN_DISPATCH_FLOATING_TYPES(in.user_emb.scalar_type(), kFwd, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    using key_t = typename KeyOf<acc_t>::type;
    const int64_t key_bytes = in.num_candidates * static_cast<int64_t>(sizeof(key_t));
    const bool cached = key_bytes <= dynamic_shared_budget(class_centroids_fwd_kernel<scalar_t, acc_t, true>);
    const RowBatch<scalar_t> batch = row_batch<scalar_t>(in);
    const auto kernel = cached ? class_centroids_fwd_kernel<scalar_t, acc_t, true>
                               : class_centroids_fwd_kernel<scalar_t, acc_t, false>;
    launch_rows(kernel, in.rows, cached ? key_bytes : 0, batch, k_in.data_ptr<int64_t>(), sums.data_ptr<acc_t>(),
                neutral.data_ptr<scalar_t>(), negative.data_ptr<scalar_t>(), num_neutral.data_ptr<int64_t>(),
                num_negative.data_ptr<int64_t>(), threshold.data_ptr<acc_t>(), cutoff.data_ptr<int64_t>(),
                hard.data_ptr<int64_t>());
  });
  return {neutral, negative, num_neutral, num_negative, threshold, cutoff, hard};
}

at::Tensor class_centroids_bwd_cuda(const at::Tensor& grad_neutral, const at::Tensor& grad_negative,
                                    const at::Tensor& user_emb, const at::Tensor& item_table, const at::Tensor& users,
                                    const at::Tensor& pos_items, const at::Tensor& candidates,
                                    const at::Tensor& known_indptr, const at::Tensor& known_indices,
                                    const at::Tensor& threshold, const at::Tensor& cutoff,
                                    const at::Tensor& num_neutral, const at::Tensor& num_negative) {
  // float atomicAdds onto the candidates' rows, in an order that varies from run to run
  at::globalContext().alertNotDeterministic(kBwd);
  const RowInputs in =
      prepare_row_inputs(kBwd, user_emb, item_table, users, pos_items, candidates, known_indptr, known_indices);
  check_id_ranges(kBwd, in);
  const at::ScalarType acc_dtype = opmath_dtype(user_emb.scalar_type());
  const at::Tensor threshold_in = row_state(kBwd, in, threshold, "threshold", acc_dtype);
  const at::Tensor cutoff_in = row_state(kBwd, in, cutoff, "cutoff", at::kLong);
  const c10::cuda::CUDAGuard guard(user_emb.device());
  const at::Tensor member_grads =
      at::stack({per_member_grad(kBwd, in, grad_neutral, "grad_neutral", num_neutral, "num_neutral"),
                 per_member_grad(kBwd, in, grad_negative, "grad_negative", num_negative, "num_negative")});
  at::Tensor grad_table = at::zeros(in.item_table.sizes(), item_table.options().dtype(acc_dtype));
  PNN_DISPATCH_FLOATING_TYPES(in.user_emb.scalar_type(), kBwd, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    launch_rows(class_centroids_bwd_kernel<scalar_t, acc_t>, in.rows, 0, row_batch<scalar_t>(in),
                threshold_in.data_ptr<acc_t>(), cutoff_in.data_ptr<int64_t>(), member_grads.data_ptr<acc_t>(),
                grad_table.data_ptr<acc_t>());
  });
  return grad_table.to(item_table.scalar_type());
}

}  // namespace
}  // namespace pnn_fast

TORCH_LIBRARY_IMPL(pnn_fast, CUDA, m) {
  m.impl("class_centroids_fwd", &pnn_fast::class_centroids_fwd_cuda);
  m.impl("class_centroids_bwd", &pnn_fast::class_centroids_bwd_cuda);
}
