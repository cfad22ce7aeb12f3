// pnn_fast::csr_spmm on CPU: (addend + A @ x) / divisor for a CSR matrix A and dense tables, the graph
// models' propagation.  With the addend and the divisor LightGCN's mean of layers is two products and
// nothing else (models/graph.py, layer_mean): torch's CSR product leaves the sums and the division to
// three more passes over [N, d] tables, forward and backward.  The rows a few entries ahead are
// prefetched (a random row of x per stored entry), and each index is checked in the same pass (a
// separate check of Gowalla's 1.69 M indices took about 3 ms a call, four calls a step).  Each output
// row is its entries' products summed in stored order by pnn_rows.h's madd (multiply then add on the
// host, so the bits depend neither on the thread count nor on the instruction set; an fma on CUDA,
// the same to rounding).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <vector>

#include "common/csr_spmm.h"
#include "common/dispatch.h"
#include "cpu/cpu_rows.h"
#include "cpu/simd.h"

namespace pnn_fast {
namespace {

// Multiply-adds a task stands for: enough to outweigh scheduling it, few enough to balance 2-64 threads.
constexpr int64_t kMultiplyAddsPerTask = int64_t{1} << 18;

// The first row of task t of `tasks`: the first row starting at or after entry t * nnz / tasks, so that
// the tasks cut the entries, not the rows, evenly (graph degrees are long-tailed); rows of no entries
// go with the task before them.
int64_t first_row_of_task(const int64_t* indptr, int64_t rows, int64_t nnz, int64_t tasks, int64_t t) {
  if (t >= tasks) return rows;
  const int64_t entry = nnz / tasks * t + nnz % tasks * t / tasks;  // t * nnz / tasks without overflow
  return std::lower_bound(indptr, indptr + rows, entry) - indptr;
}

at::Tensor csr_spmm_cpu(const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& values,
                        const at::Tensor& x, const std::optional<at::Tensor>& addend, double divisor) {
  constexpr const char* op = "pnn_fast::csr_spmm";
  const CsrSpmmInputs in = prepare_csr_spmm(op, indptr, indices, values, x, addend, divisor);
  const int64_t rows = in.indptr.numel() - 1, m = in.x.size(0), d = in.x.size(1), nnz = in.indices.numel();
  at::Tensor out = at::empty({rows, d}, in.x.options());
  std::atomic<bool> index_outside{false};
  PNN_DISPATCH_FLOATING_TYPES(in.x.scalar_type(), op, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const int64_t* ptr = in.indptr.data_ptr<int64_t>();
    const int64_t* col = in.indices.data_ptr<int64_t>();
    const scalar_t* val = in.values.data_ptr<scalar_t>();
    const scalar_t* X = in.x.data_ptr<scalar_t>();
    const scalar_t* Z = in.addend.defined() ? in.addend.data_ptr<scalar_t>() : nullptr;
    const acc_t div = static_cast<acc_t>(divisor);
    scalar_t* Y = out.data_ptr<scalar_t>();
    const int64_t tasks = std::max<int64_t>(1, std::min<int64_t>(rows, nnz * d / kMultiplyAddsPerTask));
    at::parallel_for(0, tasks, 1, [&](int64_t task_begin, int64_t task_end) {
      const int64_t begin = first_row_of_task(ptr, rows, nnz, tasks, task_begin);
      const int64_t end = first_row_of_task(ptr, rows, nnz, tasks, task_end);
      const int64_t last = ptr[end];
      std::vector<acc_t> row_sum(d);
      bool outside = false;
      run_widest([&]() PNN_INLINE_LAMBDA {
        acc_t* __restrict acc = row_sum.data();
        for (int64_t r = begin; r < end; ++r) {
          std::fill(acc, acc + d, acc_t(0));
          for (int64_t e = ptr[r]; e < ptr[r + 1]; ++e) {
            if (e + kPrefetchAhead < last) {
              const int64_t ahead = col[e + kPrefetchAhead];
              if (ahead >= 0 && ahead < m) prefetch_row(X + ahead * d, d);
            }
            const int64_t c = col[e];
            if (c < 0 || c >= m) {
              outside = true;
              continue;
            }
            const acc_t w = acc_t(val[e]);
            const scalar_t* __restrict v = X + c * d;
            for (int64_t k = 0; k < d; ++k) acc[k] = madd(w, acc_t(v[k]), acc[k]);
          }
          if (Z != nullptr) {
            const scalar_t* __restrict z = Z + r * d;
            for (int64_t k = 0; k < d; ++k) acc[k] = acc_t(z[k]) + acc[k];
          }
          scalar_t* __restrict y = Y + r * d;
          if (div != acc_t(1)) {
            for (int64_t k = 0; k < d; ++k) y[k] = static_cast<scalar_t>(acc[k] / div);
          } else {
            for (int64_t k = 0; k < d; ++k) y[k] = static_cast<scalar_t>(acc[k]);
          }
        }
      });
      if (outside) index_outside.store(true, std::memory_order_relaxed);
    });
  });
  TORCH_CHECK(!index_outside.load(), op, ": indices has ids outside [0, ", m, ")");
  return out;
}

}  // namespace
}  // namespace pnn_fast

TORCH_LIBRARY_IMPL(pnn_fast, CPU, m) {
  m.impl("csr_spmm", &pnn_fast::csr_spmm_cpu);
}
