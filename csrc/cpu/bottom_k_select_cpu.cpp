// pnn_fast::bottom_k_select on CPU: per row, the scores of U_b go through the radix select of
// cpu_rows.h (the steps of the CUDA kernel); O(C) scratch per task.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "common/checks.h"
#include "common/dispatch.h"
#include "cpu/cpu_rows.h"

namespace pnn_fast {
namespace {

std::tuple<at::Tensor, at::Tensor> bottom_k_select_cpu(const at::Tensor& user_emb, const at::Tensor& item_table,
                                                       const at::Tensor& users, const at::Tensor& pos_items,
                                                       const at::Tensor& candidates, const at::Tensor& known_indptr,
                                                       const at::Tensor& known_indices, const at::Tensor& k) {
  constexpr const char* op = "pnn_fast::bottom_k_select";
  const RowInputs in =
      prepare_row_inputs(op, user_emb, item_table, users, pos_items, candidates, known_indptr, known_indices);
  check_id_ranges(op, in);
  const at::Tensor k_in = row_state(op, in, k, "k", at::kLong);
  at::Tensor threshold = at::empty({in.rows}, user_emb.options().dtype(opmath_dtype(user_emb.scalar_type())));
  at::Tensor cutoff = at::empty({in.rows}, users.options().dtype(at::kLong));
  const int64_t* k_ptr = k_in.data_ptr<int64_t>();
  int64_t* cutoff_out = cutoff.data_ptr<int64_t>();
  PNN_DISPATCH_FLOATING_TYPES(in.user_emb.scalar_type(), op, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const RowBatch<scalar_t> batch = row_batch<scalar_t>(in);
    const CandidateSet<scalar_t, acc_t> set(batch);
    acc_t* threshold_out = threshold.data_ptr<acc_t>();
    at::parallel_for(0, in.rows, row_grain(in.num_candidates, in.dim), [&](int64_t begin, int64_t end) {
      RowScan<scalar_t, acc_t> scan(set);
      BottomK<acc_t> bottom;
      for (int64_t b = begin; b < end; ++b) {
        scan.load(Row<scalar_t, acc_t>(batch, b));
        bottom.select(scan.keys(), in.num_candidates, k_ptr[b], threshold_out[b], cutoff_out[b]);
      }
    });
  });
  return {threshold, cutoff};
}

}  // namespace
}  // namespace pnn_fast

TORCH_LIBRARY_IMPL(pnn_fast, CPU, m) { m.impl("bottom_k_select", &pnn_fast::bottom_k_select_cpu); }
