// pnn_fast::masked_topk on CPU: each row's k best columns in one pass over its scores, the
// excluded columns looked up only for the few scores that could enter (common/topk_row.h).
//
// A long row starts from a threshold sampled from its scores, and only the columns above the
// threshold are buffered (cpu/topk_scan.h).  Rows run in parallel, one buffer per task.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <vector>

#include "common/checks.h"
#include "common/dispatch.h"
#include "common/topk_row.h"
#include "cpu/topk_scan.h"

namespace pnn_fast {
namespace {

// One user's excluded columns as bits: the sample skips them, and a buffered column is looked up
// in one load, where the sorted rows' cursors (topk_row.h, the CUDA lanes') walked every exclusion
// of the row up to it.  Words are set for a row and cleared after it, touching only the words of
// its exclusions.  An exclusion outside [0, cols) matches no column (the op does not check them):
// it sets no bit.
class ExcludedBits {
 public:
  explicit ExcludedBits(int64_t cols) : cols_(cols), words_((cols + 63) / 64, 0) {}

  void mark(const ExclusionSets& sets, int64_t user) { visit(sets, user, true); }
  void clear(const ExclusionSets& sets, int64_t user) { visit(sets, user, false); }
  bool excludes(int64_t column) const { return (words_[column >> 6] >> (column & 63)) & 1u; }

 private:
  void visit(const ExclusionSets& sets, int64_t user, bool marking) {
    for (int s = 0; s < sets.sets; ++s) {
      for (int64_t at = sets.indptr[s][user]; at < sets.indptr[s][user + 1]; ++at) {
        const int64_t column = sets.indices[s][at];
        if (column < 0 || column >= cols_) continue;
        words_[column >> 6] = marking ? words_[column >> 6] | (uint64_t{1} << (column & 63)) : 0;
      }
    }
  }

  int64_t cols_;
  std::vector<uint64_t> words_;
};

std::tuple<at::Tensor, at::Tensor> masked_topk_cpu(const at::Tensor& scores, const at::Tensor& rows,
                                                   at::TensorList exclude_indptr, at::TensorList exclude_indices,
                                                   int64_t k) {
  constexpr const char* op = "pnn_fast::masked_topk";
  const MaskedTopkInputs in = prepare_masked_topk(op, scores, rows, exclude_indptr, exclude_indices, k);
  const int64_t num_rows = in.scores.size(0), cols = in.scores.size(1);
  at::Tensor values = at::empty({num_rows, k}, scores.options());
  at::Tensor columns = at::empty({num_rows, k}, rows.options());
  FirstNanRow first_nan_row;
  PNN_DISPATCH_FLOATING_TYPES(in.scores.scalar_type(), op, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* S = in.scores.data_ptr<scalar_t>();
    const int64_t* user = in.exclusions.rows.data_ptr<int64_t>();
    scalar_t* values_out = values.data_ptr<scalar_t>();
    int64_t* columns_out = columns.data_ptr<int64_t>();
    // grain: rows of a few thousand scores each are worth a task on their own
    at::parallel_for(0, num_rows, std::max<int64_t>(1, 16384 / cols), [&](int64_t begin, int64_t end) {
      std::vector<RankedColumn<acc_t>> buffer(buffer_capacity(k) + 1);
      std::vector<typename KeyOf<acc_t>::type> sample;
      std::vector<int32_t> positions;
      ExcludedBits excluded(cols);
      for (int64_t r = begin; r < end; ++r) {
        const scalar_t* row = S + r * cols;
        LaneTopK<acc_t> top{buffer.data(), k, buffer_capacity(k)};
        excluded.mark(in.exclusions.sets, user[r]);
        scan_row_from_sample(row, cols, top, excluded, [] {}, sample, positions);
        finish_row(r, top, excluded, values_out + r * k, columns_out + r * k, first_nan_row);
        excluded.clear(in.exclusions.sets, user[r]);
      }
    });
  });
  TORCH_CHECK_VALUE(!first_nan_row.found(), op, ": scores row ", first_nan_row.row(),
                    " has a NaN at a column that is not excluded");
  return {values, columns};
}

}  // namespace
}  // namespace pnn_fast

TORCH_LIBRARY_IMPL(pnn_fast, CPU, m) {
  m.impl("masked_topk", &pnn_fast::masked_topk_cpu);
}
