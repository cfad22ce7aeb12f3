// pnn_fast::pairwise_uniformity_fwd / _bwd on CPU.  Rows are processed in blocks of
// kBlockRows: the block's squared distances to all points come from the SIMD tiles (the
// difference form, exact at any scale), the exponentials from ATen's vectorised kernel, the
// maxima and sums from loops of fixed lane width, and the backward's weighted sums from a GEMM.
// Extra memory: the points tiled once (n d) and a [kBlockRows, n] block per task; no [n, n] buffer.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
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

// Lanes of a fixed width for the loops below: every instruction set adds in the same order.
constexpr int64_t kSumLanes = 16;

// sum_j v[j] over kSumLanes lanes, then the tail, then the lanes in order (inlined into the
// run_widest bodies, so that it vectorises with their instruction set).
template <typename acc_t>
inline __attribute__((always_inline)) acc_t lane_sum(const acc_t* v, int64_t n) {
  acc_t lanes[kSumLanes] = {};
  int64_t j = 0;
  for (; j + kSumLanes <= n; j += kSumLanes) {
    for (int64_t l = 0; l < kSumLanes; ++l) lanes[l] += v[j + l];
  }
  acc_t sum = 0;
  for (; j < n; ++j) sum += v[j];
  for (int64_t l = 0; l < kSumLanes; ++l) sum += lanes[l];
  return sum;
}

// max_j v[j] (-inf for none; a max is exact in any order).
template <typename acc_t>
inline __attribute__((always_inline)) acc_t lane_max(const acc_t* v, int64_t n) {
  acc_t lanes[kSumLanes];
  for (int64_t l = 0; l < kSumLanes; ++l) lanes[l] = neg_infinity<acc_t>();
  int64_t j = 0;
  for (; j + kSumLanes <= n; j += kSumLanes) {
    for (int64_t l = 0; l < kSumLanes; ++l) lanes[l] = v[j + l] > lanes[l] ? v[j + l] : lanes[l];
  }
  acc_t best = neg_infinity<acc_t>();
  for (; j < n; ++j) best = v[j] > best ? v[j] : best;
  for (int64_t l = 0; l < kSumLanes; ++l) best = lanes[l] > best ? lanes[l] : best;
  return best;
}

// w <- w * scale + shift over a block's rows [rows, columns] (row stride `stride`): one pass,
// where ATen's mul_ and sub_ made two and cost an op call each per block.
template <typename acc_t>
void scale_and_shift(acc_t* w, int64_t stride, int64_t rows, int64_t columns, acc_t scale, acc_t shift) {
  run_widest([&]() PNN_INLINE_LAMBDA {
    for (int64_t r = 0; r < rows; ++r) {
      acc_t* row = w + r * stride;  // locals: the closure's fields could alias the stores
      const acc_t a = scale, b = shift;
      const int64_t n = columns;
      for (int64_t j = 0; j < n; ++j) row[j] = row[j] * a + b;  // no FMA (-ffp-contract=off)
    }
  });
}

// A block's weights w [rows, columns] (columns j >= i0; row stride `stride`) added to the weight
// totals: each block row's sum to totals[r], and for the later columns j >= rows (rows of other
// blocks) each column's sum to totals[j].  Lanes of fixed width, so every instruction set adds in
// the same order and gives the same bits; in place of two ATen sums and adds a block.
template <typename acc_t>
void add_row_and_column_sums(const acc_t* w, int64_t stride, int64_t rows, int64_t columns, acc_t* totals) {
  run_widest([&]() PNN_INLINE_LAMBDA {
    const int64_t n = columns, block_rows = rows;
    acc_t* out = totals;
    for (int64_t r = 0; r < block_rows; ++r) out[r] += lane_sum(w + r * stride, n);
    for (int64_t r = 0; r < block_rows; ++r) {
      const acc_t* row = w + r * stride;
      for (int64_t j = block_rows; j < n; ++j) out[j] += row[j];
    }
  });
}

std::tuple<at::Tensor, at::Tensor> pairwise_uniformity_fwd_cpu(const at::Tensor& x, double t) {
  const at::Tensor points = prepare_points(kUniformityFwd, x, t);
  const int64_t n = points.size(0), d = points.size(1);
  if (n < 2) return empty_uniformity_outputs(x);
  const at::ScalarType acc_dtype = opmath_dtype(x.scalar_type());
  // Row i's log-sum-exp over the pairs (i, j > i): every unordered pair once, the loss counts
  // it twice.  Task p takes blocks p and nb-1-p, whose pair counts add up to about the same.
  at::Tensor row_lse = at::empty({n}, x.options().dtype(acc_dtype));
  const int64_t blocks = (n + kBlockRows - 1) / kBlockRows;
  PNN_DISPATCH_FLOATING_TYPES(points.scalar_type(), kUniformityFwd, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* p = points.data_ptr<scalar_t>();
    TiledVectors<acc_t> tiles;
    tiles.load(p, nullptr, n, d);
    const acc_t neg_t = static_cast<acc_t>(-t);
    parallel_blocks((blocks + 1) / 2, [&](int64_t begin, int64_t end) {
      at::Tensor logits = at::empty({kBlockRows, tiles.padded_count()}, x.options().dtype(acc_dtype));
      std::vector<acc_t> xi;
      const auto block_lse = [&](int64_t block) {
        const int64_t i0 = block * kBlockRows, rows = std::min(kBlockRows, n - i0);
        block_distances(tiles, p, d, i0, rows, i0 + 1, logits, xi);
        // only the columns j > i0 enter the log-sum-exp: the pairs j <= i left in them are the
        // block's own triangle, set to -inf (a whole row prefix of -inf would send most of the
        // exponentials down the vector exp's slow path for special values)
        // Each row's log-sum-exp as max + log(sum exp(l - max)): the max and the sums in plain
        // loops, the exponentials by one ATen call a block (in place of at::logsumexp, whose
        // passes and temporaries cost more than the exponentials at this size).
        acc_t* l = logits.data_ptr<acc_t>();
        const int64_t stride = logits.size(1);
        acc_t row_max[kBlockRows];
        run_widest([&]() PNN_INLINE_LAMBDA {
          for (int64_t r = 0; r < rows; ++r) {
            acc_t* row = l + r * stride;
            std::fill(row + i0 + 1, row + i0 + r + 1, neg_infinity<acc_t>());
            acc_t* pairs = row + i0 + r + 1;  // locals: the closure's fields could alias the stores
            const int64_t count = n - i0 - r - 1;
            const acc_t scale = neg_t;
            for (int64_t j = 0; j < count; ++j) pairs[j] *= scale;
            const acc_t top = lane_max(pairs, count);
            row_max[r] = top;
            // a row without pairs, or whose pairs are all -inf, stays -inf (exp gives 0)
            if (top != neg_infinity<acc_t>()) {
              for (int64_t j = 0; j < count; ++j) pairs[j] -= top;
            }
          }
        });
        logits.narrow(0, 0, rows).narrow(1, i0 + 1, n - i0 - 1).exp_();
        acc_t* lse = row_lse.data_ptr<acc_t>() + i0;
        run_widest([&]() PNN_INLINE_LAMBDA {
          for (int64_t r = 0; r < rows; ++r) {
            const acc_t sum = lane_sum(l + r * stride + i0 + r + 1, n - i0 - r - 1);
            lse[r] = row_max[r] == neg_infinity<acc_t>() ? row_max[r] : row_max[r] + std::log(sum);
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
  return uniformity_outputs(at::scalar_tensor(lse_value(total), rows.options()), 2.0, points);
}

at::Tensor pairwise_uniformity_bwd_cpu(const at::Tensor& grad, const at::Tensor& x, double t,
                                       const at::Tensor& total) {
  const at::Tensor points = prepare_points(kUniformityBwd, x, t);
  TORCH_CHECK(grad.numel() == 1 && total.numel() == 1, kUniformityBwd, ": grad and total must be scalars");
  const int64_t n = points.size(0), d = points.size(1);
  if (n < 2) return at::zeros_like(x);
  // d loss / d x_i = -4 t sum_{j != i} w_ij (x_i - x_j), w_ij = exp(l_ij - L): l_ij appears
  // in the ordered pairs (i, j) and (j, i), and d ||x_i - x_j||^2 / d x_i = 2 (x_i - x_j).
  // So grad_i = scale (x_i sum_j w_ij - (W X)_i).  W is symmetric, so each unordered pair is
  // weighed once, as in the forward: block I takes the columns j >= i0 (its own diagonal block
  // whole), adds W X to its rows and W^T X_I to the later columns.  Those rows belong to other
  // blocks, so each thread adds into its own [n, d] sums and [n] weight totals, added up at the
  // end (in thread order: the same bits for a given thread count).
  const double total_lse = total.item<double>();
  const double scale = grad.item<double>() * -4.0 * t;
  const at::ScalarType acc_dtype = opmath_dtype(x.scalar_type());
  const at::Tensor x_acc = points.to(acc_dtype).contiguous();
  const int64_t threads = at::get_num_threads();
  at::Tensor weighted = at::zeros({threads, n, d}, x_acc.options());
  at::Tensor weight_totals = at::zeros({threads, n}, x_acc.options());
  const int64_t blocks = (n + kBlockRows - 1) / kBlockRows;
  PNN_DISPATCH_FLOATING_TYPES(points.scalar_type(), kUniformityBwd, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* p = points.data_ptr<scalar_t>();
    TiledVectors<acc_t> tiles;
    tiles.load(p, nullptr, n, d);
    // task p takes blocks p and blocks-1-p, whose column counts add up to about the same
    parallel_blocks((blocks + 1) / 2, [&](int64_t begin, int64_t end) {
      at::Tensor weights = at::empty({kBlockRows, tiles.padded_count()}, x_acc.options());
      const at::Tensor my_weighted = weighted[at::get_thread_num()];
      const at::Tensor my_totals = weight_totals[at::get_thread_num()];
      std::vector<acc_t> xi;
      const auto block_grad = [&](int64_t block) {
        const int64_t i0 = block * kBlockRows, rows = std::min(kBlockRows, n - i0), later = n - i0 - rows;
        block_distances(tiles, p, d, i0, rows, i0, weights, xi);
        at::Tensor w = weights.narrow(0, 0, rows).narrow(1, i0, n - i0);
        acc_t* w_rows = weights.data_ptr<acc_t>() + i0;
        const int64_t stride = weights.size(1), columns = n - i0;
        scale_and_shift(w_rows, stride, rows, columns, static_cast<acc_t>(-t), static_cast<acc_t>(-total_lse));
        w.exp_();
        for (int64_t r = 0; r < rows; ++r) w_rows[r * stride + r] = acc_t(0);  // no pair (i, i)
        my_weighted.narrow(0, i0, rows).addmm_(w, x_acc.narrow(0, i0, n - i0));
        add_row_and_column_sums(w_rows, stride, rows, columns, my_totals.data_ptr<acc_t>() + i0);
        if (later == 0) return;
        const at::Tensor w_later = w.narrow(1, rows, later);
        my_weighted.narrow(0, i0 + rows, later).addmm_(w_later.t(), x_acc.narrow(0, i0, rows));
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

}  // namespace
}  // namespace pnn_fast

TORCH_LIBRARY_IMPL(pnn_fast, CPU, m) {
  m.impl("pairwise_uniformity_fwd", &pnn_fast::pairwise_uniformity_fwd_cpu);
  m.impl("pairwise_uniformity_bwd", &pnn_fast::pairwise_uniformity_bwd_cpu);
}
