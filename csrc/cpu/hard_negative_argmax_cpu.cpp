// pnn_fast::hard_negative_argmax on CPU: each task scores one row at a time into a scratch of C
// values, so no [B, C] buffer exists.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <tuple>

#include "common/checks.h"
#include "common/dispatch.h"
#include "cpu/cpu_rows.h"

namespace pnn_fast {
namespace {

std::tuple<at::Tensor, at::Tensor> hard_negative_argmax_cpu(const at::Tensor& user_emb, const at::Tensor& item_table,
                                                            const at::Tensor& users, const at::Tensor& pos_items,
                                                            const at::Tensor& candidates,
                                                            const at::Tensor& known_indptr,
                                                            const at::Tensor& known_indices) {
  constexpr const char* op = "pnn_fast::hard_negative_argmax";
  RowInputs in =
      prepare_row_inputs(op, user_emb, item_table, users, pos_items, candidates, known_indptr, known_indices);
  check_id_ranges(op, in);
  at::Tensor hard = at::empty({in.rows}, users.options().dtype(at::kLong));
  at::Tensor num_unlabeled = at::empty({in.rows}, users.options().dtype(at::kLong));
  int64_t* hard_out = hard.data_ptr<int64_t>();
  int64_t* count_out = num_unlabeled.data_ptr<int64_t>();
  PNN_DISPATCH_FLOATING_TYPES(in.user_emb.scalar_type(), op, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const RowBatch<scalar_t> batch = row_batch<scalar_t>(in);
    const CandidateSet<scalar_t, acc_t> set(batch);
    at::parallel_for(0, in.rows, row_grain(in.num_candidates, in.dim), [&](int64_t begin, int64_t end) {
      RowScan<scalar_t, acc_t> scan(set);
      for (int64_t b = begin; b < end; ++b) {
        scan.load(b, end);
        std::tie(hard_out[b], count_out[b]) = scan.hard_negative();
      }
    });
  });
  return {hard, num_unlabeled};
}

}  // namespace
}  // namespace pnn_fast

TORCH_LIBRARY_IMPL(pnn_fast, CPU, m) { m.impl("hard_negative_argmax", &pnn_fast::hard_negative_argmax_cpu); }
