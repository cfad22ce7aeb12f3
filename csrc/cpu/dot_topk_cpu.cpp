// pnn_fast::dot_topk on CPU: each user row's k best items by dot product with the item table,
// without the [T, I] scores: the products are computed a block of items at a time into one
// cache-sized buffer, and each row's LaneTopK (common/topk_row.h) is kept from block to block.
//
// Why a kernel rather than masked_topk over chunks of items: every block streams its items from
// memory once for all T rows, so the product's rate rises with T, while masked_topk needs its
// scores still in cache, which bounded T to 128 (tiles of 128 x 16,384 scores, 8 MB); the
// products then ran at about 65% of a cache-resident product's rate over 2M items.  Here T is
// the whole batch and the block is narrow instead (T x width scores, a few MB),
// and a row's threshold carries over from block to block, so after the first block hardly a
// column is buffered, and no chunk lists are merged.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <ATen/Parallel.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

#include "common/checks.h"
#include "common/dispatch.h"
#include "common/topk_row.h"
#include "cpu/topk_scan.h"

namespace pnn_fast {
namespace {

// Scores a block holds when its width is left to the op: 4 MB of float32, 1,024 items for a
// batch of 1,024 users.  At one thread widths from 256 to 2,048 items ranked 2M items within noise
// of each other (1.0-1.1 s for 512 users), and 1,024 was the fastest on ML-1M (3,706 items).  The
// width is clipped to [kMinBlockItems, kMaxBlockItems]: a narrower product loses its rate to the
// call's overhead, and a wider one gains nothing.
constexpr int64_t kBlockScores = int64_t{1} << 20;
constexpr int64_t kMinBlockItems = 256;
constexpr int64_t kMaxBlockItems = 8192;

int64_t block_width(int64_t rows, int64_t items, int64_t block_items) {
  const int64_t automatic = std::clamp(kBlockScores / std::max<int64_t>(rows, 1), kMinBlockItems, kMaxBlockItems);
  return std::min(block_items > 0 ? block_items : automatic, items);
}

std::tuple<at::Tensor, at::Tensor> dot_topk_cpu(const at::Tensor& user_rows, const at::Tensor& item_table,
                                                const at::Tensor& rows, at::TensorList exclude_indptr,
                                                at::TensorList exclude_indices, int64_t k, int64_t block_items) {
  constexpr const char* op = "pnn_fast::dot_topk";
  TORCH_CHECK(user_rows.dim() == 2 && at::isFloatingType(user_rows.scalar_type()), op,
              ": user_rows must be a floating-point [T, d] tensor, got ", user_rows.scalar_type(), " ",
              user_rows.sizes());
  check_tensor(op, user_rows, item_table, "item_table", user_rows.scalar_type(), {-1, user_rows.size(1)}, "user_rows");
  const int64_t num_rows = user_rows.size(0), num_items = item_table.size(0);
  TORCH_CHECK_VALUE(k >= 1 && k <= num_items, op, ": k must lie in [1, I] = [1, ", num_items, "], got ", k);
  TORCH_CHECK_VALUE(block_items >= 0, op, ": block_items must be >= 0 (0: the op's choice), got ", block_items);
  const ExclusionInputs in = prepare_exclusions(op, user_rows, "user_rows", rows, exclude_indptr, exclude_indices);
  at::Tensor values = at::empty({num_rows, k}, user_rows.options());
  at::Tensor columns = at::empty({num_rows, k}, rows.options());
  if (num_rows == 0) return {values, columns};
  const int64_t width = block_width(num_rows, num_items, block_items);
  FirstNanRow first_nan_row;
  PNN_DISPATCH_FLOATING_TYPES(user_rows.scalar_type(), op, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    using key_t = typename KeyOf<acc_t>::type;
    const int64_t capacity = buffer_capacity(k);
    // each row's top-k state, kept across the blocks: its buffer, its LaneTopK and the cursors of
    // its exclusions (its columns ascend across the blocks, so the cursors only move forward)
    std::vector<RankedColumn<acc_t>> buffers(num_rows * (capacity + 1));
    std::vector<LaneTopK<acc_t>> tops;
    std::vector<ExclusionCursors> cursors(num_rows);
    tops.reserve(num_rows);
    const int64_t* user = in.rows.data_ptr<int64_t>();
    for (int64_t r = 0; r < num_rows; ++r) {
      tops.push_back(LaneTopK<acc_t>{buffers.data() + r * (capacity + 1), k, capacity});
      cursors[r] = in.sets.of_user(user[r]);
    }
    const at::Tensor block = at::empty({num_rows * width}, user_rows.options());
    for (int64_t first = 0; first < num_items; first += width) {
      const int64_t n = std::min(width, num_items - first);
      at::Tensor scores = block.narrow(0, 0, num_rows * n).view({num_rows, n});
      // the op is not differentiable: its product must not meet autograd, which refuses an out=
      // product of tables that require grad (a model's weights)
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      at::mm_out(scores, user_rows, item_table.narrow(0, first, n).t());
      const scalar_t* S = scores.const_data_ptr<scalar_t>();
      // grain: rows of a few thousand scores each are worth a task on their own
      at::parallel_for(0, num_rows, std::max<int64_t>(1, 16384 / n), [&](int64_t begin, int64_t end) {
        std::vector<key_t> sample;
        std::vector<int32_t> positions;
        for (int64_t r = begin; r < end; ++r) {
          if (first == 0) {
            const ExclusionCursors start = cursors[r];
            scan_row_from_sample(S + r * n, n, tops[r], cursors[r], [&] { cursors[r] = start; }, sample, positions);
          } else {
            scan_row(S + r * n, n, first, tops[r], cursors[r], positions);
          }
        }
      });
    }
    scalar_t* values_out = values.data_ptr<scalar_t>();
    int64_t* columns_out = columns.data_ptr<int64_t>();
    at::parallel_for(0, num_rows, 64, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        finish_row(r, tops[r], cursors[r], values_out + r * k, columns_out + r * k, first_nan_row);
      }
    });
  });
  TORCH_CHECK_VALUE(!first_nan_row.found(), op, ": the scores of user_rows row ", first_nan_row.row(),
                    " have a NaN at an item that is not excluded");
  return {values, columns};
}

}  // namespace
}  // namespace pnn_fast

TORCH_LIBRARY_IMPL(pnn_fast, CPU, m) {
  m.impl("dot_topk", &pnn_fast::dot_topk_cpu);
}
