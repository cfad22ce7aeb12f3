// pnn_fast::gathered_dots_fwd / _bwd on CUDA: one thread per (b, k) dot product; the backward takes
// one thread per (b, i) and adds the table's share with atomicAdd.
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
__global__ void gathered_dots_kernel(const scalar_t* rows, const scalar_t* table, const int64_t* ids, int64_t B,
                                     int64_t K, int64_t d, int64_t num_rows, scalar_t* out) {
  const int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t >= B * K) return;
  out[t] = static_cast<scalar_t>(dot_wide<acc_t>(rows + (t / K) * d, table + ids[t] * d, d));
}

// One thread per (b, i): grad_rows[b, i] = sum_k g[b, k] table[ids[b, k], i], and the table's share by atomicAdd.
template <typename scalar_t, typename acc_t>
__global__ void gathered_dots_bwd_kernel(const scalar_t* grad, const scalar_t* rows, const scalar_t* table,
                                         const int64_t* ids, int64_t B, int64_t K, int64_t d, acc_t* grad_rows,
                                         acc_t* grad_table) {
  const int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t >= B * d) return;
  const int64_t b = t / d, i = t % d;
  const acc_t r = acc_t(rows[t]);
  acc_t sum = 0;
  for (int64_t k = 0; k < K; ++k) {
    const acc_t gk = acc_t(grad[b * K + k]);
    sum += gk * acc_t(table[ids[b * K + k] * d + i]);
    atomicAdd(grad_table + ids[b * K + k] * d + i, gk * r);
  }
  grad_rows[t] = sum;
}

at::Tensor gathered_dots_fwd_cuda(const at::Tensor& rows, const at::Tensor& table, const at::Tensor& ids) {
  constexpr const char* op = "pnn_fast::gathered_dots_fwd";
  check_gathered_dots(op, rows, table, ids);
  const at::Tensor R = rows.contiguous(), T = table.contiguous(), id = ids_in_range(op, ids, T.size(0), "ids");
  const c10::cuda::CUDAGuard guard(R.device());
  at::Tensor out = at::empty({R.size(0), id.size(1)}, R.options());
  PNN_DISPATCH_FLOATING_TYPES(R.scalar_type(), op, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    launch_flat(gathered_dots_kernel<scalar_t, acc_t>, out.numel(), R.data_ptr<scalar_t>(), T.data_ptr<scalar_t>(),
                id.data_ptr<int64_t>(), R.size(0), id.size(1), R.size(1), T.size(0), out.data_ptr<scalar_t>());
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> gathered_dots_bwd_cuda(const at::Tensor& grad, const at::Tensor& rows,
                                                          const at::Tensor& table, const at::Tensor& ids) {
  constexpr const char* op = "pnn_fast::gathered_dots_bwd";
  at::globalContext().alertNotDeterministic(op);  // float atomicAdds into the table's gradient
  check_gathered_dots(op, rows, table, ids);
  const at::Tensor R = rows.contiguous(), T = table.contiguous(), id = ids_in_range(op, ids, T.size(0), "ids");
  check_tensor(op, R, grad, "grad", R.scalar_type(), {R.size(0), id.size(1)}, "rows");
  const c10::cuda::CUDAGuard guard(R.device());
  const at::Tensor g_in = grad.contiguous();
  const at::TensorOptions acc_options = R.options().dtype(opmath_dtype(R.scalar_type()));
  at::Tensor grad_rows = at::empty(R.sizes(), acc_options);
  at::Tensor grad_table = at::zeros(T.sizes(), acc_options);
  PNN_DISPATCH_FLOATING_TYPES(R.scalar_type(), op, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    launch_flat(gathered_dots_bwd_kernel<scalar_t, acc_t>, R.numel(), g_in.data_ptr<scalar_t>(),
                R.data_ptr<scalar_t>(), T.data_ptr<scalar_t>(), id.data_ptr<int64_t>(), R.size(0), id.size(1),
                R.size(1), grad_rows.data_ptr<acc_t>(), grad_table.data_ptr<acc_t>());
  });
  return {grad_rows.to(R.scalar_type()), grad_table.to(T.scalar_type())};
}

}  // namespace
}  // namespace pnn_fast

TORCH_LIBRARY_IMPL(pnn_fast, CUDA, m) {
  m.impl("gathered_dots_fwd", &pnn_fast::gathered_dots_fwd_cuda);
  m.impl("gathered_dots_bwd", &pnn_fast::gathered_dots_bwd_cuda);
}
