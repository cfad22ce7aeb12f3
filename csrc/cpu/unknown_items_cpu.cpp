// pnn_fast::unknown_items on CPU: the sampler's map from a uniform draw to the r-th item a user has
// not interacted with, by one binary search in the user's own CSR row.  Searches advance in lockstep
// (UnknownSearch, pnn_rows.h) so that each prefetches its next probe.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <atomic>
#include <algorithm>

#include "common/checks.h"
#include "common/dispatch.h"
#include "cpu/cpu_rows.h"

namespace pnn_fast {
namespace {

at::Tensor unknown_items_cpu(const at::Tensor& known_indptr, const at::Tensor& known_indices, const at::Tensor& users,
                             const at::Tensor& uniform, int64_t num_items) {
  constexpr const char* op = "pnn_fast::unknown_items";
  const KnownDraws in = prepare_known_draws(op, known_indptr, known_indices, users, uniform);
  check_ids_below(op, in.users, in.num_users, "users");
  at::Tensor items = at::empty(in.uniform.sizes(), users.options());
  const int64_t rows = in.rows, per_row = in.per_row;
  const int64_t* ptr = in.indptr.data_ptr<int64_t>();
  const int64_t* known = in.indices.data_ptr<int64_t>();
  const int64_t* user = in.users.data_ptr<int64_t>();
  const float* u = in.uniform.data_ptr<float>();
  int64_t* out = items.data_ptr<int64_t>();
  std::atomic<bool> bad{false};
  // Entries t = b * per_row + k in groups of kLockstep searches advanced together: each step of
  // every search prefetches its next probe, so the cache misses of the group overlap.
  constexpr int64_t kLockstep = 32;
  at::parallel_for(0, rows * per_row, kLockstep * 64, [&](int64_t begin, int64_t end) {
    UnknownSearch search[kLockstep];
    for (int64_t group = begin; group < end; group += kLockstep) {
      const int64_t size = std::min(kLockstep, end - group);
      for (int64_t g = 0; g < size; ++g) {
        const int64_t t = group + g, first = ptr[user[t / per_row]];
        const int64_t count = ptr[user[t / per_row] + 1] - first, free = num_items - count;
        const float draw = u[t];
        if (free <= 0 || !(draw >= 0.0f && draw < 1.0f)) {
          bad = true;
          search[g] = UnknownSearch(known, 0, -1);  // done at once; item() is -1
          continue;
        }
        search[g] = UnknownSearch(known + first, count, rank_of_uniform(draw, free));
        if (!search[g].done()) prefetch(search[g].probe());
      }
      for (bool active = true; active;) {
        active = false;
        for (int64_t g = 0; g < size; ++g) {
          if (search[g].done()) continue;
          search[g].step();
          if (!search[g].done()) {
            prefetch(search[g].probe());
            active = true;
          }
        }
      }
      for (int64_t g = 0; g < size; ++g) out[group + g] = search[g].item();
    }
  });
  TORCH_CHECK(!bad, op, ": uniform must lie in [0, 1) and every user must have an unknown item");
  return items;
}

}  // namespace
}  // namespace pnn_fast

TORCH_LIBRARY_IMPL(pnn_fast, CPU, m) {
  m.impl("unknown_items", &pnn_fast::unknown_items_cpu);
}
