// pnn_fast::csr_spmm on CUDA: (addend + A @ x) / divisor, one warp per row of A, its lanes across d
// (coalesced loads of each entry's row of x), each output element its entries' chain of madd
// (pnn_rows.h) in stored order, as on the CPU; no atomics, so the result is deterministic.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "common/csr_spmm.h"
#include "common/dispatch.h"
#include "cuda/cuda_rows.cuh"

namespace pnn_fast {
namespace {

template <typename scalar_t, typename acc_t>
__global__ void csr_spmm_kernel(const int64_t* indptr, const int64_t* indices, const scalar_t* values,
                                const scalar_t* X, const scalar_t* Z, acc_t divisor, int64_t rows, int64_t d,
                                scalar_t* Y) {
  const int64_t r = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;  // a whole warp: blocks hold whole warps
  const int64_t first = indptr[r], last = indptr[r + 1];
  for (int64_t k = lane; k < d; k += 32) {
    acc_t acc = 0;
    for (int64_t e = first; e < last; ++e) acc = madd(acc_t(values[e]), acc_t(X[indices[e] * d + k]), acc);
    if (Z != nullptr) acc = acc_t(Z[r * d + k]) + acc;
    Y[r * d + k] = static_cast<scalar_t>(divisor != acc_t(1) ? acc / divisor : acc);
  }
}

at::Tensor csr_spmm_cuda(const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& values,
                         const at::Tensor& x, const std::optional<at::Tensor>& addend, double divisor) {
  constexpr const char* op = "pnn_fast::csr_spmm";
  const CsrSpmmInputs in = prepare_csr_spmm(op, indptr, indices, values, x, addend, divisor);
  const c10::cuda::CUDAGuard guard(x.device());
  check_ids_below(op, in.indices, in.x.size(0), "indices");
  const int64_t rows = in.indptr.numel() - 1, d = in.x.size(1);
  at::Tensor out = at::empty({rows, d}, in.x.options());
  PNN_DISPATCH_FLOATING_TYPES(in.x.scalar_type(), op, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    launch_flat(csr_spmm_kernel<scalar_t, acc_t>, rows * 32, in.indptr.data_ptr<int64_t>(),
                in.indices.data_ptr<int64_t>(), in.values.data_ptr<scalar_t>(), in.x.data_ptr<scalar_t>(),
                in.addend.defined() ? in.addend.data_ptr<scalar_t>() : nullptr, static_cast<acc_t>(divisor), rows,
                d, out.data_ptr<scalar_t>());
  });
  return out;
}

}  // namespace
}  // namespace pnn_fast

TORCH_LIBRARY_IMPL(pnn_fast, CUDA, m) {
  m.impl("csr_spmm", &pnn_fast::csr_spmm_cuda);
}
