// Per-row selection of pnn_fast::lowest_k_mask, shared by the CPU (.cpp) and CUDA (.cu) kernels.
//
// A row's scores are ordered as torch.sort orders them (order_key: -0.0 equals +0.0, NaN above
// +inf), equal scores by ascending column, so "the k lowest" is one well-defined set of columns on
// every backend and the same set as a stable argsort's first k.
#pragma once

#include <cstdint>

#include "common/pnn_rows.h"
#include "common/quickselect.h"

namespace pnn_fast {

// One entry of a row's selection: a score's order key and its column (< 2^31, checked on entry),
// 8 bytes for float keys and 16 for double keys.
template <typename key_t>
struct KeyedColumn {
  key_t key;
  int32_t column;
};

// a before b: a lower key, or the same key at a lower column.  Bitwise operators: the quickselect's
// partition must not branch on the comparison (quickselect.h).
struct KeyThenColumn {
  template <typename key_t>
  PNN_HD bool operator()(const KeyedColumn<key_t>& a, const KeyedColumn<key_t>& b) const {
    return (a.key < b.key) | ((a.key == b.key) & (a.column < b.column));
  }
};

// mask[j] = whether column j is among the k lowest of scores[0, count), in O(count) expected time;
// scratch holds count entries.  k is clamped to [0, count]: the entry points check its range, but
// not where reading it back is not allowed (CUDA graph capture), and memory must stay safe there.  acc_t: float for float16, bfloat16 and
// float32 scores (exact: those convert to float without rounding), double for double.
template <typename scalar_t, typename acc_t>
PNN_HD inline void lowest_k_row(const scalar_t* scores, int64_t count, int64_t k,
                                KeyedColumn<typename KeyOf<acc_t>::type>* scratch, bool* mask) {
  k = k < 0 ? 0 : (k > count ? count : k);
  for (int64_t j = 0; j < count; ++j) {
    scratch[j] = {order_key(static_cast<acc_t>(scores[j])), static_cast<int32_t>(j)};
    mask[j] = k == count;
  }
  if (k == 0 || k == count) return;
  select_first(scratch, count, k, KeyThenColumn{});
  for (int64_t i = 0; i < k; ++i) mask[scratch[i].column] = true;
}

}  // namespace pnn_fast
