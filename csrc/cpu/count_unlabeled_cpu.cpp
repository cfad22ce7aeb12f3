// pnn_fast::count_unlabeled on CPU: |U_b| without scoring anything.  With a shared candidate list,
// |U_b| = C minus the list's occurrences of the row's known items and positive, summed from a
// table of each item's multiplicity in the list: no branch per known item (walking each item's
// positions, as the classes need, mispredicted on the 60% of known items absent from the batch).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <vector>

#include "common/checks.h"
#include "common/dispatch.h"
#include "cpu/cpu_rows.h"

namespace pnn_fast {
namespace {

at::Tensor count_unlabeled_cpu(const at::Tensor& user_emb, const at::Tensor& item_table, const at::Tensor& users,
                               const at::Tensor& pos_items, const at::Tensor& candidates,
                               const at::Tensor& known_indptr, const at::Tensor& known_indices) {
  constexpr const char* op = "pnn_fast::count_unlabeled";
  RowInputs in =
      prepare_row_inputs(op, user_emb, item_table, users, pos_items, candidates, known_indptr, known_indices);
  check_id_ranges(op, in);
  at::Tensor num_unlabeled = at::empty({in.rows}, users.options().dtype(at::kLong));
  int64_t* count_out = num_unlabeled.data_ptr<int64_t>();
  PNN_DISPATCH_FLOATING_TYPES(in.user_emb.scalar_type(), op, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const RowBatch<scalar_t> batch = row_batch<scalar_t>(in);
    // C < 2^31 (prepare_row_inputs): int32 multiplicities
    std::vector<int32_t> multiplicity(in.shared ? in.item_table.size(0) : 0, 0);
    for (int64_t j = 0; in.shared && j < in.num_candidates; ++j) ++multiplicity[batch.candidates[j]];
    at::parallel_for(0, in.rows, row_grain(in.num_candidates, 1), [&](int64_t begin, int64_t end) {
      std::vector<uint8_t> flags(in.shared ? 0 : in.num_candidates);
      for (int64_t b = begin; b < end; ++b) {
        const Row<scalar_t, acc_t> row(batch, b);
        int64_t count = 0;
        if (in.shared) {
          for (int64_t i = 0; i < row.num_known; ++i) count += multiplicity[row.known[i]];
          if (!sorted_contains(row.known, row.num_known, row.pos_item)) count += multiplicity[row.pos_item];
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
