// pnn_fast::pairwise_uniformity_fwd / _bwd on CPU.  Rows are processed in blocks of
// kBlockRows: the block's squared distances to the later points come from the SIMD tiles (the
// difference form, exact at any scale), the exponentials from ATen's vectorised kernel, the
// maxima and sums from loops of fixed lane width, and the backward's weighted sums from GEMMs.
// Each unordered pair is taken once, as row i's pair (i, j > i).  Extra memory: the points tiled
// once (n d), a [kBlockRows, n] block per task, and, when the caller asks for it, the forward's
// n (n - 1) / 2 exponentials kept for the backward (which otherwise computes them again).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/nonzero.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/checks.h"
#include "common/dispatch.h"
#include "common/uniformity.h"
#include "cpu/cpu_rows.h"

namespace pnn_fast {
namespace {

constexpr int64_t kBlockRows = 32;

// The blocks call ATen ops from at::parallel_for's worker threads, which start with the default
// thread-local state (grad mode on, autograd keys dispatched), not the caller's (below autograd):
// on x that requires grad (float64, where x_acc is x) the workers would record a graph into the
// returned gradient, or fail an in-place check.  Each task runs under the caller's state instead.
template <typename Body>
void parallel_blocks(int64_t tasks, const Body& body) {
  const at::ThreadLocalState caller_state;
  at::parallel_for(0, tasks, 1, [&](int64_t begin, int64_t end) {
    const at::ThreadLocalStateGuard same_state(caller_state);
    body(begin, end);
  });
}

// Squared distances of points [i0, i0 + rows) to the points j >= first (earlier columns are
// left unspecified): row r of `dist`, a [kBlockRows, padded n] acc_t tensor.  The block's rows
// share each pass over the tiles.
template <typename scalar_t, typename acc_t>
void block_distances(const TiledVectors<acc_t>& tiles, const scalar_t* points, int64_t d, int64_t i0, int64_t rows,
                     int64_t first, at::Tensor& dist, std::vector<acc_t>& xi) {
  acc_t* out = dist.data_ptr<acc_t>();
  xi.resize(rows * d);
  const acc_t* row_points[kBlockRows];
  acc_t* row_out[kBlockRows];
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t k = 0; k < d; ++k) xi[r * d + k] = acc_t(points[(i0 + r) * d + k]);
    row_points[r] = xi.data() + r * d;
    row_out[r] = out + r * dist.size(1);
  }
  tiles.lane_sums_rows(row_points, rows, SquaredDiffTerm{}, row_out, first);
}

// Entries of the strict upper triangle before row i, packed row after row: row i holds its pairs
// (i, j > i), n - 1 - i of them.
inline int64_t triangle_offset(int64_t n, int64_t i) { return i * (2 * n - i - 1) / 2; }

// One block's pair exponentials.  For rows i in [i0, i0 + rows): l_ij = -t ||x_i - x_j||^2 over
// j > i, m_i = max_j l_ij (-inf for a row without pairs, or whose pairs are all -inf), and
// exp(l_ij - m_i) packed row after row into `out` (triangle_offset(n, i0 + rows) -
// triangle_offset(n, i0) entries of a contiguous acc_t tensor; 0 where m_i is -inf).  The maxima in
// plain loops, the exponentials by one ATen call a block (at::logsumexp's passes and temporaries
// cost more than the exponentials at this size).  The forward and the backward's recomputation
// both come here, so saved and recomputed exponentials have the same bits.
template <typename scalar_t, typename acc_t>
void block_exponentials(const TiledVectors<acc_t>& tiles, const scalar_t* points, int64_t n, int64_t d, int64_t i0,
                        int64_t rows, acc_t neg_t, at::Tensor& dist, std::vector<acc_t>& xi, at::Tensor out,
                        acc_t* row_max) {
  block_distances(tiles, points, d, i0, rows, i0 + 1, dist, xi);
  const acc_t* distances = dist.data_ptr<acc_t>();
  const int64_t stride = dist.size(1);
  acc_t* packed = out.data_ptr<acc_t>();
  run_widest([&]() PNN_INLINE_LAMBDA {
    acc_t* row_out = packed;  // locals: the closure's fields could alias the stores
    for (int64_t r = 0; r < rows; ++r) {
      const acc_t* row = distances + r * stride + i0 + r + 1;
      const int64_t count = n - i0 - r - 1;
      const acc_t scale = neg_t;
      for (int64_t j = 0; j < count; ++j) row_out[j] = row[j] * scale;
      const acc_t top = lane_max(row_out, count);
      row_max[r] = top;
      if (top != neg_infinity<acc_t>()) {  // else exp(-inf) gives the row's zeros
        for (int64_t j = 0; j < count; ++j) row_out[j] -= top;
      }
      row_out += count;
    }
  });
  out.exp_();
}

// A block's pair weights W [rows, columns] (row r holds the pairs of point i0 + r with the points
// i0 + 1 + c; row stride `stride`) added to the weight totals: each row's sum to row_totals[r],
// each column's sum to column_totals[c].  Lanes of fixed width, so every instruction set adds in
// the same order and gives the same bits.
template <typename acc_t>
void add_weight_sums(const acc_t* w, int64_t stride, int64_t rows, int64_t columns, acc_t* row_totals,
                     acc_t* column_totals) {
  run_widest([&]() PNN_INLINE_LAMBDA {
    const int64_t n = columns, block_rows = rows;
    acc_t* by_row = row_totals;  // locals: the closure's fields could alias the stores
    acc_t* by_column = column_totals;
    for (int64_t r = 0; r < block_rows; ++r) by_row[r] += lane_sum(w + r * stride, n);
    for (int64_t r = 0; r < block_rows; ++r) {
      const acc_t* row = w + r * stride;
      for (int64_t c = 0; c < n; ++c) by_column[c] += row[c];
    }
  });
}

// The forward over all rows of x; the saved tensors are sized for saved_rows >= n rows (the rows of
// the op's x, of which these may be the kept ones), this x's in their prefix.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> uniformity_fwd_points(const at::Tensor& x, double t,
                                                                                 bool save, int64_t saved_rows) {
  const at::Tensor points = prepare_points(kUniformityFwd, x, t);
  const int64_t n = points.size(0), d = points.size(1);
  const at::TensorOptions acc_options = x.options().dtype(opmath_dtype(x.scalar_type()));
  if (n < 2) {
    const auto [value, total] = empty_uniformity_outputs(x);
    return {value, total, at::zeros({save ? saved_rows : 0}, acc_options),
            at::zeros({save ? triangle_offset(saved_rows, saved_rows) : 0}, acc_options)};
  }
  // Row i's log-sum-exp over its pairs (i, j > i): every unordered pair once, the loss counts it
  // twice.  Task p takes blocks p and nb-1-p, whose pair counts add up to about the same.
  at::Tensor row_lse = at::empty({n}, acc_options);
  at::Tensor row_max = at::empty({save ? saved_rows : n}, acc_options);
  at::Tensor saved = at::empty({save ? triangle_offset(saved_rows, saved_rows) : 0}, acc_options);
  if (save && saved_rows > n) {  // the entries past this x's: zeros, so that the outputs are deterministic
    row_max.narrow(0, n, saved_rows - n).zero_();
    saved.narrow(0, triangle_offset(n, n), saved.numel() - triangle_offset(n, n)).zero_();
  }
  const int64_t blocks = (n + kBlockRows - 1) / kBlockRows;
  PNN_DISPATCH_FLOATING_TYPES(points.scalar_type(), kUniformityFwd, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* p = points.data_ptr<scalar_t>();
    TiledVectors<acc_t> tiles;
    tiles.load(p, nullptr, n, d);
    const acc_t neg_t = static_cast<acc_t>(-t);
    parallel_blocks((blocks + 1) / 2, [&](int64_t begin, int64_t end) {
      at::Tensor dist = at::empty({kBlockRows, tiles.padded_count()}, acc_options);
      at::Tensor scratch = save ? at::Tensor() : at::empty({kBlockRows * (n - 1)}, acc_options);
      std::vector<acc_t> xi;
      const auto block_lse = [&](int64_t block) {
        const int64_t i0 = block * kBlockRows, rows = std::min(kBlockRows, n - i0);
        const int64_t first = triangle_offset(n, i0), entries = triangle_offset(n, i0 + rows) - first;
        const at::Tensor exps = save ? saved.narrow(0, first, entries) : scratch.narrow(0, 0, entries);
        acc_t* top = row_max.data_ptr<acc_t>() + i0;
        block_exponentials(tiles, p, n, d, i0, rows, neg_t, dist, xi, exps, top);
        // each row's log-sum-exp as m_i + log(sum_j exp(l_ij - m_i))
        const acc_t* e = exps.data_ptr<acc_t>();
        acc_t* lse = row_lse.data_ptr<acc_t>() + i0;
        run_widest([&]() PNN_INLINE_LAMBDA {
          const acc_t* row = e;
          for (int64_t r = 0; r < rows; ++r) {
            const int64_t count = n - i0 - r - 1;
            const acc_t sum = lane_sum(row, count);
            lse[r] = top[r] == neg_infinity<acc_t>() ? top[r] : top[r] + std::log(sum);
            row += count;
          }
        });
      };
      for (int64_t task = begin; task < end; ++task) {
        block_lse(task);
        if (blocks - 1 - task != task) block_lse(blocks - 1 - task);
      }
    });
  });
  // merge the rows in float64, by the same log-sum-exp step as the CUDA block reduction
  const at::Tensor rows = row_lse.to(at::kDouble).contiguous();
  LogSumExp<double> total = lse_empty<double>();
  for (int64_t i = 0; i < n; ++i) lse_add(total, rows.data_ptr<double>()[i]);
  const auto [value, ordered_total] =
      uniformity_outputs(at::scalar_tensor(lse_value(total), rows.options()), 2.0, points);
  return {value, ordered_total, save ? row_max : at::empty({0}, acc_options), saved};
}

at::Tensor uniformity_bwd_points(const at::Tensor& grad, const at::Tensor& x, double t, const at::Tensor& total,
                                 const at::Tensor& saved_row_max, const at::Tensor& saved_exps) {
  const at::Tensor points = prepare_points(kUniformityBwd, x, t);
  TORCH_CHECK(grad.numel() == 1 && total.numel() == 1, kUniformityBwd, ": grad and total must be scalars");
  const int64_t n = points.size(0), d = points.size(1);
  const at::ScalarType acc_dtype = opmath_dtype(x.scalar_type());
  const bool saved = saved_exps.numel() > 0;
  TORCH_CHECK(!saved || (saved_exps.numel() == triangle_offset(n, n) && saved_row_max.numel() == n &&
                         saved_exps.scalar_type() == acc_dtype && saved_row_max.scalar_type() == acc_dtype &&
                         saved_exps.is_contiguous() && saved_row_max.is_contiguous()),
              kUniformityBwd, ": saved_row_max and saved_exps must be the forward's (", acc_dtype, " [", n, "] and [",
              triangle_offset(n, n), "]), got ", saved_row_max.scalar_type(), " ", saved_row_max.sizes(), " and ",
              saved_exps.scalar_type(), " ", saved_exps.sizes());
  if (n < 2) return at::zeros_like(x);
  // d loss / d x_i = -4 t sum_{j != i} w_ij (x_i - x_j), w_ij = exp(l_ij - L): l_ij appears
  // in the ordered pairs (i, j) and (j, i), and d ||x_i - x_j||^2 / d x_i = 2 (x_i - x_j).
  // So grad_i = scale (x_i sum_j w_ij - (W X)_i), with W = U + U^T for U the pairs j > i, which
  // the forward packed as exp(l_ij - m_i): w_ij = exp(l_ij - m_i) exp(m_i - L).  Block I adds
  // U_I X to its rows and U_I^T X_I to the later rows, which belong to other blocks, so each
  // thread adds into its own [n, d] sums and [n] weight totals, added up at the end (in thread
  // order: the same bits for a given thread count).
  const double total_lse = total.item<double>();
  const double scale = grad.item<double>() * -4.0 * t;
  const at::Tensor x_acc = points.to(acc_dtype).contiguous();
  const int64_t threads = at::get_num_threads();
  at::Tensor weighted = at::zeros({threads, n, d}, x_acc.options());
  at::Tensor weight_totals = at::zeros({threads, n}, x_acc.options());
  const int64_t blocks = (n + kBlockRows - 1) / kBlockRows;
  PNN_DISPATCH_FLOATING_TYPES(points.scalar_type(), kUniformityBwd, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* p = points.data_ptr<scalar_t>();
    TiledVectors<acc_t> tiles;
    if (!saved) tiles.load(p, nullptr, n, d);
    // task p takes blocks p and blocks-1-p, whose pair counts add up to about the same
    parallel_blocks((blocks + 1) / 2, [&](int64_t begin, int64_t end) {
      at::Tensor weights = at::empty({kBlockRows, n - 1}, x_acc.options());
      at::Tensor dist = saved ? at::Tensor() : at::empty({kBlockRows, tiles.padded_count()}, x_acc.options());
      at::Tensor scratch = saved ? at::Tensor() : at::empty({kBlockRows * (n - 1)}, x_acc.options());
      const at::Tensor my_weighted = weighted[at::get_thread_num()];
      acc_t* my_totals = weight_totals[at::get_thread_num()].data_ptr<acc_t>();
      std::vector<acc_t> xi;
      acc_t recomputed_max[kBlockRows];
      const auto block_grad = [&](int64_t block) {
        const int64_t i0 = block * kBlockRows, rows = std::min(kBlockRows, n - i0), columns = n - i0 - 1;
        if (columns == 0) return;  // the last point alone: its pairs are in earlier blocks
        const int64_t first = triangle_offset(n, i0);
        const acc_t* exps;
        const acc_t* row_max;
        if (saved) {
          exps = saved_exps.data_ptr<acc_t>() + first;
          row_max = saved_row_max.data_ptr<acc_t>() + i0;
        } else {
          const at::Tensor out = scratch.narrow(0, 0, triangle_offset(n, i0 + rows) - first);
          block_exponentials(tiles, p, n, d, i0, rows, static_cast<acc_t>(-t), dist, xi, out, recomputed_max);
          exps = out.data_ptr<acc_t>();
          row_max = recomputed_max;
        }
        // U_I [rows, columns], column c the point i0 + 1 + c: zero up to the diagonal, then the
        // row's packed exponentials times exp(m_i - L)
        acc_t* w = weights.data_ptr<acc_t>();
        const int64_t stride = weights.size(1);
        acc_t factors[kBlockRows];
        for (int64_t r = 0; r < rows; ++r) {
          factors[r] = static_cast<acc_t>(std::exp(static_cast<double>(row_max[r]) - total_lse));
        }
        run_widest([&]() PNN_INLINE_LAMBDA {
          const acc_t* row = exps;  // locals: the closure's fields could alias the stores
          for (int64_t r = 0; r < rows; ++r) {
            acc_t* out = w + r * stride;
            for (int64_t c = 0; c < r; ++c) out[c] = acc_t(0);
            acc_t* pairs = out + r;
            const acc_t f = factors[r];
            const int64_t count = n - i0 - r - 1;
            for (int64_t j = 0; j < count; ++j) pairs[j] = row[j] * f;
            row += count;
          }
        });
        const at::Tensor u = weights.narrow(0, 0, rows).narrow(1, 0, columns);
        my_weighted.narrow(0, i0, rows).addmm_(u, x_acc.narrow(0, i0 + 1, columns));
        my_weighted.narrow(0, i0 + 1, columns).addmm_(u.t(), x_acc.narrow(0, i0, rows));
        add_weight_sums(w, stride, rows, columns, my_totals + i0, my_totals + i0 + 1);
      };
      for (int64_t task = begin; task < end; ++task) {
        block_grad(task);
        if (blocks - 1 - task != task) block_grad(blocks - 1 - task);
      }
    });
  });
  const at::Tensor grad_x = (x_acc * weight_totals.sum(0).unsqueeze(1) - weighted.sum(0)).mul_(scale);
  return grad_x.to(x.scalar_type());
}

// With keep, the kept rows are selected on the host (CPU memory: no synchronisation) and the
// forward and backward run on them; the saved tensors keep the sizes of all of x's rows (those of
// the fake kernel), the kept rows' in their prefix.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> pairwise_uniformity_fwd_cpu(
    const at::Tensor& x, double t, bool save, const c10::optional<at::Tensor>& keep) {
  const c10::optional<at::Tensor> kept = prepare_keep(kUniformityFwd, x, keep);
  if (!kept) return uniformity_fwd_points(x, t, save, x.size(0));
  return uniformity_fwd_points(x.index_select(0, kept->nonzero().squeeze(1)), t, save, x.size(0));
}

at::Tensor pairwise_uniformity_bwd_cpu(const at::Tensor& grad, const at::Tensor& x, double t, const at::Tensor& total,
                                       const at::Tensor& saved_row_max, const at::Tensor& saved_exps,
                                       const c10::optional<at::Tensor>& keep) {
  const c10::optional<at::Tensor> kept = prepare_keep(kUniformityBwd, x, keep);
  if (!kept) return uniformity_bwd_points(grad, x, t, total, saved_row_max, saved_exps);
  const at::Tensor rows = kept->nonzero().squeeze(1);
  const int64_t n = rows.numel(), all = x.size(0);
  const bool saved = saved_exps.numel() > 0;
  TORCH_CHECK(!saved || (saved_row_max.numel() == all && saved_exps.numel() == triangle_offset(all, all)),
              kUniformityBwd, ": saved_row_max and saved_exps must be the forward's ([", all, "] and [",
              triangle_offset(all, all), "]), got ", saved_row_max.sizes(), " and ", saved_exps.sizes());
  const at::Tensor grad_kept = uniformity_bwd_points(
      grad, x.index_select(0, rows), t, total, saved ? saved_row_max.narrow(0, 0, n) : saved_row_max,
      saved ? saved_exps.narrow(0, 0, triangle_offset(n, n)) : saved_exps);
  return at::zeros_like(x).index_copy_(0, rows, grad_kept);
}

}  // namespace
}  // namespace pnn_fast

TORCH_LIBRARY_IMPL(pnn_fast, CPU, m) {
  m.impl("pairwise_uniformity_fwd", &pnn_fast::pairwise_uniformity_fwd_cpu);
  m.impl("pairwise_uniformity_bwd", &pnn_fast::pairwise_uniformity_bwd_cpu);
}
