// pnn_fast::rows_contain on CUDA: one thread per (row, column), the binary search of sorted_contains
// (pnn_rows.h) in the row alone.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "common/checks.h"
#include "cuda/cuda_rows.cuh"

namespace pnn_fast {
namespace {

__global__ void rows_contain_kernel(const int64_t* indptr, const int64_t* sorted, const int64_t* rows,
                                    const int64_t* columns, int64_t column_row_stride, bool* out, int64_t num_rows,
                                    int64_t per_row, int64_t nnz) {
  const int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t >= num_rows * per_row) return;
  const int64_t b = t / per_row;
  int64_t first = 0, count = 0;
  clamped_row_span(indptr, rows[b], nnz, first, count);
  out[t] = sorted_contains(sorted + first, count, columns[b * column_row_stride + t % per_row]);
}

at::Tensor rows_contain_cuda(const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& rows,
                             const at::Tensor& columns) {
  const RowsContainInputs in = prepare_rows_contain("pnn_fast::rows_contain", indptr, indices, rows, columns);
  const c10::cuda::CUDAGuard guard(columns.device());
  at::Tensor found = at::empty(in.columns.sizes(), in.columns.options().dtype(at::kBool));
  launch_flat(rows_contain_kernel, in.columns.numel(), in.indptr.data_ptr<int64_t>(), in.indices.data_ptr<int64_t>(),
              in.rows.data_ptr<int64_t>(), in.columns.data_ptr<int64_t>(), in.column_row_stride, found.data_ptr<bool>(),
              in.columns.size(0), in.columns.size(1), in.indices.numel());
  return found;
}

}  // namespace
}  // namespace pnn_fast

TORCH_LIBRARY_IMPL(pnn_fast, CUDA, m) {
  m.impl("rows_contain", &pnn_fast::rows_contain_cuda);
}
