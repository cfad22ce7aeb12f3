// pnn_fast::gathered_norm_fwd / _bwd on CUDA: squared rows per thread, then one reduction; the
// backward scatters with atomicAdd (order of additions may vary, as torch's index_add on CUDA).
#include <ATen/Context.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include "common/checks.h"
#include "common/dispatch.h"
#include "cuda/cuda_rows.cuh"

namespace pnn_fast {
namespace {

template <typename scalar_t, typename acc_t>
__global__ void squared_rows_kernel(const scalar_t* T, const int64_t* ids, int64_t n, int64_t d, int64_t num_rows,
                                    acc_t* out) {
  const int64_t b = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (b >= n) return;
  out[b] = dot_wide<acc_t>(T + ids[b] * d, T + ids[b] * d, d);
}

template <typename scalar_t, typename acc_t>
__global__ void norm_scatter_kernel(const scalar_t* T, const int64_t* ids, int64_t n, int64_t d, const acc_t* grad,
                                    const acc_t* norm, acc_t* gT) {
  const int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t >= n * d) return;
  const acc_t coef = norm_grad_scale(*grad, acc_t(1), 1, *norm);
  const int64_t row = ids[t / d] * d + t % d;
  atomicAdd(gT + row, coef * acc_t(T[row]));
}

at::Tensor gathered_norm_fwd_cuda(const at::Tensor& table, const at::Tensor& ids) {
  constexpr const char* op = "pnn_fast::gathered_norm_fwd";
  check_gathered_norm(op, table, ids);
  const c10::cuda::CUDAGuard guard(table.device());
  const at::Tensor rows_in = table.contiguous(), ids_in = ids_in_range(op, ids, rows_in.size(0), "ids");
  at::Tensor squares = at::empty({ids_in.numel()}, table.options().dtype(opmath_dtype(table.scalar_type())));
  PNN_DISPATCH_FLOATING_TYPES(rows_in.scalar_type(), op, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    launch_flat(squared_rows_kernel<scalar_t, acc_t>, ids_in.numel(), rows_in.data_ptr<scalar_t>(),
                ids_in.data_ptr<int64_t>(), ids_in.numel(), rows_in.size(1), rows_in.size(0),
                squares.data_ptr<acc_t>());
  });
  return squares.sum().sqrt().to(table.scalar_type());
}

at::Tensor gathered_norm_bwd_cuda(const at::Tensor& grad, const at::Tensor& table, const at::Tensor& ids,
                                  const at::Tensor& output) {
  constexpr const char* op = "pnn_fast::gathered_norm_bwd";
  at::globalContext().alertNotDeterministic(op);  // float atomicAdds where ids repeat
  check_gathered_norm(op, table, ids);
  const c10::cuda::CUDAGuard guard(table.device());
  const at::Tensor rows_in = table.contiguous(), ids_in = ids_in_range(op, ids, rows_in.size(0), "ids");
  const at::Tensor g = scalar_grad(op, rows_in, grad).contiguous();
  const at::Tensor norm = scalar_grad(op, rows_in, output).contiguous();
  at::Tensor grad_table = at::zeros(rows_in.sizes(), rows_in.options().dtype(g.scalar_type()));
  PNN_DISPATCH_FLOATING_TYPES(rows_in.scalar_type(), op, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    launch_flat(norm_scatter_kernel<scalar_t, acc_t>, ids_in.numel() * rows_in.size(1), rows_in.data_ptr<scalar_t>(),
                ids_in.data_ptr<int64_t>(), ids_in.numel(), rows_in.size(1), g.data_ptr<acc_t>(),
                norm.data_ptr<acc_t>(), grad_table.data_ptr<acc_t>());
  });
  return grad_table.to(table.scalar_type());
}

}  // namespace
}  // namespace pnn_fast

TORCH_LIBRARY_IMPL(pnn_fast, CUDA, m) {
  m.impl("gathered_norm_fwd", &pnn_fast::gathered_norm_fwd_cuda);
  m.impl("gathered_norm_bwd", &pnn_fast::gathered_norm_bwd_cuda);
}
