// pnn_fast::gathered_dots_fwd / _bwd on CUDA: one thread per (b, k) dot product (with unit_table, its
// product with the unit table row, keeping the row's squared norm); the backward takes one thread per
// (b, i) and adds the table's share with atomicAdd, after one thread per (b, k) for unit_table's coefficients.
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
                                     int64_t K, int64_t d, acc_t* squared_norms, scalar_t* out) {
  const int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t >= B * K) return;
  const scalar_t* v = table + ids[t] * d;
  const acc_t dot = dot_wide<acc_t>(rows + (t / K) * d, v, d);
  if (squared_norms) {  // unit_table
    squared_norms[t] = dot_wide<acc_t>(v, v, d);
    out[t] = static_cast<scalar_t>(unit_dot(dot, squared_norms[t]));
  } else {
    out[t] = static_cast<scalar_t>(dot);
  }
}

// With unit_table: each (b, k)'s backward coefficients (pnn_rows.h, unit_dot_backward), computed once
// here rather than by each of the backward's d threads of row b (a square root and a division each).
template <typename scalar_t, typename acc_t>
__global__ void unit_dot_coefficients_kernel(const scalar_t* grad, const scalar_t* output, const acc_t* squared_norms,
                                             int64_t n, acc_t* scale, acc_t* radial) {
  const int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (e >= n) return;
  const UnitDotBackward<acc_t> c = unit_dot_backward(acc_t(grad[e]), acc_t(output[e]), squared_norms[e]);
  scale[e] = c.scale;
  radial[e] = c.radial;
}

// One thread per (b, i): grad_rows[b, i] = sum_k s[b, k] table[ids[b, k], i] and, by atomicAdd, the table's
// share s[b, k] rows[b, i] - radial[b, k] table[ids[b, k], i]; s = grad and radial = 0 without unit_table
// (scale and radial null), else unit_dot_coefficients_kernel's.
template <typename scalar_t, typename acc_t>
__global__ void gathered_dots_bwd_kernel(const scalar_t* grad, const acc_t* scale, const acc_t* radial,
                                         const scalar_t* rows, const scalar_t* table, const int64_t* ids, int64_t B,
                                         int64_t K, int64_t d, acc_t* grad_rows, acc_t* grad_table) {
  const int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t >= B * d) return;
  const int64_t b = t / d, i = t % d;
  const acc_t r = acc_t(rows[t]);
  acc_t sum = 0;
  for (int64_t k = 0; k < K; ++k) {
    const int64_t e = b * K + k, entry = ids[e] * d + i;
    const acc_t v = acc_t(table[entry]);
    const acc_t s = scale ? scale[e] : acc_t(grad[e]);
    sum += s * v;
    atomicAdd(grad_table + entry, radial ? s * r - radial[e] * v : s * r);
  }
  grad_rows[t] = sum;
}

std::tuple<at::Tensor, at::Tensor> gathered_dots_fwd_cuda(const at::Tensor& rows, const at::Tensor& table,
                                                          const at::Tensor& ids, bool unit_table) {
  constexpr const char* op = "pnn_fast::gathered_dots_fwd";
  check_gathered_dots(op, rows, table, ids);
  const at::Tensor R = rows.contiguous(), T = table.contiguous(), id = ids_in_range(op, ids, T.size(0), "ids");
  const c10::cuda::CUDAGuard guard(R.device());
  const int64_t B = R.size(0), K = id.size(1);
  at::Tensor out = at::empty({B, K}, R.options());
  at::Tensor squared_norms = at::empty(unit_table ? at::IntArrayRef{B, K} : at::IntArrayRef{0},
                                       R.options().dtype(opmath_dtype(R.scalar_type())));
  PNN_DISPATCH_FLOATING_TYPES(R.scalar_type(), op, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    launch_flat(gathered_dots_kernel<scalar_t, acc_t>, out.numel(), R.data_ptr<scalar_t>(), T.data_ptr<scalar_t>(),
                id.data_ptr<int64_t>(), B, K, R.size(1), unit_table ? squared_norms.data_ptr<acc_t>() : nullptr,
                out.data_ptr<scalar_t>());
  });
  return {out, squared_norms};
}

std::tuple<at::Tensor, at::Tensor> gathered_dots_bwd_cuda(const at::Tensor& grad, const at::Tensor& rows,
                                                          const at::Tensor& table, const at::Tensor& ids,
                                                          const at::Tensor& output, const at::Tensor& squared_norms,
                                                          bool unit_table) {
  constexpr const char* op = "pnn_fast::gathered_dots_bwd";
  at::globalContext().alertNotDeterministic(op);  // float atomicAdds into the table's gradient
  check_gathered_dots(op, rows, table, ids);
  const at::Tensor R = rows.contiguous(), T = table.contiguous(), id = ids_in_range(op, ids, T.size(0), "ids");
  const int64_t B = R.size(0), K = id.size(1), d = R.size(1);
  check_tensor(op, R, grad, "grad", R.scalar_type(), {B, K}, "rows");
  const at::Tensor y = unit_table ? checked_unit_dot_state(op, R, output, squared_norms, B, K) : output;
  const at::Tensor sq = unit_table ? squared_norms.contiguous() : squared_norms;
  const c10::cuda::CUDAGuard guard(R.device());
  const at::Tensor g_in = grad.contiguous();
  const at::TensorOptions acc_options = R.options().dtype(opmath_dtype(R.scalar_type()));
  at::Tensor grad_rows = at::empty(R.sizes(), acc_options);
  at::Tensor grad_table = at::zeros(T.sizes(), acc_options);
  // unit_table: rows 0 and 1 hold each (b, k)'s scale and radial
  at::Tensor coefficients = at::empty(unit_table ? at::IntArrayRef{2, B * K} : at::IntArrayRef{0}, acc_options);
  PNN_DISPATCH_FLOATING_TYPES(R.scalar_type(), op, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    acc_t* scale = unit_table ? coefficients.data_ptr<acc_t>() : nullptr;
    acc_t* radial = unit_table ? scale + B * K : nullptr;
    if (unit_table) {
      launch_flat(unit_dot_coefficients_kernel<scalar_t, acc_t>, B * K, g_in.data_ptr<scalar_t>(),
                  y.data_ptr<scalar_t>(), sq.data_ptr<acc_t>(), B * K, scale, radial);
    }
    launch_flat(gathered_dots_bwd_kernel<scalar_t, acc_t>, R.numel(), g_in.data_ptr<scalar_t>(), scale, radial,
                R.data_ptr<scalar_t>(), T.data_ptr<scalar_t>(), id.data_ptr<int64_t>(), B, K, d,
                grad_rows.data_ptr<acc_t>(), grad_table.data_ptr<acc_t>());
  });
  return {grad_rows.to(R.scalar_type()), grad_table.to(T.scalar_type())};
}

}  // namespace
}  // namespace pnn_fast

TORCH_LIBRARY_IMPL(pnn_fast, CUDA, m) {
  m.impl("gathered_dots_fwd", &pnn_fast::gathered_dots_fwd_cuda);
  m.impl("gathered_dots_bwd", &pnn_fast::gathered_dots_bwd_cuda);
}
