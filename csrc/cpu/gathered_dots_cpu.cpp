// pnn_fast::gathered_dots_fwd / _bwd on CPU: <rows[b], table[ids[b, k]]> without a [B, K, d] copy
// (the attention's logits), or with unit_table its cosine-style <rows[b], unit(table[ids[b, k]])>
// (sampled softmax's scores); the table gradient is scattered by column blocks (deterministic).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "common/checks.h"
#include "common/dispatch.h"
#include "cpu/cpu_rows.h"
#include "cpu/simd.h"

namespace pnn_fast {
namespace {

std::tuple<at::Tensor, at::Tensor> gathered_dots_fwd_cpu(const at::Tensor& rows, const at::Tensor& table,
                                                         const at::Tensor& ids, bool unit_table) {
  constexpr const char* op = "pnn_fast::gathered_dots_fwd";
  check_gathered_dots(op, rows, table, ids);
  const at::Tensor R = rows.contiguous(), T = table.contiguous(), id = ids_in_range(op, ids, T.size(0), "ids");
  const int64_t B = R.size(0), d = R.size(1), K = id.size(1);
  at::Tensor out = at::empty({B, K}, R.options());
  at::Tensor squared_norms = at::empty(unit_table ? at::IntArrayRef{B, K} : at::IntArrayRef{0},
                                       R.options().dtype(opmath_dtype(R.scalar_type())));
  PNN_DISPATCH_FLOATING_TYPES(R.scalar_type(), op, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t *r = R.data_ptr<scalar_t>(), *t = T.data_ptr<scalar_t>();
    const int64_t* ix = id.data_ptr<int64_t>();
    scalar_t* o = out.data_ptr<scalar_t>();
    acc_t* sq = squared_norms.data_ptr<acc_t>();
    // dot_wide's 8 lanes are 8 chains of multiplies and adds: one AVX2 register where the CPU has it
    at::parallel_for(0, B, lookup_grain(K * d), [&](int64_t begin, int64_t end) {
      run_widest([&]() PNN_INLINE_LAMBDA {
        for (int64_t b = begin; b < end; ++b) {
          for (int64_t k = 0; k < K; ++k) {
            if (b * K + k + kPrefetchAhead < end * K) prefetch_row(t + ix[b * K + k + kPrefetchAhead] * d, d);
            const scalar_t* v = t + ix[b * K + k] * d;
            const acc_t dot = dot_wide<acc_t>(r + b * d, v, d);
            if (unit_table) {  // v is in L1 after the first product: its squared norm costs no memory traffic
              sq[b * K + k] = dot_wide<acc_t>(v, v, d);
              o[b * K + k] = static_cast<scalar_t>(unit_dot(dot, sq[b * K + k]));
            } else {
              o[b * K + k] = static_cast<scalar_t>(dot);
            }
          }
        }
      });
    });
  });
  return {out, squared_norms};
}

std::tuple<at::Tensor, at::Tensor> gathered_dots_bwd_cpu(const at::Tensor& grad, const at::Tensor& rows,
                                                         const at::Tensor& table, const at::Tensor& ids,
                                                         const at::Tensor& output, const at::Tensor& squared_norms,
                                                         bool unit_table) {
  constexpr const char* op = "pnn_fast::gathered_dots_bwd";
  check_gathered_dots(op, rows, table, ids);
  const at::Tensor R = rows.contiguous(), T = table.contiguous(), id = ids_in_range(op, ids, T.size(0), "ids");
  const int64_t B = R.size(0), d = R.size(1), K = id.size(1), n = T.size(0);
  check_tensor(op, R, grad, "grad", R.scalar_type(), {B, K}, "rows");
  const at::TensorOptions acc_options = R.options().dtype(opmath_dtype(R.scalar_type()));
  const at::Tensor g_in = grad.contiguous();
  const at::Tensor y = unit_table ? checked_unit_dot_state(op, R, output, squared_norms, B, K) : output;
  const at::Tensor sq = unit_table ? squared_norms.contiguous() : squared_norms;
  at::Tensor grad_rows = at::empty({B, d}, acc_options);
  at::Tensor grad_table = at::zeros(T.sizes(), acc_options);
  // with unit_table: each (b, k)'s scale, found by the first loop for the second, and each table row's
  // sum of its radial terms, taken off the row once at the end
  at::Tensor scale = at::empty({unit_table ? B * K : 0}, acc_options);
  at::Tensor radial_sum = at::zeros({unit_table ? n : 0}, acc_options);
  PNN_DISPATCH_FLOATING_TYPES(R.scalar_type(), op, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t *r = R.data_ptr<scalar_t>(), *t = T.data_ptr<scalar_t>(), *g = g_in.data_ptr<scalar_t>();
    const int64_t* ix = id.data_ptr<int64_t>();
    acc_t* gr = grad_rows.data_ptr<acc_t>();
    acc_t* gt = grad_table.data_ptr<acc_t>();
    acc_t *sc = scale.data_ptr<acc_t>(), *rad = radial_sum.data_ptr<acc_t>();
    const scalar_t* yv = unit_table ? y.data_ptr<scalar_t>() : nullptr;
    const acc_t* sqv = unit_table ? sq.data_ptr<acc_t>() : nullptr;
    // the scale of (b, k): g, or with unit_table g / D (the first loop's, stored)
    auto scale_of = [&](int64_t e) PNN_INLINE_LAMBDA { return unit_table ? sc[e] : acc_t(g[e]); };
    if (unit_table) {
      // serial, so that each row's radial sum adds its terms in one fixed order
      for (int64_t e = 0; e < B * K; ++e) {
        const UnitDotBackward<acc_t> c = unit_dot_backward(acc_t(g[e]), acc_t(yv[e]), sqv[e]);
        sc[e] = c.scale;
        rad[ix[e]] += c.radial;
      }
    }
    // Both loops are element-wise multiply-adds over d (run_widest: AVX2 where the CPU has it, the same bits).
    // A zero grad[b, k] adds nothing, so its lookup and its prefetch are skipped: behind a hinge
    // (SimpleX's relu(cos - margin) over 2,000 negatives) all but about 1 in 10,000 entries are zero.
    // d/d rows[b] = sum_k s[b, k] table[ids[b, k]]: each task owns its rows
    at::parallel_for(0, B, lookup_grain(K * d), [&](int64_t begin, int64_t end) {
      run_widest([&]() PNN_INLINE_LAMBDA {
        for (int64_t b = begin; b < end; ++b) {
          acc_t* __restrict out = gr + b * d;
          std::fill(out, out + d, acc_t(0));
          for (int64_t k = 0; k < K; ++k) {
            const int64_t ahead = b * K + k + kPrefetchAhead;
            if (ahead < end * K && g[ahead] != scalar_t(0)) prefetch_row(t + ix[ahead] * d, d);
            if (g[b * K + k] == scalar_t(0)) continue;
            const acc_t s = scale_of(b * K + k);
            const scalar_t* __restrict v = t + ix[b * K + k] * d;
            for (int64_t i = 0; i < d; ++i) out[i] += s * acc_t(v[i]);
          }
        }
      });
    });
    // d/d table[j] = sum over (b, k) with ids[b, k] = j of s[b, k] rows[b]: scattered by column blocks
    for_column_blocks(d, B * K, [&](int64_t c0, int64_t c1) {
      run_widest([&]() PNN_INLINE_LAMBDA {
        for (int64_t b = 0; b < B; ++b) {
          const scalar_t* __restrict row = r + b * d;
          for (int64_t k = 0; k < K; ++k) {
            const int64_t ahead = b * K + k + kPrefetchAhead;
            if (ahead < B * K && g[ahead] != scalar_t(0)) prefetch_row(gt + ix[ahead] * d + c0, c1 - c0);
            if (g[b * K + k] == scalar_t(0)) continue;
            const acc_t s = scale_of(b * K + k);
            acc_t* __restrict out = gt + ix[b * K + k] * d;
            for (int64_t i = c0; i < c1; ++i) out[i] += s * acc_t(row[i]);
          }
        }
      });
    });
    if (unit_table) {  // less each row's radial sum times the row: one pass over the rows, none per (b, k)
      at::parallel_for(0, n, lookup_grain(d), [&](int64_t begin, int64_t end) {
        for (int64_t j = begin; j < end; ++j) {
          if (rad[j] == acc_t(0)) continue;
          const scalar_t* __restrict v = t + j * d;
          acc_t* __restrict out = gt + j * d;
          for (int64_t i = 0; i < d; ++i) out[i] -= rad[j] * acc_t(v[i]);
        }
      });
    }
  });
  return {grad_rows.to(R.scalar_type()), grad_table.to(T.scalar_type())};
}

}  // namespace
}  // namespace pnn_fast

TORCH_LIBRARY_IMPL(pnn_fast, CPU, m) {
  m.impl("gathered_dots_fwd", &pnn_fast::gathered_dots_fwd_cpu);
  m.impl("gathered_dots_bwd", &pnn_fast::gathered_dots_bwd_cpu);
}
