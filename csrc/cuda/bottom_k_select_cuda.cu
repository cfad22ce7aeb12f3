// pnn_fast::bottom_k_select on CUDA: one block per row runs the radix select of cuda_rows.cuh over
// the row's keys, kept in shared memory when C keys fit (else rescored on every pass).
#include <ATen/ATen.h>
#include <torch/library.h>

#include "common/checks.h"
#include "common/dispatch.h"
#include "cuda/cuda_rows.cuh"

namespace pnn_fast {
namespace {

template <typename scalar_t, typename acc_t, bool kCached>
__global__ void bottom_k_select_kernel(RowBatch<scalar_t> batch, const int64_t* k, acc_t* threshold,
                                       int64_t* cutoff) {
  using key_t = typename KeyOf<acc_t>::type;
  extern __shared__ unsigned char dynamic_shared[];
  __shared__ SelectShared<key_t> sh;
  const int64_t b = blockIdx.x;
  CUDA_KERNEL_ASSERT(batch.users[b] >= 0 && batch.users[b] < batch.num_users);
  const Row<scalar_t, acc_t> row(batch, b);
  const RowKeys<scalar_t, acc_t, kCached> keys{row, reinterpret_cast<key_t*>(dynamic_shared), batch.num_candidates,
                                               batch.num_items};
  keys.prepare();
  key_t threshold_key;
  int64_t row_cutoff;
  block_bottom_k(keys, batch.num_candidates, k[b], sh, threshold_key, row_cutoff);
  if (threadIdx.x == 0) {
    threshold[b] = row_cutoff < 0 ? neg_infinity<acc_t>() : key_to_score<acc_t>(threshold_key);
    cutoff[b] = row_cutoff;
  }
}

std::tuple<at::Tensor, at::Tensor> bottom_k_select_cuda(const at::Tensor& user_emb, const at::Tensor& item_table,
                                                        const at::Tensor& users, const at::Tensor& pos_items,
                                                        const at::Tensor& candidates, const at::Tensor& known_indptr,
                                                        const at::Tensor& known_indices, const at::Tensor& k) {
  constexpr const char* op = "pnn_fast::bottom_k_select";
  const RowInputs in =
      prepare_row_inputs(op, user_emb, item_table, users, pos_items, candidates, known_indptr, known_indices);
  const at::Tensor k_in = row_state(op, in, k, "k", at::kLong);
  const c10::cuda::CUDAGuard guard(user_emb.device());
  at::Tensor threshold = at::empty({in.rows}, user_emb.options().dtype(opmath_dtype(user_emb.scalar_type())));
  at::Tensor cutoff = at::empty({in.rows}, users.options().dtype(at::kLong));
  PNN_DISPATCH_FLOATING_TYPES(in.user_emb.scalar_type(), op, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    using key_t = typename KeyOf<acc_t>::type;
    const int64_t key_bytes = in.num_candidates * static_cast<int64_t>(sizeof(key_t));
    const int64_t budget = max_shared_memory_per_block() - static_cast<int64_t>(sizeof(SelectShared<key_t>));
    const RowBatch<scalar_t> batch = row_batch<scalar_t>(in);
    if (key_bytes <= budget) {
      launch_rows(bottom_k_select_kernel<scalar_t, acc_t, true>, in.rows, key_bytes, batch, k_in.data_ptr<int64_t>(),
                  threshold.data_ptr<acc_t>(), cutoff.data_ptr<int64_t>());
    } else {
      launch_rows(bottom_k_select_kernel<scalar_t, acc_t, false>, in.rows, 0, batch, k_in.data_ptr<int64_t>(),
                  threshold.data_ptr<acc_t>(), cutoff.data_ptr<int64_t>());
    }
  });
  return {threshold, cutoff};
}

}  // namespace
}  // namespace pnn_fast

TORCH_LIBRARY_IMPL(pnn_fast, CUDA, m) { m.impl("bottom_k_select", &pnn_fast::bottom_k_select_cuda); }
