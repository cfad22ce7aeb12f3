// pnn_fast::hard_negative_argmax on CUDA: one block per row, each thread takes a strided subset of
// the candidates and the block reduces (key, j) and |U_b|.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "common/checks.h"
#include "common/dispatch.h"
#include "cuda/cuda_rows.cuh"

namespace pnn_fast {
namespace {

template <typename scalar_t, typename acc_t>
__global__ void hard_negative_argmax_kernel(RowBatch<scalar_t> batch, int64_t* hard, int64_t* num_unlabeled) {
  using key_t = typename KeyOf<acc_t>::type;
  __shared__ HardShared<key_t> sh;
  const int64_t b = blockIdx.x;
  const Row<scalar_t, acc_t> row(batch, b);
  const RowKeys<scalar_t, acc_t, false> keys{row, nullptr, batch.num_candidates};
  int64_t best, count;
  block_hard_negative(keys, batch.num_candidates, sh, best, count);
  if (threadIdx.x == 0) {
    hard[b] = best;
    num_unlabeled[b] = count;
  }
}

std::tuple<at::Tensor, at::Tensor> hard_negative_argmax_cuda(const at::Tensor& user_emb, const at::Tensor& item_table,
                                                             const at::Tensor& users, const at::Tensor& pos_items,
                                                             const at::Tensor& candidates,
                                                             const at::Tensor& known_indptr,
                                                             const at::Tensor& known_indices) {
  constexpr const char* op = "pnn_fast::hard_negative_argmax";
  RowInputs in =
      prepare_row_inputs(op, user_emb, item_table, users, pos_items, candidates, known_indptr, known_indices);
  check_id_ranges(op, in);
  const c10::cuda::CUDAGuard guard(user_emb.device());
  at::Tensor hard = at::empty({in.rows}, users.options().dtype(at::kLong));
  at::Tensor num_unlabeled = at::empty({in.rows}, users.options().dtype(at::kLong));
  PNN_DISPATCH_FLOATING_TYPES(in.user_emb.scalar_type(), op, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    launch_rows(hard_negative_argmax_kernel<scalar_t, acc_t>, in.rows, 0, row_batch<scalar_t>(in),
                hard.data_ptr<int64_t>(), num_unlabeled.data_ptr<int64_t>());
  });
  return {hard, num_unlabeled};
}

}  // namespace
}  // namespace pnn_fast

TORCH_LIBRARY_IMPL(pnn_fast, CUDA, m) {
  m.impl("hard_negative_argmax", &pnn_fast::hard_negative_argmax_cuda);
}
