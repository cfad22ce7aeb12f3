// pnn_fast::unit_rows_fwd / _bwd on CPU: F.normalize(x, dim=-1) of a whole table and its backward,
// one pass over the rows each (autograd's F.normalize makes about ten passes over [n, d] buffers,
// which for sampled softmax's item table was a third of the step).  Rows are independent, so the
// result does not depend on the thread count.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "common/checks.h"
#include "common/dispatch.h"
#include "cpu/cpu_rows.h"

namespace pnn_fast {
namespace {

at::Tensor unit_rows_fwd_cpu(const at::Tensor& x) {
  constexpr const char* op = "pnn_fast::unit_rows_fwd";
  check_table(op, x, "x");
  const at::Tensor in = x.contiguous();
  at::Tensor out = at::empty(in.sizes(), in.options());
  const int64_t n = in.size(0), d = in.size(1);
  PNN_DISPATCH_FLOATING_TYPES(in.scalar_type(), op, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* X = in.data_ptr<scalar_t>();
    scalar_t* Y = out.data_ptr<scalar_t>();
    at::parallel_for(0, n, lookup_grain(2 * d), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const scalar_t* row = X + r * d;
        const acc_t inv_denom = acc_t(1) / unit_row_denominator(dot_wide<acc_t>(row, row, d));
        for (int64_t k = 0; k < d; ++k) Y[r * d + k] = static_cast<scalar_t>(acc_t(row[k]) * inv_denom);
      }
    });
  });
  return out;
}

at::Tensor unit_rows_bwd_cpu(const at::Tensor& grad, const at::Tensor& x) {
  constexpr const char* op = "pnn_fast::unit_rows_bwd";
  check_table(op, x, "x");
  check_tensor(op, x, grad, "grad", x.scalar_type(), {x.size(0), x.size(1)}, "x");
  const at::Tensor in = x.contiguous(), g_in = grad.contiguous();
  at::Tensor grad_x = at::empty(in.sizes(), in.options());
  const int64_t n = in.size(0), d = in.size(1);
  PNN_DISPATCH_FLOATING_TYPES(in.scalar_type(), op, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* X = in.data_ptr<scalar_t>();
    const scalar_t* G = g_in.data_ptr<scalar_t>();
    scalar_t* out = grad_x.data_ptr<scalar_t>();
    at::parallel_for(0, n, lookup_grain(3 * d), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const scalar_t *row = X + r * d, *g = G + r * d;
        const UnitRowBackward<acc_t> c = unit_row_backward(dot_wide<acc_t>(row, row, d), dot_wide<acc_t>(g, row, d));
        for (int64_t k = 0; k < d; ++k) {
          out[r * d + k] = static_cast<scalar_t>(unit_row_grad_entry(c, acc_t(g[k]), acc_t(row[k])));
        }
      }
    });
  });
  return grad_x;
}

}  // namespace
}  // namespace pnn_fast

TORCH_LIBRARY_IMPL(pnn_fast, CPU, m) {
  m.impl("unit_rows_fwd", &pnn_fast::unit_rows_fwd_cpu);
  m.impl("unit_rows_bwd", &pnn_fast::unit_rows_bwd_cpu);
}
