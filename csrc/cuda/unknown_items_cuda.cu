// pnn_fast::unknown_items on CUDA: one thread per draw, the binary search of unknown_by_rank (pnn_rows.h).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "common/checks.h"
#include "common/dispatch.h"
#include "cuda/cuda_rows.cuh"

namespace pnn_fast {
namespace {

__global__ void unknown_items_kernel(const int64_t* indptr, const int64_t* known, const int64_t* users,
                                     const float* uniform, int64_t* out, int64_t rows, int64_t per_row,
                                     int64_t num_items) {
  const int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t >= rows * per_row) return;
  const int64_t user = users[t / per_row];
  const int64_t first = indptr[user], count = indptr[user + 1] - first, free = num_items - count;
  out[t] = unknown_by_rank(known + first, count, rank_of_uniform(uniform[t], free));
}

at::Tensor unknown_items_cuda(const at::Tensor& known_indptr, const at::Tensor& known_indices, const at::Tensor& users,
                              const at::Tensor& uniform, int64_t num_items) {
  constexpr const char* op = "pnn_fast::unknown_items";
  KnownDraws in = prepare_known_draws(op, known_indptr, known_indices, users, uniform);
  check_draw_values(op, in, num_items);
  const c10::cuda::CUDAGuard guard(known_indptr.device());
  at::Tensor items = at::empty(in.uniform.sizes(), users.options());
  launch_flat(unknown_items_kernel, in.uniform.numel(), in.indptr.data_ptr<int64_t>(), in.indices.data_ptr<int64_t>(),
              in.users.data_ptr<int64_t>(), in.uniform.data_ptr<float>(), items.data_ptr<int64_t>(), in.rows,
              in.per_row, num_items);
  return items;
}

}  // namespace
}  // namespace pnn_fast

TORCH_LIBRARY_IMPL(pnn_fast, CUDA, m) {
  m.impl("unknown_items", &pnn_fast::unknown_items_cuda);
}
