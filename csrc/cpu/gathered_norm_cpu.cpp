// pnn_fast::gathered_norm_fwd / _bwd on CPU: the Frobenius norm of gathered table rows (RecBole's
// EmbLoss term) without the gathered copy; the backward scatters by column blocks (deterministic).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <vector>

#include "common/checks.h"
#include "common/dispatch.h"
#include "cpu/cpu_rows.h"

namespace pnn_fast {
namespace {

at::Tensor gathered_norm_fwd_cpu(const at::Tensor& table, const at::Tensor& ids) {
  constexpr const char* op = "pnn_fast::gathered_norm_fwd";
  check_gathered_norm(op, table, ids);
  const at::Tensor rows_in = table.contiguous(), ids_in = ids_in_range(op, ids, rows_in.size(0), "ids");
  const int64_t n = ids_in.numel(), d = rows_in.size(1);
  at::Tensor norm_out = at::empty({}, table.options());
  PNN_DISPATCH_FLOATING_TYPES(rows_in.scalar_type(), op, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* T = rows_in.data_ptr<scalar_t>();
    const int64_t* id = ids_in.data_ptr<int64_t>();
    std::vector<acc_t> squares(n);
    at::parallel_for(0, n, lookup_grain(d), [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) squares[b] = dot_wide<acc_t>(T + id[b] * d, T + id[b] * d, d);
    });
    acc_t total = 0;
    for (const acc_t x : squares) total += x;
    *norm_out.data_ptr<scalar_t>() = static_cast<scalar_t>(std::sqrt(total));
  });
  return norm_out;
}

at::Tensor gathered_norm_bwd_cpu(const at::Tensor& grad, const at::Tensor& table, const at::Tensor& ids,
                                 const at::Tensor& output) {
  constexpr const char* op = "pnn_fast::gathered_norm_bwd";
  check_gathered_norm(op, table, ids);
  const at::Tensor rows_in = table.contiguous(), ids_in = ids_in_range(op, ids, rows_in.size(0), "ids");
  const at::Tensor g = scalar_grad(op, rows_in, grad);
  const at::Tensor norm = scalar_grad(op, rows_in, output);
  at::Tensor grad_table = at::zeros(rows_in.sizes(), rows_in.options().dtype(g.scalar_type()));
  PNN_DISPATCH_FLOATING_TYPES(rows_in.scalar_type(), op, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const acc_t coef = norm_grad_scale(g.item<acc_t>(), acc_t(1), 1, norm.item<acc_t>());
    const scalar_t* T = rows_in.data_ptr<scalar_t>();
    const int64_t* id = ids_in.data_ptr<int64_t>();
    acc_t* gT = grad_table.data_ptr<acc_t>();
    const int64_t n = ids_in.numel(), d = rows_in.size(1);
    for_column_blocks(d, n, [&](int64_t c0, int64_t c1) {
      for (int64_t b = 0; b < n; ++b) {
        const scalar_t* row = T + id[b] * d;
        acc_t* out = gT + id[b] * d;
        for (int64_t i = c0; i < c1; ++i) out[i] += coef * acc_t(row[i]);
      }
    });
  });
  return grad_table.to(table.scalar_type());
}

}  // namespace
}  // namespace pnn_fast

TORCH_LIBRARY_IMPL(pnn_fast, CPU, m) {
  m.impl("gathered_norm_fwd", &pnn_fast::gathered_norm_fwd_cpu);
  m.impl("gathered_norm_bwd", &pnn_fast::gathered_norm_bwd_cpu);
}
