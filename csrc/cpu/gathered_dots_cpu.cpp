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

at::Tensor gathered_dots_fwd_cpu(const at::Tensor& rows, const at::Tensor& table, const at::Tensor& ids,
                                 bool unit_table) {
  constexpr const char* op = "pnn_fast::gathered_dots_fwd";
  check_gathered_dots(op, rows, table, ids);
  const at::Tensor R = rows.contiguous(), T = table.contiguous(), id = ids_in_range(op, ids, T.size(0), "ids");
  const int64_t B = R.size(0), d = R.size(1), K = id.size(1);
  at::Tensor out = at::empty({B, K}, R.options());
  PNN_DISPATCH_FLOATING_TYPES(R.scalar_type(), op, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t *r = R.data_ptr<scalar_t>(), *t = T.data_ptr<scalar_t>();
    const int64_t* ix = id.data_ptr<int64_t>();
    scalar_t* o = out.data_ptr<scalar_t>();
    // dot_wide's 8 lanes are 8 chains of multiplies and adds: one AVX2 register where the CPU has it
    at::parallel_for(0, B, lookup_grain(K * d), [&](int64_t begin, int64_t end) {
      run_widest([&]() PNN_INLINE_LAMBDA {
        for (int64_t b = begin; b < end; ++b) {
          for (int64_t k = 0; k < K; ++k) {
            if (b * K + k + kPrefetchAhead < end * K) prefetch_row(t + ix[b * K + k + kPrefetchAhead] * d, d);
            const scalar_t* v = t + ix[b * K + k] * d;
            // v is in L1 after the first product, so its squared norm costs no memory traffic
            const acc_t dot = dot_wide<acc_t>(r + b * d, v, d);
            o[b * K + k] = static_cast<scalar_t>(unit_table ? unit_dot(dot, dot_wide<acc_t>(v, v, d)) : dot);
          }
        }
      });
    });
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> gathered_dots_bwd_cpu(const at::Tensor& grad, const at::Tensor& rows,
                                                         const at::Tensor& table, const at::Tensor& ids,
                                                         bool unit_table) {
  constexpr const char* op = "pnn_fast::gathered_dots_bwd";
  check_gathered_dots(op, rows, table, ids);
  const at::Tensor R = rows.contiguous(), T = table.contiguous(), id = ids_in_range(op, ids, T.size(0), "ids");
  const int64_t B = R.size(0), d = R.size(1), K = id.size(1);
  check_tensor(op, R, grad, "grad", R.scalar_type(), {B, K}, "rows");
  const at::Tensor g_in = grad.contiguous();
  const at::TensorOptions acc_options = R.options().dtype(opmath_dtype(R.scalar_type()));
  at::Tensor grad_rows = at::empty({B, d}, acc_options);
  at::Tensor grad_table = at::zeros(T.sizes(), acc_options);
  // with unit_table, each (b, k)'s UnitDotBackward, found by the first loop for the second
  at::Tensor scale = at::empty({unit_table ? B * K : 0}, acc_options), radial = at::empty_like(scale);
  PNN_DISPATCH_FLOATING_TYPES(R.scalar_type(), op, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t *r = R.data_ptr<scalar_t>(), *t = T.data_ptr<scalar_t>(), *g = g_in.data_ptr<scalar_t>();
    const int64_t* ix = id.data_ptr<int64_t>();
    acc_t* gr = grad_rows.data_ptr<acc_t>();
    acc_t* gt = grad_table.data_ptr<acc_t>();
    acc_t *sc = scale.data_ptr<acc_t>(), *ra = radial.data_ptr<acc_t>();
    // Both loops are element-wise multiply-adds over d (run_widest: AVX2 where the CPU has it, the same bits).
    // A zero grad[b, k] adds nothing, so its lookup and its prefetch are skipped: behind a hinge
    // (SimpleX's relu(cos - margin) over 2,000 negatives) all but about 1 in 10,000 entries are zero.
    // d/d rows[b] = sum_k s[b, k] table[ids[b, k]], s = g or, with unit_table, g / D: each task owns its rows
    at::parallel_for(0, B, lookup_grain(K * d), [&](int64_t begin, int64_t end) {
      run_widest([&]() PNN_INLINE_LAMBDA {
        for (int64_t b = begin; b < end; ++b) {
          acc_t* __restrict out = gr + b * d;
          std::fill(out, out + d, acc_t(0));
          for (int64_t k = 0; k < K; ++k) {
            const int64_t ahead = b * K + k + kPrefetchAhead;
            if (ahead < end * K && g[ahead] != scalar_t(0)) prefetch_row(t + ix[ahead] * d, d);
            acc_t s = acc_t(g[b * K + k]);
            if (s == acc_t(0)) {
              if (unit_table) sc[b * K + k] = ra[b * K + k] = acc_t(0);
              continue;
            }
            const scalar_t* __restrict v = t + ix[b * K + k] * d;
            if (unit_table) {
              const UnitDotBackward<acc_t> c = unit_dot_backward(s, dot_wide<acc_t>(r + b * d, v, d),
                                                                 dot_wide<acc_t>(v, v, d));
              s = sc[b * K + k] = c.scale;
              ra[b * K + k] = c.radial;
            }
            for (int64_t i = 0; i < d; ++i) out[i] += s * acc_t(v[i]);
          }
        }
      });
    });
    // d/d table[j] = sum over (b, k) with ids[b, k] = j of s[b, k] rows[b] (less radial[b, k] table[j]
    // with unit_table): scattered by column blocks
    for_column_blocks(d, B * K, [&](int64_t c0, int64_t c1) {
      run_widest([&]() PNN_INLINE_LAMBDA {
        for (int64_t b = 0; b < B; ++b) {
          const scalar_t* __restrict row = r + b * d;
          for (int64_t k = 0; k < K; ++k) {
            const int64_t ahead = b * K + k + kPrefetchAhead;
            if (ahead < B * K && g[ahead] != scalar_t(0)) {
              prefetch_row(gt + ix[ahead] * d + c0, c1 - c0);
              if (unit_table) prefetch_row(t + ix[ahead] * d + c0, c1 - c0);
            }
            if (g[b * K + k] == scalar_t(0)) continue;
            acc_t* __restrict out = gt + ix[b * K + k] * d;
            if (unit_table) {
              const acc_t s = sc[b * K + k], rad = ra[b * K + k];
              const scalar_t* __restrict v = t + ix[b * K + k] * d;
              for (int64_t i = c0; i < c1; ++i) out[i] += s * acc_t(row[i]) - rad * acc_t(v[i]);
            } else {
              const acc_t s = acc_t(g[b * K + k]);
              for (int64_t i = c0; i < c1; ++i) out[i] += s * acc_t(row[i]);
            }
          }
        }
      });
    });
  });
  return {grad_rows.to(R.scalar_type()), grad_table.to(T.scalar_type())};
}

}  // namespace
}  // namespace pnn_fast

TORCH_LIBRARY_IMPL(pnn_fast, CPU, m) {
  m.impl("gathered_dots_fwd", &pnn_fast::gathered_dots_fwd_cpu);
  m.impl("gathered_dots_bwd", &pnn_fast::gathered_dots_bwd_cpu);
}
