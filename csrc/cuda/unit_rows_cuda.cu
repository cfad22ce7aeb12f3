// pnn_fast::unit_rows_fwd / _bwd on CUDA: one warp per row, its lanes across d (coalesced loads),
// the row's sums by shuffles, then pnn_rows.h's per-row formulas, as on the CPU.  No atomics.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "common/checks.h"
#include "common/dispatch.h"
#include "cuda/cuda_rows.cuh"

namespace pnn_fast {
namespace {

template <typename scalar_t, typename acc_t>
__global__ void unit_rows_kernel(const scalar_t* X, int64_t n, int64_t d, scalar_t* Y) {
  const int64_t r = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (r >= n) return;  // a whole warp: blocks hold whole warps
  const scalar_t* row = X + r * d;
  acc_t squares = 0;
  for (int64_t k = lane; k < d; k += 32) squares = madd(acc_t(row[k]), acc_t(row[k]), squares);
  const acc_t inv_denom = acc_t(1) / unit_row_denominator(warp_total(squares));
  for (int64_t k = lane; k < d; k += 32) Y[r * d + k] = static_cast<scalar_t>(acc_t(row[k]) * inv_denom);
}

template <typename scalar_t, typename acc_t>
__global__ void unit_rows_bwd_kernel(const scalar_t* G, const scalar_t* X, int64_t n, int64_t d, scalar_t* out) {
  const int64_t r = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (r >= n) return;
  const scalar_t *row = X + r * d, *g = G + r * d;
  acc_t squares = 0, grad_dot = 0;
  for (int64_t k = lane; k < d; k += 32) {
    squares = madd(acc_t(row[k]), acc_t(row[k]), squares);
    grad_dot = madd(acc_t(g[k]), acc_t(row[k]), grad_dot);
  }
  const UnitRowBackward<acc_t> c = unit_row_backward(warp_total(squares), warp_total(grad_dot));
  for (int64_t k = lane; k < d; k += 32) {
    out[r * d + k] = static_cast<scalar_t>(unit_row_grad_entry(c, acc_t(g[k]), acc_t(row[k])));
  }
}

at::Tensor unit_rows_fwd_cuda(const at::Tensor& x) {
  constexpr const char* op = "pnn_fast::unit_rows_fwd";
  check_table(op, x, "x");
  const c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor in = x.contiguous();
  at::Tensor out = at::empty(in.sizes(), in.options());
  PNN_DISPATCH_FLOATING_TYPES(in.scalar_type(), op, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    launch_flat(unit_rows_kernel<scalar_t, acc_t>, in.size(0) * 32, in.data_ptr<scalar_t>(), in.size(0), in.size(1),
                out.data_ptr<scalar_t>());
  });
  return out;
}

at::Tensor unit_rows_bwd_cuda(const at::Tensor& grad, const at::Tensor& x) {
  constexpr const char* op = "pnn_fast::unit_rows_bwd";
  check_table(op, x, "x");
  check_tensor(op, x, grad, "grad", x.scalar_type(), {x.size(0), x.size(1)}, "x");
  const c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor in = x.contiguous(), g_in = grad.contiguous();
  at::Tensor grad_x = at::empty(in.sizes(), in.options());
  PNN_DISPATCH_FLOATING_TYPES(in.scalar_type(), op, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    launch_flat(unit_rows_bwd_kernel<scalar_t, acc_t>, in.size(0) * 32, g_in.data_ptr<scalar_t>(),
                in.data_ptr<scalar_t>(), in.size(0), in.size(1), grad_x.data_ptr<scalar_t>());
  });
  return grad_x;
}

}  // namespace
}  // namespace pnn_fast

TORCH_LIBRARY_IMPL(pnn_fast, CUDA, m) {
  m.impl("unit_rows_fwd", &pnn_fast::unit_rows_fwd_cuda);
  m.impl("unit_rows_bwd", &pnn_fast::unit_rows_bwd_cuda);
}
