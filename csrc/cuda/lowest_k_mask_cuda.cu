// pnn_fast::lowest_k_mask on CUDA: one thread per row runs the quickselect of lowest_k_row
// (common/lowest_k_row.h) over a scratch row in global memory.  The rows it serves (SL's sampled
// negatives, hundreds a row) make it small beside the step's gathers; long rows would want a
// block per row and a radix select (pnn_rows.h's radix_pick, as class_centroids does).
#include <ATen/core/Tensor.h>
#include <ATen/OpMathType.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "common/checks.h"
#include "common/dispatch.h"
#include "common/lowest_k_row.h"
#include "cuda/cuda_rows.cuh"

namespace pnn_fast {
namespace {

template <typename scalar_t, typename acc_t>
__global__ void lowest_k_mask_kernel(const scalar_t* scores, const int64_t* k,
                                     KeyedColumn<typename KeyOf<acc_t>::type>* scratch, bool* mask, int64_t rows,
                                     int64_t count) {
  const int64_t b = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (b >= rows) return;
  lowest_k_row<scalar_t, acc_t>(scores + b * count, count, k[b], scratch + b * count, mask + b * count);
}

at::Tensor lowest_k_mask_cuda(const at::Tensor& scores, const at::Tensor& k) {
  const LowestKInputs in = prepare_lowest_k_mask("pnn_fast::lowest_k_mask", scores, k);
  const c10::cuda::CUDAGuard guard(scores.device());
  const int64_t rows = in.scores.size(0), count = in.scores.size(1);
  at::Tensor mask = at::empty(in.scores.sizes(), in.scores.options().dtype(at::kBool));
  PNN_DISPATCH_FLOATING_TYPES(in.scores.scalar_type(), "lowest_k_mask_cuda", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    using entry_t = KeyedColumn<typename KeyOf<acc_t>::type>;
    at::Tensor scratch = at::empty({rows * count * static_cast<int64_t>(sizeof(entry_t))},
                                   in.scores.options().dtype(at::kByte));
    launch_flat(lowest_k_mask_kernel<scalar_t, acc_t>, rows, in.scores.data_ptr<scalar_t>(), in.k.data_ptr<int64_t>(),
                reinterpret_cast<entry_t*>(scratch.data_ptr()), mask.data_ptr<bool>(), rows, count);
  });
  return mask;
}

}  // namespace
}  // namespace pnn_fast

TORCH_LIBRARY_IMPL(pnn_fast, CUDA, m) {
  m.impl("lowest_k_mask", &pnn_fast::lowest_k_mask_cuda);
}
