// pnn_fast::masked_logsumexp_fwd / _bwd on CUDA: the forward takes one warp per row, its lanes
// across the row (coalesced loads): the largest logit by shuffles, then the sum of exp(l - largest);
// the backward one thread per entry.  The per-entry math is pnn_rows.h's, as on the CPU.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <optional>

#include "common/checks.h"
#include "common/dispatch.h"
#include "cuda/cuda_rows.cuh"

namespace pnn_fast {
namespace {

template <typename scalar_t, typename acc_t>
__global__ void masked_logsumexp_kernel(const scalar_t* X, acc_t scale, const scalar_t* shift, const bool* excluded,
                                        int64_t B, int64_t M, acc_t* lse) {
  const int64_t r = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (r >= B) return;  // a whole warp: blocks hold whole warps
  const scalar_t* row = X + r * M;
  const bool* skip = excluded ? excluded + r * M : nullptr;
  acc_t largest = neg_infinity<acc_t>();
  for (int64_t j = lane; j < M; j += 32) {
    const acc_t l = masked_logit(row[j], scale, shift, j, skip && skip[j]);
    largest = l > largest ? l : largest;
  }
  largest = warp_max(largest);
  const acc_t offset = lse_offset(largest);
  acc_t sum = 0;
  for (int64_t j = lane; j < M; j += 32) sum += exp_(masked_logit(row[j], scale, shift, j, skip && skip[j]) - offset);
  sum = warp_total(sum);
  if (lane == 0) lse[r] = masked_lse(largest, sum);
}

template <typename scalar_t, typename acc_t>
__global__ void masked_logsumexp_bwd_kernel(const acc_t* G, const scalar_t* X, acc_t scale, const scalar_t* shift,
                                            const bool* excluded, const acc_t* lse, int64_t B, int64_t M,
                                            scalar_t* grad_x) {
  const int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t >= B * M) return;
  const int64_t r = t / M, j = t % M;
  const bool skip = excluded && excluded[t];
  const acc_t l = masked_logit(X[t], scale, shift, j, skip);
  grad_x[t] = static_cast<scalar_t>(skip ? acc_t(0) : G[r] * scale * exp_(l - lse[r]));
}

at::Tensor masked_logsumexp_fwd_cuda(const at::Tensor& x, double scale, const std::optional<at::Tensor>& shift,
                                     const std::optional<at::Tensor>& excluded) {
  constexpr const char* op = "pnn_fast::masked_logsumexp_fwd";
  const MaskedLogsumexpInputs in = prepare_masked_logsumexp(op, x, scale, shift, excluded);
  const c10::cuda::CUDAGuard guard(in.x.device());
  const int64_t B = in.x.size(0), M = in.x.size(1);
  // in the accumulation dtype: the backward's exp(l - lse) reads it, and a half or bfloat16 rounding
  // of lse would move every gradient of the row by up to about 1%
  at::Tensor out = at::empty({B}, in.x.options().dtype(opmath_dtype(in.x.scalar_type())));
  PNN_DISPATCH_FLOATING_TYPES(in.x.scalar_type(), op, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    launch_flat(masked_logsumexp_kernel<scalar_t, acc_t>, B * 32, in.x.const_data_ptr<scalar_t>(), acc_t(scale),
                in.shift.defined() ? in.shift.const_data_ptr<scalar_t>() : nullptr,
                in.excluded.defined() ? in.excluded.const_data_ptr<bool>() : nullptr, B, M, out.data_ptr<acc_t>());
  });
  return out;
}

at::Tensor masked_logsumexp_bwd_cuda(const at::Tensor& grad, const at::Tensor& x, double scale,
                                     const std::optional<at::Tensor>& shift, const std::optional<at::Tensor>& excluded,
                                     const at::Tensor& lse) {
  constexpr const char* op = "pnn_fast::masked_logsumexp_bwd";
  const MaskedLogsumexpInputs in = prepare_masked_logsumexp_bwd(op, grad, x, scale, shift, excluded, lse);
  const int64_t B = in.x.size(0), M = in.x.size(1);
  const c10::cuda::CUDAGuard guard(in.x.device());
  const at::Tensor g_in = grad.contiguous(), lse_in = lse.contiguous();
  at::Tensor grad_x = at::empty({B, M}, in.x.options());
  PNN_DISPATCH_FLOATING_TYPES(in.x.scalar_type(), op, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    launch_flat(masked_logsumexp_bwd_kernel<scalar_t, acc_t>, B * M, g_in.const_data_ptr<acc_t>(),
                in.x.const_data_ptr<scalar_t>(), acc_t(scale),
                in.shift.defined() ? in.shift.const_data_ptr<scalar_t>() : nullptr,
                in.excluded.defined() ? in.excluded.const_data_ptr<bool>() : nullptr, lse_in.const_data_ptr<acc_t>(),
                B, M, grad_x.data_ptr<scalar_t>());
  });
  return grad_x;
}

}  // namespace
}  // namespace pnn_fast

TORCH_LIBRARY_IMPL(pnn_fast, CUDA, m) {
  m.impl("masked_logsumexp_fwd", &pnn_fast::masked_logsumexp_fwd_cuda);
  m.impl("masked_logsumexp_bwd", &pnn_fast::masked_logsumexp_bwd_cuda);
}
