// pnn_fast::masked_logsumexp_fwd / _bwd on CPU: each row's log-sum-exp of scale x - shift over the
// entries not excluded, and its backward, reading [B, M] once each way.  Autograd's composition
// (the division by the temperature, the shift, two masked fills, then logsumexp's own passes, and
// all their backwards) made about fifteen passes over [B, M] buffers, which were most of a
// shared-pool softmax step.  Rows go in blocks whose logits stay in cache: written once, their
// largest found, their exponentials taken by one vectorised ATen call, then summed in fixed lanes.
// Rows are independent, so the result does not depend on the thread count.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/exp.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <optional>
#include <type_traits>

#include "common/checks.h"
#include "common/dispatch.h"
#include "cpu/simd.h"

namespace pnn_fast {
namespace {

// Entries a block of rows holds (acc_t each, 256 KB of float): within L2, so that the passes over
// a block after the first read it from cache.
constexpr int64_t kBlockEntries = 1 << 16;

int64_t rows_per_block(int64_t columns) { return std::max<int64_t>(1, kBlockEntries / std::max<int64_t>(1, columns)); }

// Writes rows [first, first + rows) of the logits into `out` (row stride M): masked_logit less the
// row's lse_offset, the row's largest logit into largest[r].  Then the caller's exp_.  The kept
// logits and the exclusions go in separate loops, each of which vectorises (one loop choosing per
// entry ran four times slower).
template <typename scalar_t, typename acc_t>
void offset_logits(const MaskedLogsumexpInputs& in, acc_t scale, int64_t first, int64_t rows, acc_t* out,
                   acc_t* largest) {
  const int64_t M = in.x.size(1);
  const scalar_t* X = in.x.const_data_ptr<scalar_t>() + first * M;
  const scalar_t* shift = in.shift.defined() ? in.shift.const_data_ptr<scalar_t>() : nullptr;
  const bool* excluded = in.excluded.defined() ? in.excluded.const_data_ptr<bool>() + first * M : nullptr;
  run_widest([&]() PNN_INLINE_LAMBDA {
    for (int64_t r = 0; r < rows; ++r) {
      acc_t* row = out + r * M;
      const bool* skip = excluded ? excluded + r * M : nullptr;
      const scalar_t* x = X + r * M;
      if (shift) {
        for (int64_t j = 0; j < M; ++j) row[j] = kept_logit(x[j], scale, acc_t(shift[j]));
      } else {
        for (int64_t j = 0; j < M; ++j) row[j] = kept_logit(x[j], scale, acc_t(0));
      }
      if (skip) {
        for (int64_t j = 0; j < M; ++j) row[j] = skip[j] ? neg_infinity<acc_t>() : row[j];
      }
      largest[r] = lane_max(row, M);
      const acc_t offset = lse_offset(largest[r]);
      for (int64_t j = 0; j < M; ++j) row[j] -= offset;
    }
  });
}

at::Tensor masked_logsumexp_fwd_cpu(const at::Tensor& x, double scale, const std::optional<at::Tensor>& shift,
                                    const std::optional<at::Tensor>& excluded) {
  constexpr const char* op = "pnn_fast::masked_logsumexp_fwd";
  const MaskedLogsumexpInputs in = prepare_masked_logsumexp(op, x, scale, shift, excluded);
  const int64_t B = in.x.size(0), M = in.x.size(1);
  // in the accumulation dtype: the backward's exp(l - lse) reads it, and a half or bfloat16 rounding
  // of lse would move every gradient of the row by up to about 1%
  at::Tensor out = at::empty({B}, in.x.options().dtype(opmath_dtype(in.x.scalar_type())));
  const int64_t block_rows = rows_per_block(M);
  PNN_DISPATCH_FLOATING_TYPES(in.x.scalar_type(), op, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    acc_t* lse = out.data_ptr<acc_t>();
    at::parallel_for(0, B, block_rows, [&](int64_t begin, int64_t end) {
      at::Tensor block = at::empty({std::min(block_rows, end - begin), M}, in.x.options().dtype(opmath_dtype(in.x.scalar_type())));
      std::vector<acc_t> largest(block.size(0));
      for (int64_t first = begin; first < end; first += block_rows) {
        const int64_t rows = std::min(block_rows, end - first);
        acc_t* logits = block.data_ptr<acc_t>();
        offset_logits<scalar_t, acc_t>(in, acc_t(scale), first, rows, logits, largest.data());
        block.narrow(0, 0, rows).exp_();
        run_widest([&]() PNN_INLINE_LAMBDA {
          for (int64_t r = 0; r < rows; ++r) {
            lse[first + r] = masked_lse(largest[r], lane_sum(logits + r * M, M));
          }
        });
      }
    });
  });
  return out;
}

at::Tensor masked_logsumexp_bwd_cpu(const at::Tensor& grad, const at::Tensor& x, double scale,
                                    const std::optional<at::Tensor>& shift, const std::optional<at::Tensor>& excluded,
                                    const at::Tensor& lse) {
  constexpr const char* op = "pnn_fast::masked_logsumexp_bwd";
  const MaskedLogsumexpInputs in = prepare_masked_logsumexp_bwd(op, grad, x, scale, shift, excluded, lse);
  const int64_t B = in.x.size(0), M = in.x.size(1);
  const at::Tensor g_in = grad.contiguous(), lse_in = lse.contiguous();
  at::Tensor grad_x = at::empty({B, M}, in.x.options());
  const int64_t block_rows = rows_per_block(M);
  PNN_DISPATCH_FLOATING_TYPES(in.x.scalar_type(), op, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    constexpr bool in_place = std::is_same_v<scalar_t, acc_t>;  // the exponentials go straight to grad_x
    const acc_t* G = g_in.const_data_ptr<acc_t>();
    const acc_t* L = lse_in.const_data_ptr<acc_t>();
    const bool* skip = in.excluded.defined() ? in.excluded.const_data_ptr<bool>() : nullptr;
    scalar_t* out = grad_x.data_ptr<scalar_t>();
    at::parallel_for(0, B, block_rows, [&](int64_t begin, int64_t end) {
      at::Tensor scratch;
      if constexpr (!in_place) {
        scratch = at::empty({std::min(block_rows, end - begin), M}, in.x.options().dtype(opmath_dtype(in.x.scalar_type())));
      }
      std::vector<acc_t> largest(std::min(block_rows, end - begin));
      for (int64_t first = begin; first < end; first += block_rows) {
        const int64_t rows = std::min(block_rows, end - first);
        at::Tensor block = in_place ? grad_x.narrow(0, first, rows) : scratch.narrow(0, 0, rows);
        acc_t* p = block.data_ptr<acc_t>();
        // exp(l - lse) = exp((l - offset) - (lse - offset)): the forward's offset logits, less lse - offset
        offset_logits<scalar_t, acc_t>(in, acc_t(scale), first, rows, p, largest.data());
        run_widest([&]() PNN_INLINE_LAMBDA {
          for (int64_t r = 0; r < rows; ++r) {
            const acc_t shift_by = L[first + r] - lse_offset(largest[r]);
            for (int64_t j = 0; j < M; ++j) p[r * M + j] -= shift_by;
          }
        });
        block.exp_();
        run_widest([&]() PNN_INLINE_LAMBDA {
          for (int64_t r = 0; r < rows; ++r) {
            const acc_t dy_scale = G[first + r] * acc_t(scale);
            const bool* row_skip = skip ? skip + (first + r) * M : nullptr;
            scalar_t* row_out = out + (first + r) * M;
            const acc_t* row_p = p + r * M;
            for (int64_t j = 0; j < M; ++j) row_out[j] = static_cast<scalar_t>(dy_scale * row_p[j]);
            if (row_skip) {  // exactly 0, whatever exp gave (a NaN where lse is -inf)
              for (int64_t j = 0; j < M; ++j) row_out[j] = row_skip[j] ? scalar_t(0) : row_out[j];
            }
          }
        });
      }
    });
  });
  return grad_x;
}

}  // namespace
}  // namespace pnn_fast

TORCH_LIBRARY_IMPL(pnn_fast, CPU, m) {
  m.impl("masked_logsumexp_fwd", &pnn_fast::masked_logsumexp_fwd_cpu);
  m.impl("masked_logsumexp_bwd", &pnn_fast::masked_logsumexp_bwd_cpu);
}
