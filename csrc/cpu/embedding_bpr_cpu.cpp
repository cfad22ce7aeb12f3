// pnn_fast::embedding_bpr_fwd / _bwd on CPU: BPR over table rows (and RecBole's EmbLoss of the
// gathered rows), forward and backward, in place of some 40 ATen ops per step.  Per-row values are
// computed in parallel and summed in row order; the table gradients are scattered by column blocks
// (for_column_blocks), so every result is the same for any number of threads.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <vector>

#include "common/checks.h"
#include "common/dispatch.h"
#include "cpu/cpu_rows.h"

namespace pnn_fast {
namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor> embedding_bpr_fwd_cpu(const at::Tensor& user_table,
                                                                     const at::Tensor& item_table,
                                                                     const at::Tensor& users,
                                                                     const at::Tensor& pos_items,
                                                                     const at::Tensor& neg_items, double reg_weight) {
  constexpr const char* op = "pnn_fast::embedding_bpr_fwd";
  EmbeddingBprInputs in = prepare_embedding_bpr(op, user_table, item_table, users, pos_items, neg_items, reg_weight);
  clamp_bpr_ids(op, in);
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
  EmbeddingBprInputs in = prepare_embedding_bpr(op, user_table, item_table, users, pos_items, neg_items, reg_weight);
  clamp_bpr_ids(op, in);  // the forward's stand-ins: a bad id never writes outside the gradient
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

}  // namespace
}  // namespace pnn_fast

TORCH_LIBRARY_IMPL(pnn_fast, CPU, m) {
  m.impl("embedding_bpr_fwd", &pnn_fast::embedding_bpr_fwd_cpu);
  m.impl("embedding_bpr_bwd", &pnn_fast::embedding_bpr_bwd_cpu);
}
