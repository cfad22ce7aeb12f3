// The table-lookup ops on CPU: unknown_items (the sampler's rank -> item map), history_sample
// (the attention's random subsets of known items), embedding_bpr
// (BPR over table rows, forward and backward) and gathered_norm (RecBole's EmbLoss term).
//
// They replace chains of small ATen ops (gather, dot, softplus, index_add into a zeroed table)
// whose per-op overhead dominates a BPR training step.  Per-row values are computed in parallel
// and summed in row order; table gradients are scattered by column blocks (for_column_blocks), so
// every result is the same for any number of threads.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <atomic>
#include <cmath>
#include <vector>

#include "common/checks.h"
#include "common/dispatch.h"
#include "cpu/cpu_rows.h"

namespace pnn_fast {
namespace {

// Rows per task of the per-row loops: about 16K multiply-adds each.
int64_t lookup_grain(int64_t per_row) {
  return std::max<int64_t>(1, (int64_t{1} << 14) / std::max<int64_t>(1, per_row));
}

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

at::Tensor history_sample_cpu(const at::Tensor& known_indptr, const at::Tensor& known_indices, const at::Tensor& users,
                              const at::Tensor& uniform) {
  constexpr const char* op = "pnn_fast::history_sample";
  const KnownDraws in = prepare_known_draws(op, known_indptr, known_indices, users, uniform);
  check_ids_below(op, in.users, in.num_users, "users");
  at::Tensor items = at::empty(in.uniform.sizes(), users.options());
  const int64_t size = in.per_row;
  const int64_t* ptr = in.indptr.data_ptr<int64_t>();
  const int64_t* known = in.indices.data_ptr<int64_t>();
  const int64_t* user = in.users.data_ptr<int64_t>();
  const float* u = in.uniform.data_ptr<float>();
  int64_t* out = items.data_ptr<int64_t>();
  std::atomic<bool> bad{false};
  at::parallel_for(0, in.rows, lookup_grain(size * size), [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const float* draws = u + b * size;
      for (int64_t i = 0; i < size; ++i) {
        if (!(draws[i] >= 0.0f && draws[i] < 1.0f)) bad = true;
      }
      int64_t* row = out + b * size;  // positions first, then the items at them
      const int64_t first = ptr[user[b]];
      const int64_t taken = floyd_positions(ptr[user[b] + 1] - first, size, draws, row);
      for (int64_t i = 0; i < taken; ++i) row[i] = known[first + row[i]];
      for (int64_t i = taken; i < size; ++i) row[i] = -1;
    }
  });
  TORCH_CHECK(!bad, op, ": uniform must lie in [0, 1)");
  return items;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> embedding_bpr_fwd_cpu(const at::Tensor& user_table,
                                                                     const at::Tensor& item_table,
                                                                     const at::Tensor& users,
                                                                     const at::Tensor& pos_items,
                                                                     const at::Tensor& neg_items, double reg_weight) {
  constexpr const char* op = "pnn_fast::embedding_bpr_fwd";
  const LookupInputs in = prepare_embedding_bpr(op, user_table, item_table, users, pos_items, neg_items, reg_weight);
  check_ids_below(op, in.users, in.user_table.size(0), "users");
  check_ids_below(op, in.pos_items, in.item_table.size(0), "pos_items");
  check_ids_below(op, in.neg_items, in.item_table.size(0), "neg_items");
  at::Tensor loss_out = at::empty({}, in.user_table.options());
  const at::TensorOptions acc_options = in.user_table.options().dtype(opmath_dtype(in.user_table.scalar_type()));
  at::Tensor coef = at::empty({in.rows, in.negatives}, acc_options);
  at::Tensor norms = at::zeros({3}, acc_options);
  PNN_DISPATCH_FLOATING_TYPES(in.user_table.scalar_type(), op, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const BprBatch<scalar_t> batch = bpr_batch<scalar_t>(in);
    const int64_t d = batch.dim, K = batch.negatives;
    const acc_t pairs = acc_t(in.rows * K);
    acc_t* c = coef.data_ptr<acc_t>();
    std::vector<acc_t> loss(in.rows);
    std::vector<acc_t> squares(batch.regularize ? 3 * in.rows : 0);  // per row, summed in row order below
    at::parallel_for(0, in.rows, lookup_grain((K + 1) * d), [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) {
        loss[b] = bpr_row<acc_t>(batch.user_table + batch.users[b] * d, batch.item_table + batch.pos_items[b] * d,
                                 batch.item_table, batch.neg_items + b * K, K, d, pairs, c + b * K,
                                 batch.regularize ? squares.data() + 3 * b : nullptr);
      }
    });
    // rows summed in order, then the mean over the B * K pairs (NaN when there is none, as torch's mean)
    acc_t total = 0;
    for (const acc_t x : loss) total += x;
    total /= pairs;
    if (batch.regularize) {
      acc_t* n = norms.data_ptr<acc_t>();
      for (int64_t b = 0; b < in.rows; ++b) {
        for (int s = 0; s < 3; ++s) n[s] += squares[3 * b + s];
      }
      for (int s = 0; s < 3; ++s) n[s] = std::sqrt(n[s]);
      total += acc_t(reg_weight) * (n[0] + n[1] + n[2]) / acc_t(in.rows);
    }
    *loss_out.data_ptr<scalar_t>() = static_cast<scalar_t>(total);
  });
  return {loss_out, coef, norms};
}

std::tuple<at::Tensor, at::Tensor> embedding_bpr_bwd_cpu(const at::Tensor& grad, const at::Tensor& coef,
                                                         const at::Tensor& norms, const at::Tensor& user_table,
                                                         const at::Tensor& item_table, const at::Tensor& users,
                                                         const at::Tensor& pos_items, const at::Tensor& neg_items,
                                                         double reg_weight) {
  constexpr const char* op = "pnn_fast::embedding_bpr_bwd";
  const LookupInputs in = prepare_embedding_bpr(op, user_table, item_table, users, pos_items, neg_items, reg_weight);
  const at::Tensor g = scalar_grad(op, in.user_table, grad);
  const at::ScalarType acc_dtype = g.scalar_type();
  check_tensor(op, in.user_table, coef, "coef", acc_dtype, {in.rows, in.negatives}, "user_table");
  const at::Tensor coef_in = coef.contiguous();
  const at::Tensor norms_in = checked_bpr_norms(op, in, norms, acc_dtype);
  const at::TensorOptions acc_options = in.user_table.options().dtype(acc_dtype);
  at::Tensor grad_user = at::zeros(in.user_table.sizes(), acc_options);
  at::Tensor grad_item = at::zeros(in.item_table.sizes(), acc_options);
  PNN_DISPATCH_FLOATING_TYPES(in.user_table.scalar_type(), op, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const BprBatch<scalar_t> batch = bpr_batch<scalar_t>(in);
    const scalar_t *U = batch.user_table, *I = batch.item_table;
    const int64_t *user = batch.users, *pos = batch.pos_items, *neg = batch.neg_items;
    const int64_t d = batch.dim, K = batch.negatives;
    const acc_t upstream = g.item<acc_t>();
    const acc_t* c = coef_in.data_ptr<acc_t>();
    // the EmbLoss term's gradient: scale[s] * row for the rows of gathered matrix s (users, pos, neg)
    acc_t scale[3] = {0, 0, 0};
    for (int s = 0; batch.regularize && s < 3; ++s) {
      scale[s] = norm_grad_scale(upstream, acc_t(reg_weight), in.rows, norms_in.data_ptr<acc_t>()[s]);
    }
    acc_t* gU = grad_user.data_ptr<acc_t>();
    acc_t* gI = grad_item.data_ptr<acc_t>();
    for_column_blocks(d, in.rows * (K + 2), [&](int64_t c0, int64_t c1) {
      for (int64_t b = 0; b < in.rows; ++b) {
        // d loss / d s_neg_bk = upstream * c[b, k]; d loss / d s_pos_b = -their sum
        const scalar_t* u = U + user[b] * d;
        acc_t* gu = gU + user[b] * d;
        acc_t c_sum = 0;
        for (int64_t k = 0; k < K; ++k) {
          const scalar_t* n = I + neg[b * K + k] * d;
          acc_t* gn = gI + neg[b * K + k] * d;
          const acc_t ck = upstream * c[b * K + k];
          c_sum += ck;
          for (int64_t i = c0; i < c1; ++i) {
            gu[i] += ck * acc_t(n[i]);
            gn[i] += ck * acc_t(u[i]);
          }
          if (batch.regularize) {
            for (int64_t i = c0; i < c1; ++i) gn[i] += scale[2] * acc_t(n[i]);
          }
        }
        const scalar_t* p = I + pos[b] * d;
        acc_t* gp = gI + pos[b] * d;
        for (int64_t i = c0; i < c1; ++i) {
          gu[i] -= c_sum * acc_t(p[i]);
          gp[i] -= c_sum * acc_t(u[i]);
        }
        if (batch.regularize) {
          for (int64_t i = c0; i < c1; ++i) {
            gu[i] += scale[0] * acc_t(u[i]);
            gp[i] += scale[1] * acc_t(p[i]);
          }
        }
      }
    });
  });
  return {grad_user.to(in.user_table.scalar_type()), grad_item.to(in.item_table.scalar_type())};
}

at::Tensor gathered_norm_fwd_cpu(const at::Tensor& table, const at::Tensor& ids) {
  constexpr const char* op = "pnn_fast::gathered_norm_fwd";
  check_gathered_norm(op, table, ids);
  const at::Tensor rows_in = table.contiguous(), ids_in = ids.contiguous();
  check_ids_below(op, ids_in, rows_in.size(0), "ids");
  const int64_t n = ids_in.numel(), d = rows_in.size(1);
  at::Tensor norm_out = at::empty({}, table.options());
  PNN_DISPATCH_FLOATING_TYPES(rows_in.scalar_type(), op, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* T = rows_in.data_ptr<scalar_t>();
    const int64_t* id = ids_in.data_ptr<int64_t>();
    std::vector<acc_t> squares(n);
    at::parallel_for(0, n, lookup_grain(d), [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) squares[b] = dot_wide<acc_t>(T + id[b] * d, T + id[b] * d, d);
    });
    acc_t total = 0;
    for (const acc_t x : squares) total += x;
    *norm_out.data_ptr<scalar_t>() = static_cast<scalar_t>(std::sqrt(total));
  });
  return norm_out;
}

at::Tensor gathered_norm_bwd_cpu(const at::Tensor& grad, const at::Tensor& table, const at::Tensor& ids,
                                 const at::Tensor& output) {
  constexpr const char* op = "pnn_fast::gathered_norm_bwd";
  check_gathered_norm(op, table, ids);
  const at::Tensor rows_in = table.contiguous(), ids_in = ids.contiguous();
  const at::Tensor g = scalar_grad(op, rows_in, grad);
  const at::Tensor norm = scalar_grad(op, rows_in, output);
  at::Tensor grad_table = at::zeros(rows_in.sizes(), rows_in.options().dtype(g.scalar_type()));
  PNN_DISPATCH_FLOATING_TYPES(rows_in.scalar_type(), op, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const acc_t coef = norm_grad_scale(g.item<acc_t>(), acc_t(1), 1, norm.item<acc_t>());
    const scalar_t* T = rows_in.data_ptr<scalar_t>();
    const int64_t* id = ids_in.data_ptr<int64_t>();
    acc_t* gT = grad_table.data_ptr<acc_t>();
    const int64_t n = ids_in.numel(), d = rows_in.size(1);
    for_column_blocks(d, n, [&](int64_t c0, int64_t c1) {
      for (int64_t b = 0; b < n; ++b) {
        const scalar_t* row = T + id[b] * d;
        acc_t* out = gT + id[b] * d;
        for (int64_t i = c0; i < c1; ++i) out[i] += coef * acc_t(row[i]);
      }
    });
  });
  return grad_table.to(table.scalar_type());
}

at::Tensor gathered_dots_fwd_cpu(const at::Tensor& rows, const at::Tensor& table, const at::Tensor& ids) {
  constexpr const char* op = "pnn_fast::gathered_dots_fwd";
  check_gathered_dots(op, rows, table, ids);
  const at::Tensor R = rows.contiguous(), T = table.contiguous(), id = ids.contiguous();
  check_ids_below(op, id, T.size(0), "ids");
  const int64_t B = R.size(0), d = R.size(1), K = id.size(1);
  at::Tensor out = at::empty({B, K}, R.options());
  PNN_DISPATCH_FLOATING_TYPES(R.scalar_type(), op, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t *r = R.data_ptr<scalar_t>(), *t = T.data_ptr<scalar_t>();
    const int64_t* ix = id.data_ptr<int64_t>();
    scalar_t* o = out.data_ptr<scalar_t>();
    at::parallel_for(0, B, lookup_grain(K * d), [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) {
        for (int64_t k = 0; k < K; ++k) {
          o[b * K + k] = static_cast<scalar_t>(dot_wide<acc_t>(r + b * d, t + ix[b * K + k] * d, d));
        }
      }
    });
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> gathered_dots_bwd_cpu(const at::Tensor& grad, const at::Tensor& rows,
                                                         const at::Tensor& table, const at::Tensor& ids) {
  constexpr const char* op = "pnn_fast::gathered_dots_bwd";
  check_gathered_dots(op, rows, table, ids);
  const at::Tensor R = rows.contiguous(), T = table.contiguous(), id = ids.contiguous();
  const int64_t B = R.size(0), d = R.size(1), K = id.size(1);
  check_tensor(op, R, grad, "grad", R.scalar_type(), {B, K}, "rows");
  const at::Tensor g_in = grad.contiguous();
  const at::TensorOptions acc_options = R.options().dtype(opmath_dtype(R.scalar_type()));
  at::Tensor grad_rows = at::empty({B, d}, acc_options);
  at::Tensor grad_table = at::zeros(T.sizes(), acc_options);
  PNN_DISPATCH_FLOATING_TYPES(R.scalar_type(), op, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t *r = R.data_ptr<scalar_t>(), *t = T.data_ptr<scalar_t>(), *g = g_in.data_ptr<scalar_t>();
    const int64_t* ix = id.data_ptr<int64_t>();
    acc_t* gr = grad_rows.data_ptr<acc_t>();
    acc_t* gt = grad_table.data_ptr<acc_t>();
    // d/d rows[b] = sum_k g[b, k] table[ids[b, k]]: each task owns its rows
    at::parallel_for(0, B, lookup_grain(K * d), [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) {
        acc_t* out = gr + b * d;
        std::fill(out, out + d, acc_t(0));
        for (int64_t k = 0; k < K; ++k) {
          const acc_t gk = acc_t(g[b * K + k]);
          const scalar_t* v = t + ix[b * K + k] * d;
          for (int64_t i = 0; i < d; ++i) out[i] += gk * acc_t(v[i]);
        }
      }
    });
    // d/d table[j] = sum over (b, k) with ids[b, k] = j of g[b, k] rows[b]: scattered by column blocks
    for_column_blocks(d, B * K, [&](int64_t c0, int64_t c1) {
      for (int64_t b = 0; b < B; ++b) {
        for (int64_t k = 0; k < K; ++k) {
          const acc_t gk = acc_t(g[b * K + k]);
          acc_t* out = gt + ix[b * K + k] * d;
          for (int64_t i = c0; i < c1; ++i) out[i] += gk * acc_t(r[b * d + i]);
        }
      }
    });
  });
  return {grad_rows.to(R.scalar_type()), grad_table.to(T.scalar_type())};
}

}  // namespace
}  // namespace pnn_fast

TORCH_LIBRARY_IMPL(pnn_fast, CPU, m) {
  m.impl("unknown_items", &pnn_fast::unknown_items_cpu);
  m.impl("history_sample", &pnn_fast::history_sample_cpu);
  m.impl("embedding_bpr_fwd", &pnn_fast::embedding_bpr_fwd_cpu);
  m.impl("embedding_bpr_bwd", &pnn_fast::embedding_bpr_bwd_cpu);
  m.impl("gathered_norm_fwd", &pnn_fast::gathered_norm_fwd_cpu);
  m.impl("gathered_norm_bwd", &pnn_fast::gathered_norm_bwd_cpu);
  m.impl("gathered_dots_fwd", &pnn_fast::gathered_dots_fwd_cpu);
  m.impl("gathered_dots_bwd", &pnn_fast::gathered_dots_bwd_cpu);
}
