// pnn_fast::embedding_bpr_fwd / _bwd on CUDA: one thread per row for the per-row math of pnn_rows.h
// (the scores are the same sequential chains as on the CPU), one thread per (row, column) for the
// scatter into the table gradients.  The scatter uses atomicAdd into accumulation-dtype buffers, so,
// as torch's index_add on CUDA, the order of the additions (the last bits of a gradient) may vary.
#include <ATen/Context.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include "common/checks.h"
#include "common/dispatch.h"
#include "cuda/cuda_rows.cuh"

namespace pnn_fast {
namespace {

// Per row: the loss sum_k softplus(x_bk), coef[b, k] = softplus'(x_bk) / (B K) and, when the
// batch is regularized, the row's squared norms squares[b, 0..3) (bpr_row).
template <typename scalar_t, typename acc_t>
__global__ void bpr_rows_kernel(BprBatch<scalar_t> batch, acc_t* loss, acc_t* coef, acc_t* squares) {
  const int64_t rows = batch.rows, K = batch.negatives, d = batch.dim;
  const int64_t b = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (b >= rows) return;
  const int64_t *neg = batch.neg_items + b * K;
  loss[b] = bpr_row<acc_t>(batch.user_table + batch.users[b] * d, batch.item_table + batch.pos_items[b] * d,
                           batch.item_table, neg, K, d, acc_t(rows * K), coef + b * K,
                           batch.regularize ? squares + 3 * b : nullptr);
}

// One thread per (b, i).  norms: the forward's norms of the users, positives and negatives
// matrices (zeros, so no EmbLoss gradient, when the batch is not regularized).
template <typename scalar_t, typename acc_t>
__global__ void bpr_scatter_kernel(BprBatch<scalar_t> batch, const acc_t* grad, const acc_t* coef,
                                   const acc_t* norms, acc_t reg_weight, acc_t* gU, acc_t* gI) {
  const scalar_t *U = batch.user_table, *I = batch.item_table;
  const int64_t *users = batch.users, *pos = batch.pos_items, *neg = batch.neg_items;
  const int64_t rows = batch.rows, K = batch.negatives, d = batch.dim;
  const int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t >= rows * d) return;
  const int64_t b = t / d, i = t % d;
  acc_t scale[3];
  for (int s = 0; s < 3; ++s) scale[s] = norm_grad_scale(*grad, reg_weight, rows, norms[s]);
  const acc_t u = acc_t(U[users[b] * d + i]);
  acc_t gu = 0, c_sum = 0;
  for (int64_t k = 0; k < K; ++k) {
    const int64_t item = neg[b * K + k];
    const acc_t ck = *grad * coef[b * K + k];
    const acc_t n = acc_t(I[item * d + i]);
    c_sum += ck;
    gu += ck * n;
    atomicAdd(gI + item * d + i, ck * u + scale[2] * n);
  }
  const acc_t p = acc_t(I[pos[b] * d + i]);
  gu -= c_sum * p;
  atomicAdd(gI + pos[b] * d + i, -c_sum * u + scale[1] * p);
  atomicAdd(gU + users[b] * d + i, gu + scale[0] * u);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> embedding_bpr_fwd_cuda(const at::Tensor& user_table,
                                                                      const at::Tensor& item_table,
                                                                      const at::Tensor& users,
                                                                      const at::Tensor& pos_items,
                                                                      const at::Tensor& neg_items, double reg_weight) {
  constexpr const char* op = "pnn_fast::embedding_bpr_fwd";
  EmbeddingBprInputs in = prepare_embedding_bpr(op, user_table, item_table, users, pos_items, neg_items, reg_weight);
  clamp_bpr_ids(op, in);
  const c10::cuda::CUDAGuard guard(user_table.device());
  const at::TensorOptions acc_options = in.user_table.options().dtype(opmath_dtype(in.user_table.scalar_type()));
  at::Tensor row_loss = at::empty({in.rows}, acc_options);
  at::Tensor coef = at::empty({in.rows, in.negatives}, acc_options);
  at::Tensor squares = at::zeros({reg_weight != 0 ? in.rows : 0, 3}, acc_options);
  PNN_DISPATCH_FLOATING_TYPES(in.user_table.scalar_type(), op, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    launch_flat(bpr_rows_kernel<scalar_t, acc_t>, in.rows, bpr_batch<scalar_t>(in), row_loss.data_ptr<acc_t>(),
                coef.data_ptr<acc_t>(), squares.data_ptr<acc_t>());
  });
  at::Tensor loss = row_loss.sum() / double(in.rows * in.negatives);
  at::Tensor norms = squares.sum(0).sqrt();  // zeros when not regularized
  if (reg_weight != 0) loss = loss + norms.sum() * (reg_weight / double(in.rows));
  return {loss.to(in.user_table.scalar_type()), coef, norms};
}

std::tuple<at::Tensor, at::Tensor> embedding_bpr_bwd_cuda(const at::Tensor& grad, const at::Tensor& coef,
                                                          const at::Tensor& norms, const at::Tensor& user_table,
                                                          const at::Tensor& item_table, const at::Tensor& users,
                                                          const at::Tensor& pos_items, const at::Tensor& neg_items,
                                                          double reg_weight) {
  constexpr const char* op = "pnn_fast::embedding_bpr_bwd";
  at::globalContext().alertNotDeterministic(op);  // float atomicAdds into the tables' gradients
  EmbeddingBprInputs in = prepare_embedding_bpr(op, user_table, item_table, users, pos_items, neg_items, reg_weight);
  clamp_bpr_ids(op, in);  // the forward's stand-ins: a bad id never writes outside the gradient
  const c10::cuda::CUDAGuard guard(user_table.device());
  const at::Tensor g = scalar_grad(op, in.user_table, grad).contiguous();
  check_tensor(op, in.user_table, coef, "coef", g.scalar_type(), {in.rows, in.negatives}, "user_table");
  const at::Tensor coef_in = coef.contiguous();
  const at::Tensor norms_in = checked_bpr_norms(op, in, norms, g.scalar_type());
  const at::TensorOptions acc_options = in.user_table.options().dtype(g.scalar_type());
  at::Tensor grad_user = at::zeros(in.user_table.sizes(), acc_options);
  at::Tensor grad_item = at::zeros(in.item_table.sizes(), acc_options);
  PNN_DISPATCH_FLOATING_TYPES(in.user_table.scalar_type(), op, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    launch_flat(bpr_scatter_kernel<scalar_t, acc_t>, in.rows * in.dim, bpr_batch<scalar_t>(in), g.data_ptr<acc_t>(),
                coef_in.data_ptr<acc_t>(), norms_in.data_ptr<acc_t>(), acc_t(reg_weight),
                grad_user.data_ptr<acc_t>(), grad_item.data_ptr<acc_t>());
  });
  return {grad_user.to(in.user_table.scalar_type()), grad_item.to(in.item_table.scalar_type())};
}

}  // namespace
}  // namespace pnn_fast

TORCH_LIBRARY_IMPL(pnn_fast, CUDA, m) {
  m.impl("embedding_bpr_fwd", &pnn_fast::embedding_bpr_fwd_cuda);
  m.impl("embedding_bpr_bwd", &pnn_fast::embedding_bpr_bwd_cuda);
}
