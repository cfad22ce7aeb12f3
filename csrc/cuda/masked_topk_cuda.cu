// pnn_fast::masked_topk on CUDA: one warp per row.  Lane l scans columns l, l + 32, ... (loads
// coalesced across the warp) into its own buffer, with the CPU's per-lane logic
// (common/topk_row.h); the warp then merges its 32 sorted lists of at most k with k rounds of a
// shuffle reduction.  The buffers live in shared memory; for a k too large for it, in a global
// scratch buffer, the rows then launched in chunks that bound its size.  A NaN that is not excluded raises on the host (one flag, read back).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include "common/checks.h"
#include "common/dispatch.h"
#include "common/topk_row.h"
#include "cuda/cuda_rows.cuh"

namespace pnn_fast {
namespace {

constexpr int kTopkWarpsPerBlock = 4;
// The most global scratch memory the lane buffers of one launch may take when shared memory is too small.
constexpr int64_t kScratchBytes = int64_t{256} << 20;

// A lane's buffer: k kept entries and as many new ones (shared memory is the limit here); its
// storage is one entry more (LaneTopK).
__host__ __device__ inline int64_t lane_capacity(int64_t k) { return 2 * k; }

template <typename scalar_t, typename acc_t>
__global__ void masked_topk_kernel(const scalar_t* __restrict__ scores, const int64_t* __restrict__ users,
                                   int64_t num_rows, int64_t cols, ExclusionSets sets, int64_t k, int warps_per_block,
                                   RankedColumn<acc_t>* __restrict__ scratch, scalar_t* __restrict__ values_out,
                                   int64_t* __restrict__ columns_out, int* __restrict__ saw_nan) {
  extern __shared__ __align__(16) unsigned char topk_buffers[];
  // this block's lane buffers: in shared memory, or in `scratch` when given
  RankedColumn<acc_t>* buffers =
      scratch != nullptr ? scratch + static_cast<int64_t>(blockIdx.x) * warps_per_block * 32 * (lane_capacity(k) + 1)
                         : reinterpret_cast<RankedColumn<acc_t>*>(topk_buffers);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * warps_per_block + warp;
  if (r >= num_rows) return;  // the whole warp leaves together: the shuffles below see 32 lanes

  LaneTopK<acc_t> top{buffers + (static_cast<int64_t>(warp) * 32 + lane) * (lane_capacity(k) + 1), k, lane_capacity(k)};
  ExclusionCursors exclusions = sets.of_user(users[r]);
  const scalar_t* row = scores + r * cols;
  for (int64_t j = lane; j < cols; j += 32) top.consider(static_cast<acc_t>(row[j]), j, exclusions);
  top.finish(exclusions);  // the lane's min(k, its columns) best, best first
  if (__any_sync(0xffffffffu, top.saw_nan)) {
    if (lane == 0) atomicExch(saw_nan, 1);
    return;
  }

  // k rounds: the best head among the lanes' sorted lists is the next entry of the row.
  int64_t next = 0;
  for (int64_t slot = 0; slot < k; ++slot) {
    bool has = next < top.size;
    RankedColumn<acc_t> best = has ? top.entries[next] : RankedColumn<acc_t>{neg_infinity<acc_t>(), -1};
    for (int offset = 16; offset > 0; offset /= 2) {
      const bool other_has = __shfl_xor_sync(0xffffffffu, static_cast<int>(has), offset) != 0;
      const RankedColumn<acc_t> other{__shfl_xor_sync(0xffffffffu, best.value, offset),
                                      static_cast<int64_t>(__shfl_xor_sync(0xffffffffu, static_cast<long long>(best.column), offset))};
      if (other_has && (!has || ranks_below(best, other))) best = other;
      has = has || other_has;
    }
    // Columns are distinct across lanes, so exactly one lane owns the winner.
    if (next < top.size && top.entries[next].column == best.column) ++next;
    if (lane == 0) {
      values_out[r * k + slot] = static_cast<scalar_t>(best.value);
      columns_out[r * k + slot] = best.column;
    }
  }
}

std::tuple<at::Tensor, at::Tensor> masked_topk_cuda(const at::Tensor& scores, const at::Tensor& rows,
                                                    at::TensorList exclude_indptr, at::TensorList exclude_indices,
                                                    int64_t k) {
  constexpr const char* op = "pnn_fast::masked_topk";
  const MaskedTopkInputs in = prepare_masked_topk(op, scores, rows, exclude_indptr, exclude_indices, k);
  const c10::cuda::CUDAGuard guard(scores.device());
  const int64_t num_rows = in.scores.size(0), cols = in.scores.size(1);
  at::Tensor values = at::empty({num_rows, k}, scores.options());
  at::Tensor columns = at::empty({num_rows, k}, rows.options());
  at::Tensor saw_nan = at::zeros({1}, rows.options().dtype(at::kInt));
  if (num_rows == 0) return {values, columns};
  PNN_DISPATCH_FLOATING_TYPES(in.scores.scalar_type(), op, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const auto kernel = masked_topk_kernel<scalar_t, acc_t>;
    const int64_t warp_bytes = 32 * (lane_capacity(k) + 1) * static_cast<int64_t>(sizeof(RankedColumn<acc_t>));
    const int64_t shared_warps = std::min<int64_t>(kTopkWarpsPerBlock, dynamic_shared_budget(kernel) / warp_bytes);
    const int64_t warps = shared_warps >= 1 ? shared_warps : kTopkWarpsPerBlock;
    const int64_t shared_bytes = shared_warps >= 1 ? warps * warp_bytes : 0;
    // rows per launch: all of them, or as many as kScratchBytes of global lane buffers hold
    const int64_t chunk = shared_warps >= 1 ? num_rows : std::max<int64_t>(warps, kScratchBytes / warp_bytes / warps * warps);
    at::Tensor scratch;
    if (shared_warps < 1) scratch = at::empty({std::min(chunk, num_rows) * warp_bytes}, scores.options().dtype(at::kByte));
    if (shared_bytes > 48 * 1024) {
      C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(shared_bytes)));
    }
    for (int64_t begin = 0; begin < num_rows; begin += chunk) {
      const int64_t rows_now = std::min(chunk, num_rows - begin);
      const auto blocks = static_cast<unsigned int>((rows_now + warps - 1) / warps);
      kernel<<<blocks, static_cast<unsigned int>(warps * 32), shared_bytes, c10::cuda::getCurrentCUDAStream()>>>(
          in.scores.data_ptr<scalar_t>() + begin * cols, in.exclusions.rows.data_ptr<int64_t>() + begin, rows_now, cols, in.exclusions.sets,
          k, static_cast<int>(warps),
          scratch.defined() ? reinterpret_cast<RankedColumn<acc_t>*>(scratch.data_ptr()) : nullptr,
          values.data_ptr<scalar_t>() + begin * k, columns.data_ptr<int64_t>() + begin * k, saw_nan.data_ptr<int>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
  });
  // a read-back: not while a CUDA graph is captured (checks.h, host_read_back_allowed)
  TORCH_CHECK_VALUE(!host_read_back_allowed(saw_nan) || saw_nan.item<int>() == 0, op,
                    ": scores have a NaN at a column that is not excluded");
  return {values, columns};
}

}  // namespace
}  // namespace pnn_fast

TORCH_LIBRARY_IMPL(pnn_fast, CUDA, m) {
  m.impl("masked_topk", &pnn_fast::masked_topk_cuda);
}
