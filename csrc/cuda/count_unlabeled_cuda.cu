// pnn_fast::count_unlabeled on CUDA: one block per row, each thread counts a strided subset of the
// candidates that are unlabeled for the row (no scoring), and the block sums the counts.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "common/checks.h"
#include "common/dispatch.h"
#include "cuda/cuda_rows.cuh"

namespace pnn_fast {
namespace {

template <typename scalar_t, typename acc_t>
__global__ void count_unlabeled_kernel(RowBatch<scalar_t> batch, int64_t* num_unlabeled) {
  __shared__ int64_t scratch[kWarps];
  const int64_t b = blockIdx.x;
  const Row<scalar_t, acc_t> row(batch, b);
  int64_t mine = 0;
  for (int64_t j = threadIdx.x; j < batch.num_candidates; j += blockDim.x) mine += row.unlabeled(j);
  const int64_t count = block_sum(mine, scratch);
  if (threadIdx.x == 0) num_unlabeled[b] = count;
}

at::Tensor count_unlabeled_cuda(const at::Tensor& user_emb, const at::Tensor& item_table, const at::Tensor& users,
                                const at::Tensor& pos_items, const at::Tensor& candidates,
                                const at::Tensor& known_indptr, const at::Tensor& known_indices) {
  constexpr const char* op = "pnn_fast::count_unlabeled";
  RowInputs in =
      prepare_row_inputs(op, user_emb, item_table, users, pos_items, candidates, known_indptr, known_indices);
  check_id_ranges(op, in);
  const c10::cuda::CUDAGuard guard(user_emb.device());
  at::Tensor num_unlabeled = at::empty({in.rows}, users.options().dtype(at::kLong));
  PNN_DISPATCH_FLOATING_TYPES(in.user_emb.scalar_type(), op, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    launch_rows(count_unlabeled_kernel<scalar_t, acc_t>, in.rows, 0, row_batch<scalar_t>(in),
                num_unlabeled.data_ptr<int64_t>());
  });
  return num_unlabeled;
}

}  // namespace
}  // namespace pnn_fast

TORCH_LIBRARY_IMPL(pnn_fast, CUDA, m) {
  m.impl("count_unlabeled", &pnn_fast::count_unlabeled_cuda);
}
