// pnn_fast::lowest_k_mask on CPU: each row's k lowest scores, rows in parallel, by a quickselect
// (common/quickselect.h) of its (order key, column) pairs: the k lowest pairs in the order of
// pnn_rows.h (order_key, in_bottom_k), the set the CUDA kernel's block radix select marks.  (Marking
// by in_bottom_k against the k-th pair, as CUDA does, made this op 1.5x slower here: a second pass
// over the row where the k members' stores suffice.)  SL with PNN's classes (objectives/sl.py)
// splits its 800 sampled negatives a row this way; the stable argsort it replaces was over half of
// that training step (67 of 121 ms at B = 2048, K = 800, one thread).
#include <ATen/core/Tensor.h>
#include <ATen/OpMathType.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

#include "common/checks.h"
#include "common/dispatch.h"
#include "common/pnn_rows.h"
#include "common/quickselect.h"

namespace pnn_fast {
namespace {

// A score's order key and its column (< 2^31, checked on entry): 8 bytes for float keys, 16 for double.
template <typename key_t>
struct KeyedColumn {
  key_t key;
  int32_t column;
};

// a before b: a lower key, or the same key at a lower column.  Bitwise operators: the quickselect's
// partition must not branch on the comparison (quickselect.h).
struct KeyThenColumn {
  template <typename key_t>
  bool operator()(const KeyedColumn<key_t>& a, const KeyedColumn<key_t>& b) const {
    return (a.key < b.key) | ((a.key == b.key) & (a.column < b.column));
  }
};

// mask[j] = whether column j is among the k lowest of scores[0, count), k clamped to [0, count]
// (the entry point checks its range, but memory must stay safe where it cannot: CUDA graph capture
// on the other backend, and callers of this function).  scratch holds count entries.
template <typename scalar_t, typename acc_t>
void lowest_k_row(const scalar_t* scores, int64_t count, int64_t k, KeyedColumn<typename KeyOf<acc_t>::type>* scratch,
                  bool* mask) {
  k = std::clamp<int64_t>(k, 0, count);
  for (int64_t j = 0; j < count; ++j) {
    scratch[j] = {order_key(static_cast<acc_t>(scores[j])), static_cast<int32_t>(j)};
    mask[j] = false;
  }
  if (k == 0) return;
  if (k < count) select_first(scratch, count, k, KeyThenColumn{});  // scratch[0, k): the k lowest pairs
  for (int64_t i = 0; i < k; ++i) mask[scratch[i].column] = true;
}

at::Tensor lowest_k_mask_cpu(const at::Tensor& scores, const at::Tensor& k) {
  const LowestKInputs in = prepare_lowest_k_mask("pnn_fast::lowest_k_mask", scores, k);
  const int64_t rows = in.scores.size(0), count = in.scores.size(1);
  at::Tensor mask = at::empty(in.scores.sizes(), in.scores.options().dtype(at::kBool));
  const int64_t* sizes = in.k.data_ptr<int64_t>();
  bool* out = mask.data_ptr<bool>();
  PNN_DISPATCH_FLOATING_TYPES(in.scores.scalar_type(), "lowest_k_mask_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* score = in.scores.data_ptr<scalar_t>();
    at::parallel_for(0, rows, std::max<int64_t>(1, 4096 / std::max<int64_t>(count, 1)), [&](int64_t begin, int64_t end) {
      std::vector<KeyedColumn<typename KeyOf<acc_t>::type>> scratch(count);
      for (int64_t b = begin; b < end; ++b) {
        lowest_k_row<scalar_t, acc_t>(score + b * count, count, sizes[b], scratch.data(), out + b * count);
      }
    });
  });
  return mask;
}

}  // namespace
}  // namespace pnn_fast

TORCH_LIBRARY_IMPL(pnn_fast, CPU, m) {
  m.impl("lowest_k_mask", &pnn_fast::lowest_k_mask_cpu);
}
