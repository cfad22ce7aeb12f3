// pnn_fast::history_sample on CUDA: one thread per row, Floyd's algorithm of pnn_rows.h.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "common/checks.h"
#include "common/dispatch.h"
#include "cuda/cuda_rows.cuh"

namespace pnn_fast {
namespace {

// One thread per row: Floyd's positions written into the row, then replaced by the items.
__global__ void history_sample_kernel(const int64_t* indptr, const int64_t* known, const int64_t* users,
                                      const float* uniform, int64_t* out, int64_t rows, int64_t size) {
  const int64_t b = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (b >= rows) return;
  int64_t* row = out + b * size;
  const int64_t first = indptr[users[b]];
  ScannedPositions seen;
  const int64_t taken = floyd_positions(indptr[users[b] + 1] - first, size, uniform + b * size, row, seen);
  for (int64_t i = 0; i < taken; ++i) row[i] = known[first + row[i]];
  for (int64_t i = taken; i < size; ++i) row[i] = -1;
}

at::Tensor history_sample_cuda(const at::Tensor& known_indptr, const at::Tensor& known_indices,
                               const at::Tensor& users, const at::Tensor& uniform) {
  constexpr const char* op = "pnn_fast::history_sample";
  KnownDraws in = prepare_known_draws(op, known_indptr, known_indices, users, uniform);
  check_draw_values(op, in);
  const c10::cuda::CUDAGuard guard(known_indptr.device());
  at::Tensor items = at::empty(in.uniform.sizes(), users.options());
  launch_flat(history_sample_kernel, in.rows, in.indptr.data_ptr<int64_t>(), in.indices.data_ptr<int64_t>(),
              in.users.data_ptr<int64_t>(), in.uniform.data_ptr<float>(), items.data_ptr<int64_t>(), in.rows,
              in.per_row);
  return items;
}

}  // namespace
}  // namespace pnn_fast

TORCH_LIBRARY_IMPL(pnn_fast, CUDA, m) {
  m.impl("history_sample", &pnn_fast::history_sample_cuda);
}
