// pnn_fast::hard_negative_argmax on CUDA: one warp per row (eight rows a block), each lane owning a
// candidate of the row's current chunk of 32.  DNS and the preset ask for the hardest of a few (8)
// candidates a row: a 256-thread block per row left 248 threads idle, and each thread walked its
// candidate's embedding alone, one row's cache lines per lane.  Here the warp stages a panel of the
// chunk's embeddings (kPanelDims dims of each) into shared memory with consecutive lanes on
// consecutive dims, then each lane advances its candidate's score chain over the panel: the same
// fused multiply-adds in the same order as row_score (pnn_rows.h sequential_sum), so the same bits
// as the CPU kernel and class_centroids.  The warp then reduces (key, j) and |U_b| by shuffles.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "common/checks.h"
#include "common/dispatch.h"
#include "cuda/cuda_rows.cuh"

namespace pnn_fast {
namespace {

constexpr int kPanelDims = 16;
constexpr int kRowsPerBlock = kFlatThreads / 32;

template <typename scalar_t, typename acc_t>
__global__ void hard_negative_argmax_kernel(RowBatch<scalar_t> batch, int64_t* hard, int64_t* num_unlabeled) {
  using key_t = typename KeyOf<acc_t>::type;
  // + 1: lane c reading its candidate's dims (a column of the panel) hits a different bank per lane
  __shared__ acc_t panels[kRowsPerBlock][32][kPanelDims + 1];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t b = int64_t(blockIdx.x) * kRowsPerBlock + warp;
  if (b >= batch.num_rows) return;  // a whole warp, and the kernel has no block barrier
  const Row<scalar_t, acc_t> row(batch, b);
  acc_t(*panel)[kPanelDims + 1] = panels[warp];
  const int64_t count = batch.num_candidates, d = batch.dim;
  key_t best_key = 0;
  int64_t best = -1, unlabeled = 0;
  for (int64_t base = 0; base < count; base += 32) {
    const int chunk = static_cast<int>(count - base < 32 ? count - base : 32);
    acc_t score = acc_t(0);
    for (int64_t k0 = 0; k0 < d; k0 += kPanelDims) {
      const int depth = static_cast<int>(d - k0 < kPanelDims ? d - k0 : kPanelDims);
      for (int e = lane; e < chunk * kPanelDims; e += 32) {
        const int c = e / kPanelDims, kk = e % kPanelDims;
        if (kk < depth) panel[c][kk] = acc_t(row.embedding(base + c)[k0 + kk]);
      }
      __syncwarp();
      if (lane < chunk) {
        for (int kk = 0; kk < depth; ++kk) score = DotTerm{}(acc_t(row.user[k0 + kk]), panel[lane][kk], score);
      }
      __syncwarp();  // the panel is rewritten next
    }
    const int64_t j = base + lane;
    if (lane < chunk) {
      const key_t key = row.key(j, score);
      if (key != key_t(kExcludedKey)) {
        ++unlabeled;
        if (hard_better(key, j, best_key, best)) {
          best_key = key;
          best = j;
        }
      }
    }
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    const key_t other_key = __shfl_xor_sync(0xffffffffu, best_key, offset);
    const int64_t other = __shfl_xor_sync(0xffffffffu, best, offset);
    unlabeled += __shfl_xor_sync(0xffffffffu, unlabeled, offset);
    if (hard_better(other_key, other, best_key, best)) {
      best_key = other_key;
      best = other;
    }
  }
  if (lane == 0) {
    hard[b] = best;
    num_unlabeled[b] = unlabeled;
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
    launch_flat(hard_negative_argmax_kernel<scalar_t, acc_t>, in.rows * 32, row_batch<scalar_t>(in),
                hard.data_ptr<int64_t>(), num_unlabeled.data_ptr<int64_t>());
  });
  return {hard, num_unlabeled};
}

}  // namespace
}  // namespace pnn_fast

TORCH_LIBRARY_IMPL(pnn_fast, CUDA, m) {
  m.impl("hard_negative_argmax", &pnn_fast::hard_negative_argmax_cuda);
}
