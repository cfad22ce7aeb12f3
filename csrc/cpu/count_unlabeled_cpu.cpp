// pnn_fast::count_unlabeled on CPU: |U_b| without scoring anything.  A shared candidate list is
// searched once per row for its labeled candidates (CandidateSet::for_each_labeled).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "common/checks.h"
#include "common/dispatch.h"
#include "cpu/cpu_rows.h"

namespace pnn_fast {
namespace {

at::Tensor count_unlabeled_cpu(const at::Tensor& user_emb, const at::Tensor& item_table, const at::Tensor& users,
                               const at::Tensor& pos_items, const at::Tensor& candidates,
                               const at::Tensor& known_indptr, const at::Tensor& known_indices) {
  constexpr const char* op = "pnn_fast::count_unlabeled";
  const RowInputs in =
      prepare_row_inputs(op, user_emb, item_table, users, pos_items, candidates, known_indptr, known_indices);
  check_id_ranges(op, in);
  at::Tensor num_unlabeled = at::empty({in.rows}, users.options().dtype(at::kLong));
  int64_t* count_out = num_unlabeled.data_ptr<int64_t>();
  PNN_DISPATCH_FLOATING_TYPES(in.user_emb.scalar_type(), op, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const RowBatch<scalar_t> batch = row_batch<scalar_t>(in);
    const CandidateSet<scalar_t, acc_t> set(batch);
    at::parallel_for(0, in.rows, row_grain(in.num_candidates, 1), [&](int64_t begin, int64_t end) {
      std::vector<uint8_t> flags(set.shared ? 0 : in.num_candidates);
      for (int64_t b = begin; b < end; ++b) {
        const Row<scalar_t, acc_t> row(batch, b);
        int64_t count = 0;
        if (set.shared) {
          set.for_each_labeled(row, [&](int64_t) { ++count; });
          count = in.num_candidates - count;
        } else {
          unlabeled_flags(row, row.candidates, in.num_candidates, flags.data());
          for (const uint8_t flag : flags) count += flag;
        }
        count_out[b] = count;
      }
    });
  });
  return num_unlabeled;
}

}  // namespace
}  // namespace pnn_fast

TORCH_LIBRARY_IMPL(pnn_fast, CPU, m) { m.impl("count_unlabeled", &pnn_fast::count_unlabeled_cpu); }
