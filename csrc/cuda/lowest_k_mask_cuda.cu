// pnn_fast::lowest_k_mask on CUDA: a block per row finds the row's k-th lowest (key, column) pair by
// the radix select of class_centroids (block_bottom_k, cuda_rows.cuh), then marks every column
// in_bottom_k of it (pnn_rows.h): the order and membership test the CPU kernel applies to the pair
// its quickselect finds.  Every read of the row is coalesced; no scratch beyond the block's shared state.
#include <ATen/core/Tensor.h>
#include <ATen/OpMathType.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "common/checks.h"
#include "common/dispatch.h"
#include "cuda/cuda_rows.cuh"

namespace pnn_fast {
namespace {

// The order keys of one row of scores.  order_key never gives kExcludedKey, so block_bottom_k
// counts every column as a candidate.
template <typename scalar_t, typename acc_t>
struct ScoreRowKeys {
  const scalar_t* scores;
  __device__ typename KeyOf<acc_t>::type operator()(int64_t j) const { return order_key(static_cast<acc_t>(scores[j])); }
};

template <typename scalar_t, typename acc_t>
__global__ void lowest_k_mask_kernel(const scalar_t* scores, const int64_t* k, bool* mask, int64_t count) {
  using key_t = typename KeyOf<acc_t>::type;
  __shared__ SelectShared<key_t> sh;
  const int64_t b = blockIdx.x;
  const ScoreRowKeys<scalar_t, acc_t> keys{scores + b * count};
  key_t threshold_key;
  int64_t cutoff;
  block_bottom_k(keys, count, k[b], sh, threshold_key, cutoff);  // k clamped to [0, count] there
  for (int64_t j = threadIdx.x; j < count; j += blockDim.x) {
    mask[b * count + j] = in_bottom_k(keys(j), j, threshold_key, cutoff);
  }
}

at::Tensor lowest_k_mask_cuda(const at::Tensor& scores, const at::Tensor& k) {
  const LowestKInputs in = prepare_lowest_k_mask("pnn_fast::lowest_k_mask", scores, k);
  const c10::cuda::CUDAGuard guard(scores.device());
  const int64_t rows = in.scores.size(0), count = in.scores.size(1);
  at::Tensor mask = at::empty(in.scores.sizes(), in.scores.options().dtype(at::kBool));
  PNN_DISPATCH_FLOATING_TYPES(in.scores.scalar_type(), "lowest_k_mask_cuda", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    launch_rows(lowest_k_mask_kernel<scalar_t, acc_t>, rows, 0, in.scores.data_ptr<scalar_t>(),
                in.k.data_ptr<int64_t>(), mask.data_ptr<bool>(), count);
  });
  return mask;
}

}  // namespace
}  // namespace pnn_fast

TORCH_LIBRARY_IMPL(pnn_fast, CUDA, m) {
  m.impl("lowest_k_mask", &pnn_fast::lowest_k_mask_cuda);
}
