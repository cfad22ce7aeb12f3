// pnn_fast::history_sample on CPU: a uniform random subset of each user's known items by Floyd's
// algorithm (floyd_positions, pnn_rows.h), the positions taken kept in a bitmap over the user's
// items: O(L + N_u / 64) a row, where the scan of the positions taken so far (the CUDA kernel's
// record) made it O(L^2), about 1.5 ms of an ML-1M in-batch step at L = 50.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <atomic>
#include <cstdint>
#include <vector>

#include "common/checks.h"
#include "common/dispatch.h"
#include "cpu/cpu_rows.h"

namespace pnn_fast {
namespace {

// Floyd's record of the positions taken, one bit per item of the user; clear() unsets the bits of
// the positions written, so that the next row starts from an empty map without a full reset.
class PositionBitmap {
 public:
  void reserve(int64_t n) {
    if (static_cast<int64_t>(words_.size()) * 64 < n) words_.resize((n + 63) / 64, 0);
  }
  bool contains(int64_t t, const int64_t*, int64_t) const { return (words_[t >> 6] >> (t & 63)) & 1u; }
  void add(int64_t t) { words_[t >> 6] |= uint64_t{1} << (t & 63); }
  void clear(const int64_t* taken, int64_t count) {
    for (int64_t i = 0; i < count; ++i) words_[taken[i] >> 6] = 0;
  }

 private:
  std::vector<uint64_t> words_;
};

at::Tensor history_sample_cpu(const at::Tensor& known_indptr, const at::Tensor& known_indices, const at::Tensor& users,
                              const at::Tensor& uniform) {
  constexpr const char* op = "pnn_fast::history_sample";
  KnownDraws in = prepare_known_draws(op, known_indptr, known_indices, users, uniform);
  in.users = ids_in_range(op, in.users, in.num_users, "users");
  at::Tensor items = at::empty(in.uniform.sizes(), users.options());
  const int64_t size = in.per_row;
  const int64_t* ptr = in.indptr.data_ptr<int64_t>();
  const int64_t* known = in.indices.data_ptr<int64_t>();
  const int64_t* user = in.users.data_ptr<int64_t>();
  const float* u = in.uniform.data_ptr<float>();
  int64_t* out = items.data_ptr<int64_t>();
  std::atomic<bool> bad{false};
  at::parallel_for(0, in.rows, lookup_grain(size * size), [&](int64_t begin, int64_t end) {
    PositionBitmap seen;
    for (int64_t b = begin; b < end; ++b) {
      const float* draws = u + b * size;
      int64_t* row = out + b * size;  // positions first, then the items at them
      bool row_ok = true;
      for (int64_t i = 0; i < size; ++i) row_ok &= draws[i] >= 0.0f && draws[i] < 1.0f;
      if (!row_ok) {  // a draw outside [0, 1) (or NaN) would give a position outside the row: reported below
        bad = true;
        for (int64_t i = 0; i < size; ++i) row[i] = -1;
        continue;
      }
      const int64_t first = ptr[user[b]], n = ptr[user[b] + 1] - first;
      seen.reserve(n);
      const int64_t taken = floyd_positions(n, size, draws, row, seen);
      if (n > size) seen.clear(row, taken);  // (n <= size takes every position without the map)
      for (int64_t i = 0; i < taken; ++i) row[i] = known[first + row[i]];
      for (int64_t i = taken; i < size; ++i) row[i] = -1;
    }
  });
  record_input_error(op, "uniform must lie in [0, 1)", at::scalar_tensor(bad.load(), at::kBool));
  return items;
}

}  // namespace
}  // namespace pnn_fast

TORCH_LIBRARY_IMPL(pnn_fast, CPU, m) {
  m.impl("history_sample", &pnn_fast::history_sample_cpu);
}
