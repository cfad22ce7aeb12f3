// pnn_fast::pairwise_uniformity_fwd / _bwd on CUDA, one block per point i.
//
// The squared distances come from for_each_chain_tile (cuda_rows.cuh), a tile of points at a time:
// pnn_rows.h's squared_distance chain, so the CPU's bits.
// Forward: each thread runs a streaming log-sum-exp over its strided share of the j != i and
// the block merges them (pnn_rows.h lse_merge); at::logsumexp merges the rows in float64.
// Backward: per chunk of kThreads points, each thread computes one weight w_ij, then the threads
// accumulate sum_j w_ij (x_i - x_j) along the dims, several threads a dim when d < kThreads.
// Memory: O(n d) and the distance tile (about 4 MiB), never an [n, n] buffer.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/logsumexp.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <torch/library.h>

#include "common/checks.h"
#include "common/dispatch.h"
#include "common/uniformity.h"
#include "cuda/cuda_rows.cuh"

namespace pnn_fast {
namespace {

// distances: [tile, n], the squared distances of points row0.. (one block per point).
template <typename acc_t>
__global__ void uniformity_rows_kernel(const acc_t* distances, int64_t row0, int64_t n, acc_t neg_t,
                                       double* row_lse) {
  __shared__ acc_t maxima[kThreads];
  __shared__ acc_t sums[kThreads];
  const int64_t i = row0 + blockIdx.x;
  const acc_t* distance = distances + static_cast<int64_t>(blockIdx.x) * n;
  LogSumExp<acc_t> state = lse_empty<acc_t>();
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    if (j != i) lse_add(state, neg_t * distance[j]);
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

// grad_x[i] = -4 t grad sum_{j != i} exp(l_ij - L) (x_i - x_j), L = the forward's float64 total.
template <typename scalar_t, typename acc_t>
__global__ void uniformity_grad_kernel(const scalar_t* x, const acc_t* distances, int64_t row0, int64_t n, int64_t d,
                                       acc_t neg_t, double t, const scalar_t* grad, const double* total, acc_t* acc,
                                       scalar_t* grad_x) {
  __shared__ acc_t weights[kThreads];
  __shared__ acc_t partials[kThreads];
  const int64_t i = row0 + blockIdx.x;
  const acc_t* distance = distances + static_cast<int64_t>(blockIdx.x) * n;
  // with d < kThreads a dim gets several threads (d = 64: all 256 busy instead of 64)
  const int64_t groups = d > 0 && d < kThreads ? kThreads / d : 1;
  const acc_t total_lse = static_cast<acc_t>(total[0]);
  const acc_t scale = static_cast<acc_t>(static_cast<double>(static_cast<acc_t>(grad[0])) * -4.0 * t);
  acc_t* acc_i = acc + i * d;  // zeroed workspace; each thread owns its dims
  for (int64_t j0 = 0; j0 < n; j0 += kThreads) {
    const int64_t j = j0 + threadIdx.x;
    weights[threadIdx.x] =
        (j < n && j != i) ? exp_(neg_t * distance[j] - total_lse) : acc_t(0);
    __syncthreads();
    const int64_t chunk = n - j0 < kThreads ? n - j0 : kThreads;
    if (groups == 1) {
      for (int64_t dim = threadIdx.x; dim < d; dim += blockDim.x) {
        const acc_t xi = static_cast<acc_t>(x[i * d + dim]);
        acc_t sum = 0;
        for (int64_t c = 0; c < chunk; ++c) sum += weights[c] * (xi - static_cast<acc_t>(x[(j0 + c) * d + dim]));
        acc_i[dim] += sum;
      }
    } else {
      // `groups` threads per dim, each over every groups-th point of the chunk, then merged
      const int64_t dim = threadIdx.x % d, group = threadIdx.x / d;
      acc_t sum = 0;
      if (group < groups) {
        const acc_t xi = static_cast<acc_t>(x[i * d + dim]);
        for (int64_t c = group; c < chunk; c += groups) {
          sum += weights[c] * (xi - static_cast<acc_t>(x[(j0 + c) * d + dim]));
        }
      }
      partials[threadIdx.x] = sum;
      __syncthreads();
      if (group == 0) {
        acc_t merged = 0;
        for (int64_t g = 0; g < groups; ++g) merged += partials[g * d + dim];
        acc_i[dim] += merged;
      }
    }
    __syncthreads();
  }
  for (int64_t dim = threadIdx.x; dim < d; dim += blockDim.x) {
    grad_x[i * d + dim] = static_cast<scalar_t>(scale * acc_i[dim]);
  }
}

std::tuple<at::Tensor, at::Tensor> pairwise_uniformity_fwd_cuda(const at::Tensor& x, double t) {
  const at::Tensor points = prepare_points(kUniformityFwd, x, t);
  const int64_t n = points.size(0), d = points.size(1);
  if (n < 2) return empty_uniformity_outputs(x);
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor row_lse = at::empty({n}, x.options().dtype(at::kDouble));
  PNN_DISPATCH_FLOATING_TYPES(points.scalar_type(), kUniformityFwd, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const TileSide<scalar_t> side{points.data_ptr<scalar_t>(), nullptr};
    for_each_chain_tile<acc_t>(side, side, d, n, n, SquaredDiffTerm{}, x.options().dtype(opmath_dtype(x.scalar_type())),
                               [&](int64_t row0, int64_t num_rows, const acc_t* distances) {
                                 launch_rows(uniformity_rows_kernel<acc_t>, num_rows, 0, distances, row0, n,
                                             static_cast<acc_t>(-t), row_lse.data_ptr<double>());
                               });
  });
  return uniformity_outputs(at::logsumexp(row_lse, {0}), 1.0, points);
}

at::Tensor pairwise_uniformity_bwd_cuda(const at::Tensor& grad, const at::Tensor& x, double t,
                                        const at::Tensor& total) {
  const at::Tensor points = prepare_points(kUniformityBwd, x, t);
  TORCH_CHECK(grad.numel() == 1 && total.numel() == 1, kUniformityBwd, ": grad and total must be scalars");
  check_same_device(kUniformityBwd, points, "x", grad, "grad");
  check_same_device(kUniformityBwd, points, "x", total, "total");
  const int64_t n = points.size(0), d = points.size(1);
  if (n < 2) return at::zeros_like(x);
  const c10::cuda::CUDAGuard guard(x.device());
  // grad and output stay on the device (no host synchronisation)
  const at::Tensor grad_in = grad.to(points.scalar_type()).contiguous();
  const at::Tensor total_in = total.to(at::kDouble).contiguous();
  at::Tensor acc = at::zeros({n, d}, x.options().dtype(opmath_dtype(x.scalar_type())));
  at::Tensor grad_x = at::empty({n, d}, points.options());
  PNN_DISPATCH_FLOATING_TYPES(points.scalar_type(), kUniformityBwd, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const TileSide<scalar_t> side{points.data_ptr<scalar_t>(), nullptr};
    for_each_chain_tile<acc_t>(side, side, d, n, n, SquaredDiffTerm{}, acc.options(),
                               [&](int64_t row0, int64_t num_rows, const acc_t* distances) {
                                 launch_rows(uniformity_grad_kernel<scalar_t, acc_t>, num_rows, 0,
                                             points.data_ptr<scalar_t>(), distances, row0, n, d,
                                             static_cast<acc_t>(-t), t, grad_in.data_ptr<scalar_t>(),
                                             total_in.data_ptr<double>(), acc.data_ptr<acc_t>(),
                                             grad_x.data_ptr<scalar_t>());
                               });
  });
  return grad_x;
}

}  // namespace
}  // namespace pnn_fast

TORCH_LIBRARY_IMPL(pnn_fast, CUDA, m) {
  m.impl("pairwise_uniformity_fwd", &pnn_fast::pairwise_uniformity_fwd_cuda);
  m.impl("pairwise_uniformity_bwd", &pnn_fast::pairwise_uniformity_bwd_cuda);
}
