// pnn_fast::gathered_dots_fwd / _bwd on CUDA: one thread per (b, k) dot product (with unit_table, its
// product with the unit table row); the backward takes one thread per (b, i) and adds the table's share
// with atomicAdd.
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
                                     int64_t K, int64_t d, bool unit_table, scalar_t* out) {
  const int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t >= B * K) return;
  const scalar_t* v = table + ids[t] * d;
  const acc_t dot = dot_wide<acc_t>(rows + (t / K) * d, v, d);
  out[t] = static_cast<scalar_t>(unit_table ? unit_dot(dot, dot_wide<acc_t>(v, v, d)) : dot);
}

// One thread per (b, k), with unit_table: the backward's scale and radial terms (pnn_rows.h, unit_dot_backward).
template <typename scalar_t, typename acc_t>
__global__ void unit_dot_backward_kernel(const scalar_t* grad, const scalar_t* rows, const scalar_t* table,
                                         const int64_t* ids, int64_t B, int64_t K, int64_t d, acc_t* scale,
                                         acc_t* radial) {
  const int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t >= B * K) return;
  const scalar_t* v = table + ids[t] * d;
  const UnitDotBackward<acc_t> c =
      unit_dot_backward(acc_t(grad[t]), dot_wide<acc_t>(rows + (t / K) * d, v, d), dot_wide<acc_t>(v, v, d));
  scale[t] = c.scale;
  radial[t] = c.radial;
}

// One thread per (b, i): grad_rows[b, i] = sum_k s[b, k] table[ids[b, k], i] and, by atomicAdd, the table's
// share s[b, k] rows[b, i] (less radial[b, k] table[ids[b, k], i] with unit_table; radial is null without).
template <typename scalar_t, typename acc_t>
__global__ void gathered_dots_bwd_kernel(const acc_t* scale, const acc_t* radial, const scalar_t* rows,
                                         const scalar_t* table, const int64_t* ids, int64_t B, int64_t K, int64_t d,
                                         acc_t* grad_rows, acc_t* grad_table) {
  const int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t >= B * d) return;
  const int64_t b = t / d, i = t % d;
  const acc_t r = acc_t(rows[t]);
  acc_t sum = 0;
  for (int64_t k = 0; k < K; ++k) {
    const acc_t s = scale[b * K + k];
    const int64_t entry = ids[b * K + k] * d + i;
    const acc_t v = acc_t(table[entry]);
    sum += s * v;
    atomicAdd(grad_table + entry, radial ? s * r - radial[b * K + k] * v : s * r);
  }
  grad_rows[t] = sum;
}

at::Tensor gathered_dots_fwd_cuda(const at::Tensor& rows, const at::Tensor& table, const at::Tensor& ids,
                                  bool unit_table) {
  constexpr const char* op = "pnn_fast::gathered_dots_fwd";
  check_gathered_dots(op, rows, table, ids);
  const at::Tensor R = rows.contiguous(), T = table.contiguous(), id = ids_in_range(op, ids, T.size(0), "ids");
  const c10::cuda::CUDAGuard guard(R.device());
  at::Tensor out = at::empty({R.size(0), id.size(1)}, R.options());
  PNN_DISPATCH_FLOATING_TYPES(R.scalar_type(), op, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    launch_flat(gathered_dots_kernel<scalar_t, acc_t>, out.numel(), R.data_ptr<scalar_t>(), T.data_ptr<scalar_t>(),
                id.data_ptr<int64_t>(), R.size(0), id.size(1), R.size(1), unit_table, out.data_ptr<scalar_t>());
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> gathered_dots_bwd_cuda(const at::Tensor& grad, const at::Tensor& rows,
                                                          const at::Tensor& table, const at::Tensor& ids,
                                                          bool unit_table) {
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
  const int64_t B = R.size(0), K = id.size(1), d = R.size(1);
  // each (b, k)'s scale: grad itself, or with unit_table grad / D, found beside the radial terms
  at::Tensor scale = unit_table ? at::empty({B, K}, acc_options) : g_in.to(acc_options.dtype());
  at::Tensor radial = at::empty({unit_table ? B * K : 0}, acc_options);
  PNN_DISPATCH_FLOATING_TYPES(R.scalar_type(), op, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t *r = R.data_ptr<scalar_t>(), *t = T.data_ptr<scalar_t>();
    const int64_t* ix = id.data_ptr<int64_t>();
    if (unit_table) {
      launch_flat(unit_dot_backward_kernel<scalar_t, acc_t>, B * K, g_in.data_ptr<scalar_t>(), r, t, ix, B, K, d,
                  scale.data_ptr<acc_t>(), radial.data_ptr<acc_t>());
    }
    launch_flat(gathered_dots_bwd_kernel<scalar_t, acc_t>, R.numel(), scale.data_ptr<acc_t>(),
                unit_table ? radial.data_ptr<acc_t>() : nullptr, r, t, ix, B, K, d, grad_rows.data_ptr<acc_t>(),
                grad_table.data_ptr<acc_t>());
  });
  return {grad_rows.to(R.scalar_type()), grad_table.to(T.scalar_type())};
}

}  // namespace
}  // namespace pnn_fast

TORCH_LIBRARY_IMPL(pnn_fast, CUDA, m) {
  m.impl("gathered_dots_fwd", &pnn_fast::gathered_dots_fwd_cuda);
  m.impl("gathered_dots_bwd", &pnn_fast::gathered_dots_bwd_cuda);
}
