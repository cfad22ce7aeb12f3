// pnn_fast::pairwise_uniformity_fwd / _bwd on CUDA, one block per point i.
//
// The squared distances come from for_each_chain_tile (cuda_rows.cuh), a tile of points at a time:
// pnn_rows.h's SquaredDiffTerm chain, so the CPU's bits.
// Forward: each thread runs a streaming log-sum-exp over its strided share of the j != i and
// the block merges them (pnn_rows.h lse_merge); at::logsumexp merges the rows in float64.
// Backward: a block per point turns its row of the tile into the weights w_ij and their sum, and
// sum_j w_ij x_j is one matrix product of the tile with x (at::mm), so that
// grad_i = -4 t grad (sum_j w_ij x_i - sum_j w_ij x_j).
// Memory: O(n d) and the distance tile, never an [n, n] buffer.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/logsumexp.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros_like.h>
#include <torch/library.h>

#include "common/checks.h"
#include "common/dispatch.h"
#include "common/uniformity.h"
#include "cuda/cuda_rows.cuh"

namespace pnn_fast {
namespace {

// Whether the pair (i, j), i != j, counts: both rows kept (every row when keep is null).
__device__ inline bool pair_kept(const bool* keep, int64_t i, int64_t j) {
  return i != j && (keep == nullptr || (keep[i] && keep[j]));
}

// distances: [tile, n], the squared distances of points row0.. (one block per point).
template <typename acc_t>
__global__ void uniformity_rows_kernel(const acc_t* distances, int64_t row0, int64_t n, acc_t neg_t,
                                       const bool* keep, double* row_lse) {
  __shared__ acc_t maxima[kThreads];
  __shared__ acc_t sums[kThreads];
  const int64_t i = row0 + blockIdx.x;
  const acc_t* distance = distances + static_cast<int64_t>(blockIdx.x) * n;
  LogSumExp<acc_t> state = lse_empty<acc_t>();
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    if (pair_kept(keep, i, j)) lse_add(state, neg_t * distance[j]);
  }
  maxima[threadIdx.x] = state.max;
  sums[threadIdx.x] = state.sum;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) {
      const LogSumExp<acc_t> merged = lse_merge(LogSumExp<acc_t>{maxima[threadIdx.x], sums[threadIdx.x]},
                                                LogSumExp<acc_t>{maxima[threadIdx.x + stride], sums[threadIdx.x + stride]});
      maxima[threadIdx.x] = merged.max;
      sums[threadIdx.x] = merged.sum;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) row_lse[i] = static_cast<double>(lse_value(LogSumExp<acc_t>{maxima[0], sums[0]}));
}

// In place over a tile of squared distances: w_ij = exp(-t d_ij - L) for j != i (i = row0 + the
// block's row), 0 at j = i, with L the forward's float64 total; weight_sums[i] = sum_j w_ij.
template <typename acc_t>
__global__ void uniformity_weights_kernel(acc_t* tile, int64_t row0, int64_t n, acc_t neg_t, const double* total,
                                          const bool* keep, acc_t* weight_sums) {
  __shared__ acc_t scratch[kWarps];
  const int64_t i = row0 + blockIdx.x;
  acc_t* weights = tile + static_cast<int64_t>(blockIdx.x) * n;
  const acc_t total_lse = static_cast<acc_t>(total[0]);
  acc_t sum = 0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    const acc_t w = pair_kept(keep, i, j) ? exp_(neg_t * weights[j] - total_lse) : acc_t(0);
    weights[j] = w;
    sum += w;
  }
  sum = block_sum(sum, scratch);
  if (threadIdx.x == 0) weight_sums[i] = sum;
}

// The CUDA backward computes its weights again: nothing is saved.
// With keep, the rows it leaves out take part in no pair, and the mean is over the kept count's
// pairs, a count that stays on the device (no read-back).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> pairwise_uniformity_fwd_cuda(
    const at::Tensor& x, double t, bool save, const c10::optional<at::Tensor>& keep) {
  TORCH_CHECK(!save, kUniformityFwd, ": save is for the CPU kernels only");
  const at::Tensor points = prepare_points(kUniformityFwd, x, t);
  const c10::optional<at::Tensor> kept = prepare_keep(kUniformityFwd, x, keep);
  const bool* keep_ptr = kept ? kept->data_ptr<bool>() : nullptr;
  const int64_t n = points.size(0), d = points.size(1);
  // The CPU kernels' saved row maxima and exponentials: none here, but two distinct empty tensors,
  // since the schema's outputs may not alias (opcheck's test_schema and CUDA graphs rely on it).
  const auto nothing = [&x] { return at::empty({0}, x.options().dtype(opmath_dtype(x.scalar_type()))); };
  if (n < 2) {
    const auto [value, total] = empty_uniformity_outputs(x);
    return {value, total, nothing(), nothing()};
  }
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor row_lse = at::empty({n}, x.options().dtype(at::kDouble));
  PNN_DISPATCH_FLOATING_TYPES(points.scalar_type(), kUniformityFwd, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const TileSide<scalar_t> side{points.data_ptr<scalar_t>(), nullptr};
    const at::TensorOptions acc_options = x.options().dtype(opmath_dtype(x.scalar_type()));
    for_each_chain_tile<acc_t>(side, side, d, n, n, SquaredDiffTerm{}, acc_options,
                               [&](int64_t row0, const at::Tensor& distances) {
                                 launch_rows(uniformity_rows_kernel<acc_t>, distances.size(0), 0,
                                             distances.data_ptr<acc_t>(), row0, n, static_cast<acc_t>(-t),
                                             keep_ptr, row_lse.data_ptr<double>());
                               });
  });
  if (!kept) {
    const auto [value, total] = uniformity_outputs(at::logsumexp(row_lse, {0}), 1.0, points);
    return {value, total, nothing(), nothing()};
  }
  const at::Tensor total = at::logsumexp(row_lse, {0});
  const at::Tensor count = kept->sum().to(at::kDouble);  // on the device
  const at::Tensor value = at::where(count.ge(2), total - count.log() - (count - 1).log(), at::zeros_like(total));
  return {value.to(x.scalar_type()), total, nothing(), nothing()};
}

at::Tensor pairwise_uniformity_bwd_cuda(const at::Tensor& grad, const at::Tensor& x, double t, const at::Tensor& total,
                                        const at::Tensor& /*saved_row_max*/, const at::Tensor& saved_exps,
                                        const c10::optional<at::Tensor>& keep) {
  TORCH_CHECK(saved_exps.numel() == 0, kUniformityBwd, ": saved exponentials are for the CPU kernels only");
  const at::Tensor points = prepare_points(kUniformityBwd, x, t);
  const c10::optional<at::Tensor> kept = prepare_keep(kUniformityBwd, x, keep);
  const bool* keep_ptr = kept ? kept->data_ptr<bool>() : nullptr;
  TORCH_CHECK(grad.numel() == 1 && total.numel() == 1, kUniformityBwd, ": grad and total must be scalars");
  check_same_device(kUniformityBwd, points, "x", grad, "grad");
  check_same_device(kUniformityBwd, points, "x", total, "total");
  const int64_t n = points.size(0), d = points.size(1);
  if (n < 2) return at::zeros_like(x);
  const c10::cuda::CUDAGuard guard(x.device());
  // grad and output stay on the device (no host synchronisation)
  const at::ScalarType acc_dtype = opmath_dtype(x.scalar_type());
  const at::Tensor scale = (grad.to(points.scalar_type()).to(acc_dtype).to(at::kDouble) * (-4.0 * t)).to(acc_dtype);
  const at::Tensor total_in = total.to(at::kDouble).contiguous();
  const at::Tensor x_acc = points.to(acc_dtype).contiguous();
  const at::Tensor weight_sums = at::empty({n}, x_acc.options());
  const at::Tensor weighted = at::empty({n, d}, x_acc.options());  // sum_j w_ij x_j
  PNN_DISPATCH_FLOATING_TYPES(points.scalar_type(), kUniformityBwd, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const TileSide<scalar_t> side{points.data_ptr<scalar_t>(), nullptr};
    for_each_chain_tile<acc_t>(side, side, d, n, n, SquaredDiffTerm{}, x_acc.options(),
                               [&](int64_t row0, const at::Tensor& tile) {
                                 launch_rows(uniformity_weights_kernel<acc_t>, tile.size(0), 0,
                                             tile.data_ptr<acc_t>(), row0, n, static_cast<acc_t>(-t),
                                             total_in.data_ptr<double>(), keep_ptr, weight_sums.data_ptr<acc_t>());
                                 at::Tensor rows = weighted.narrow(0, row0, tile.size(0));
                                 at::mm_out(rows, tile, x_acc);
                               });
  });
  // sum_j w_ij (x_i - x_j) = (sum_j w_ij) x_i - sum_j w_ij x_j
  const at::Tensor grad_x = (weight_sums.unsqueeze(1) * x_acc - weighted) * scale;
  return grad_x.to(points.scalar_type());
}

}  // namespace
}  // namespace pnn_fast

TORCH_LIBRARY_IMPL(pnn_fast, CUDA, m) {
  m.impl("pairwise_uniformity_fwd", &pnn_fast::pairwise_uniformity_fwd_cuda);
  m.impl("pairwise_uniformity_bwd", &pnn_fast::pairwise_uniformity_bwd_cuda);
}
