// pnn_fast::class_terms_fwd / _bwd on CUDA: one warp per row runs the per-row math of pnn_rows.h
// (class_terms_row and its backward, the code the CPU kernels run) with its lanes across d
// (WarpRowSum: coalesced loads, sums by shuffles).  One thread per row walked d-long chains alone and
// filled only B / 256 blocks.  Rows are independent: no atomics, the same result on every run.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "common/checks.h"
#include "common/dispatch.h"
#include "cuda/cuda_rows.cuh"

namespace pnn_fast {
namespace {

template <typename scalar_t, typename acc_t>
__global__ void class_terms_fwd_kernel(ClassTermsBatch<scalar_t> batch, scalar_t* rank, scalar_t* constrain) {
  const int64_t b = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (b >= batch.rows) return;  // a whole warp: blocks hold whole warps
  acc_t row_rank, row_constrain;
  class_terms_row(batch.row(b), WarpRowSum{lane}, row_rank, row_constrain);
  if (lane == 0) {
    rank[b] = static_cast<scalar_t>(row_rank);
    constrain[b] = static_cast<scalar_t>(row_constrain);
  }
}

template <typename scalar_t, typename acc_t>
__global__ void class_terms_bwd_kernel(ClassTermsBatch<scalar_t> batch, const acc_t* grad_rank,
                                       const acc_t* grad_constrain, scalar_t* grad_user, scalar_t* grad_pos,
                                       scalar_t* grad_neutral, scalar_t* grad_negative) {
  const int64_t b = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (b >= batch.rows) return;  // a whole warp: blocks hold whole warps
  const int64_t at = b * batch.d;
  class_terms_row_backward(batch.row(b), WarpRowSum{lane}, grad_rank[b], grad_constrain[b], grad_user + at,
                           grad_pos + at, grad_neutral + at, grad_negative + at);
}

std::tuple<at::Tensor, at::Tensor> class_terms_fwd_cuda(const at::Tensor& user_emb, const at::Tensor& pos_emb,
                                                        const at::Tensor& neutral, const at::Tensor& negative,
                                                        const at::Tensor& noise_pos, const at::Tensor& noise_neg,
                                                        const at::Tensor& valid, const at::Tensor& num_negative) {
  constexpr const char* op = "pnn_fast::class_terms_fwd";
  const ClassTermsInputs in =
      prepare_class_terms(op, user_emb, pos_emb, neutral, negative, noise_pos, noise_neg, valid, num_negative);
  const c10::cuda::CUDAGuard guard(user_emb.device());
  const int64_t rows = in.user_emb.size(0);
  at::Tensor rank = at::empty({rows}, in.user_emb.options());
  at::Tensor constrain = at::empty({rows}, in.user_emb.options());
  PNN_DISPATCH_FLOATING_TYPES(in.user_emb.scalar_type(), op, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    launch_flat(class_terms_fwd_kernel<scalar_t, acc_t>, rows * 32, class_terms_batch<scalar_t>(in),
                rank.data_ptr<scalar_t>(), constrain.data_ptr<scalar_t>());
  });
  return {rank, constrain};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> class_terms_bwd_cuda(
    const at::Tensor& grad_rank, const at::Tensor& grad_constrain, const at::Tensor& user_emb,
    const at::Tensor& pos_emb, const at::Tensor& neutral, const at::Tensor& negative, const at::Tensor& noise_pos,
    const at::Tensor& noise_neg, const at::Tensor& valid, const at::Tensor& num_negative) {
  constexpr const char* op = "pnn_fast::class_terms_bwd";
  const ClassTermsInputs in =
      prepare_class_terms(op, user_emb, pos_emb, neutral, negative, noise_pos, noise_neg, valid, num_negative);
  const c10::cuda::CUDAGuard guard(user_emb.device());
  const at::Tensor rank_grad = row_output_grad(op, in, grad_rank, "grad_rank");
  const at::Tensor constrain_grad = row_output_grad(op, in, grad_constrain, "grad_constrain");
  const int64_t rows = in.user_emb.size(0), d = in.user_emb.size(1);
  at::Tensor grads[4];
  for (at::Tensor& g : grads) g = at::empty({rows, d}, in.user_emb.options());
  PNN_DISPATCH_FLOATING_TYPES(in.user_emb.scalar_type(), op, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    launch_flat(class_terms_bwd_kernel<scalar_t, acc_t>, rows * 32, class_terms_batch<scalar_t>(in),
                rank_grad.data_ptr<acc_t>(), constrain_grad.data_ptr<acc_t>(), grads[0].data_ptr<scalar_t>(),
                grads[1].data_ptr<scalar_t>(), grads[2].data_ptr<scalar_t>(), grads[3].data_ptr<scalar_t>());
  });
  return {grads[0], grads[1], grads[2], grads[3]};
}

}  // namespace
}  // namespace pnn_fast

TORCH_LIBRARY_IMPL(pnn_fast, CUDA, m) {
  m.impl("class_terms_fwd", &pnn_fast::class_terms_fwd_cuda);
  m.impl("class_terms_bwd", &pnn_fast::class_terms_bwd_cuda);
}
