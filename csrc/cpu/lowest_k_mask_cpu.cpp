// pnn_fast::lowest_k_mask on CPU: each row's k lowest scores by the quickselect of lowest_k_row
// (common/lowest_k_row.h), rows in parallel, one scratch row per thread.  SL with PNN's classes
// (objectives/sl.py) splits its 800 sampled negatives of every row this way; the stable argsort it
// replaces was over half of that training step (67 of 121 ms at B = 2048, K = 800, one thread).
#include <ATen/core/Tensor.h>
#include <ATen/OpMathType.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

#include "common/checks.h"
#include "common/dispatch.h"
#include "common/lowest_k_row.h"

namespace pnn_fast {
namespace {

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
