// The table-lookup ops on CUDA (see csrc/cpu/lookup_ops_cpu.cpp): one thread per row for the
// per-row math of pnn_rows.h (the scores are the same sequential chains as on the CPU), one
// thread per (row, column) for the scatter into the table gradients.  The scatter uses
// atomicAdd into accumulation-dtype buffers, so, as torch's index_add on CUDA, the order of
// the additions (and the last bits of a gradient) may vary from run to run.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "common/checks.h"
#include "common/dispatch.h"
#include "cuda/cuda_rows.cuh"

namespace pnn_fast {
namespace {

constexpr int kLookupThreads = 256;

unsigned int blocks_for(int64_t threads) {
  return static_cast<unsigned int>((threads + kLookupThreads - 1) / kLookupThreads);
}

__global__ void unknown_items_kernel(const int64_t* indptr, const int64_t* known, const int64_t* users,
                                     const float* uniform, int64_t* out, int64_t rows, int64_t per_row,
                                     int64_t num_users, int64_t num_items) {
  const int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t >= rows * per_row) return;
  const int64_t user = users[t / per_row];
  CUDA_KERNEL_ASSERT(user >= 0 && user < num_users);
  const int64_t first = indptr[user], count = indptr[user + 1] - first, free = num_items - count;
  CUDA_KERNEL_ASSERT(free > 0 && uniform[t] >= 0.0f && uniform[t] < 1.0f);
  out[t] = unknown_by_rank(known + first, count, rank_of_uniform(uniform[t], free));
}

// One thread per row: Floyd's positions written into the row, then replaced by the items.
__global__ void history_sample_kernel(const int64_t* indptr, const int64_t* known, const int64_t* users,
                                      const float* uniform, int64_t* out, int64_t rows, int64_t size,
                                      int64_t num_users) {
  const int64_t b = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (b >= rows) return;
  CUDA_KERNEL_ASSERT(users[b] >= 0 && users[b] < num_users);
  for (int64_t i = 0; i < size; ++i) CUDA_KERNEL_ASSERT(uniform[b * size + i] >= 0.0f && uniform[b * size + i] < 1.0f);
  int64_t* row = out + b * size;
  const int64_t first = indptr[users[b]];
  const int64_t taken = floyd_positions(indptr[users[b] + 1] - first, size, uniform + b * size, row);
  for (int64_t i = 0; i < taken; ++i) row[i] = known[first + row[i]];
  for (int64_t i = taken; i < size; ++i) row[i] = -1;
}

// Per row: the loss sum_k softplus(x_bk), coef[b, k] = softplus'(x_bk) / (B K) and, when the
// batch is regularized, the row's squared norms squares[b, 0..3) (bpr_row).
template <typename scalar_t, typename acc_t>
__global__ void bpr_rows_kernel(BprBatch<scalar_t> batch, acc_t* loss, acc_t* coef, acc_t* squares) {
  const int64_t rows = batch.rows, K = batch.negatives, d = batch.dim, num_items = batch.num_items;
  const int64_t b = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (b >= rows) return;
  const int64_t *neg = batch.neg_items + b * K;
  CUDA_KERNEL_ASSERT(batch.users[b] >= 0 && batch.users[b] < batch.num_users);
  CUDA_KERNEL_ASSERT(batch.pos_items[b] >= 0 && batch.pos_items[b] < num_items);
  for (int64_t k = 0; k < K; ++k) CUDA_KERNEL_ASSERT(neg[k] >= 0 && neg[k] < num_items);
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

template <typename scalar_t, typename acc_t>
__global__ void squared_rows_kernel(const scalar_t* T, const int64_t* ids, int64_t n, int64_t d, int64_t num_rows,
                                    acc_t* out) {
  const int64_t b = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (b >= n) return;
  CUDA_KERNEL_ASSERT(ids[b] >= 0 && ids[b] < num_rows);
  out[b] = dot_wide<acc_t>(T + ids[b] * d, T + ids[b] * d, d);
}

template <typename scalar_t, typename acc_t>
__global__ void norm_scatter_kernel(const scalar_t* T, const int64_t* ids, int64_t n, int64_t d, const acc_t* grad,
                                    const acc_t* norm, acc_t* gT) {
  const int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t >= n * d) return;
  const acc_t coef = norm_grad_scale(*grad, acc_t(1), 1, *norm);
  const int64_t row = ids[t / d] * d + t % d;
  atomicAdd(gT + row, coef * acc_t(T[row]));
}

template <typename scalar_t, typename acc_t>
__global__ void gathered_dots_kernel(const scalar_t* rows, const scalar_t* table, const int64_t* ids, int64_t B,
                                     int64_t K, int64_t d, int64_t num_rows, scalar_t* out) {
  const int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t >= B * K) return;
  CUDA_KERNEL_ASSERT(ids[t] >= 0 && ids[t] < num_rows);
  out[t] = static_cast<scalar_t>(dot_wide<acc_t>(rows + (t / K) * d, table + ids[t] * d, d));
}

// One thread per (b, i): grad_rows[b, i] = sum_k g[b, k] table[ids[b, k], i], and the table's share by atomicAdd.
template <typename scalar_t, typename acc_t>
__global__ void gathered_dots_bwd_kernel(const scalar_t* grad, const scalar_t* rows, const scalar_t* table,
                                         const int64_t* ids, int64_t B, int64_t K, int64_t d, acc_t* grad_rows,
                                         acc_t* grad_table) {
  const int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t >= B * d) return;
  const int64_t b = t / d, i = t % d;
  const acc_t r = acc_t(rows[t]);
  acc_t sum = 0;
  for (int64_t k = 0; k < K; ++k) {
    const acc_t gk = acc_t(grad[b * K + k]);
    sum += gk * acc_t(table[ids[b * K + k] * d + i]);
    atomicAdd(grad_table + ids[b * K + k] * d + i, gk * r);
  }
  grad_rows[t] = sum;
}

template <typename Kernel, typename... Args>
void launch_flat(Kernel kernel, int64_t threads, Args... args) {
  if (threads == 0) return;
  kernel<<<blocks_for(threads), kLookupThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(args...);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

at::Tensor unknown_items_cuda(const at::Tensor& known_indptr, const at::Tensor& known_indices, const at::Tensor& users,
                              const at::Tensor& uniform, int64_t num_items) {
  const KnownDraws in = prepare_known_draws("pnn_fast::unknown_items", known_indptr, known_indices, users, uniform);
  const c10::cuda::CUDAGuard guard(known_indptr.device());
  at::Tensor items = at::empty(in.uniform.sizes(), users.options());
  launch_flat(unknown_items_kernel, in.uniform.numel(), in.indptr.data_ptr<int64_t>(), in.indices.data_ptr<int64_t>(),
              in.users.data_ptr<int64_t>(), in.uniform.data_ptr<float>(), items.data_ptr<int64_t>(), in.rows,
              in.per_row, in.num_users, num_items);
  return items;
}

at::Tensor history_sample_cuda(const at::Tensor& known_indptr, const at::Tensor& known_indices,
                               const at::Tensor& users, const at::Tensor& uniform) {
  const KnownDraws in = prepare_known_draws("pnn_fast::history_sample", known_indptr, known_indices, users, uniform);
  const c10::cuda::CUDAGuard guard(known_indptr.device());
  at::Tensor items = at::empty(in.uniform.sizes(), users.options());
  launch_flat(history_sample_kernel, in.rows, in.indptr.data_ptr<int64_t>(), in.indices.data_ptr<int64_t>(),
              in.users.data_ptr<int64_t>(), in.uniform.data_ptr<float>(), items.data_ptr<int64_t>(), in.rows,
              in.per_row, in.num_users);
  return items;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> embedding_bpr_fwd_cuda(const at::Tensor& user_table,
                                                                      const at::Tensor& item_table,
                                                                      const at::Tensor& users,
                                                                      const at::Tensor& pos_items,
                                                                      const at::Tensor& neg_items, double reg_weight) {
  constexpr const char* op = "pnn_fast::embedding_bpr_fwd";
  const LookupInputs in = prepare_embedding_bpr(op, user_table, item_table, users, pos_items, neg_items, reg_weight);
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
  const LookupInputs in = prepare_embedding_bpr(op, user_table, item_table, users, pos_items, neg_items, reg_weight);
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

at::Tensor gathered_norm_fwd_cuda(const at::Tensor& table, const at::Tensor& ids) {
  constexpr const char* op = "pnn_fast::gathered_norm_fwd";
  check_gathered_norm(op, table, ids);
  const c10::cuda::CUDAGuard guard(table.device());
  const at::Tensor rows_in = table.contiguous(), ids_in = ids.contiguous();
  at::Tensor squares = at::empty({ids_in.numel()}, table.options().dtype(opmath_dtype(table.scalar_type())));
  PNN_DISPATCH_FLOATING_TYPES(rows_in.scalar_type(), op, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    launch_flat(squared_rows_kernel<scalar_t, acc_t>, ids_in.numel(), rows_in.data_ptr<scalar_t>(),
                ids_in.data_ptr<int64_t>(), ids_in.numel(), rows_in.size(1), rows_in.size(0),
                squares.data_ptr<acc_t>());
  });
  return squares.sum().sqrt().to(table.scalar_type());
}

at::Tensor gathered_norm_bwd_cuda(const at::Tensor& grad, const at::Tensor& table, const at::Tensor& ids,
                                  const at::Tensor& output) {
  constexpr const char* op = "pnn_fast::gathered_norm_bwd";
  check_gathered_norm(op, table, ids);
  const c10::cuda::CUDAGuard guard(table.device());
  const at::Tensor rows_in = table.contiguous(), ids_in = ids.contiguous();
  const at::Tensor g = scalar_grad(op, rows_in, grad).contiguous();
  const at::Tensor norm = scalar_grad(op, rows_in, output).contiguous();
  at::Tensor grad_table = at::zeros(rows_in.sizes(), rows_in.options().dtype(g.scalar_type()));
  PNN_DISPATCH_FLOATING_TYPES(rows_in.scalar_type(), op, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    launch_flat(norm_scatter_kernel<scalar_t, acc_t>, ids_in.numel() * rows_in.size(1), rows_in.data_ptr<scalar_t>(),
                ids_in.data_ptr<int64_t>(), ids_in.numel(), rows_in.size(1), g.data_ptr<acc_t>(),
                norm.data_ptr<acc_t>(), grad_table.data_ptr<acc_t>());
  });
  return grad_table.to(table.scalar_type());
}

at::Tensor gathered_dots_fwd_cuda(const at::Tensor& rows, const at::Tensor& table, const at::Tensor& ids) {
  constexpr const char* op = "pnn_fast::gathered_dots_fwd";
  check_gathered_dots(op, rows, table, ids);
  const at::Tensor R = rows.contiguous(), T = table.contiguous(), id = ids.contiguous();
  const c10::cuda::CUDAGuard guard(R.device());
  at::Tensor out = at::empty({R.size(0), id.size(1)}, R.options());
  PNN_DISPATCH_FLOATING_TYPES(R.scalar_type(), op, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    launch_flat(gathered_dots_kernel<scalar_t, acc_t>, out.numel(), R.data_ptr<scalar_t>(), T.data_ptr<scalar_t>(),
                id.data_ptr<int64_t>(), R.size(0), id.size(1), R.size(1), T.size(0), out.data_ptr<scalar_t>());
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> gathered_dots_bwd_cuda(const at::Tensor& grad, const at::Tensor& rows,
                                                          const at::Tensor& table, const at::Tensor& ids) {
  constexpr const char* op = "pnn_fast::gathered_dots_bwd";
  check_gathered_dots(op, rows, table, ids);
  const at::Tensor R = rows.contiguous(), T = table.contiguous(), id = ids.contiguous();
  check_tensor(op, R, grad, "grad", R.scalar_type(), {R.size(0), id.size(1)}, "rows");
  const c10::cuda::CUDAGuard guard(R.device());
  const at::Tensor g_in = grad.contiguous();
  const at::TensorOptions acc_options = R.options().dtype(opmath_dtype(R.scalar_type()));
  at::Tensor grad_rows = at::empty(R.sizes(), acc_options);
  at::Tensor grad_table = at::zeros(T.sizes(), acc_options);
  PNN_DISPATCH_FLOATING_TYPES(R.scalar_type(), op, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    launch_flat(gathered_dots_bwd_kernel<scalar_t, acc_t>, R.numel(), g_in.data_ptr<scalar_t>(),
                R.data_ptr<scalar_t>(), T.data_ptr<scalar_t>(), id.data_ptr<int64_t>(), R.size(0), id.size(1),
                R.size(1), grad_rows.data_ptr<acc_t>(), grad_table.data_ptr<acc_t>());
  });
  return {grad_rows.to(R.scalar_type()), grad_table.to(T.scalar_type())};
}

}  // namespace
}  // namespace pnn_fast

TORCH_LIBRARY_IMPL(pnn_fast, CUDA, m) {
  m.impl("unknown_items", &pnn_fast::unknown_items_cuda);
  m.impl("history_sample", &pnn_fast::history_sample_cuda);
  m.impl("embedding_bpr_fwd", &pnn_fast::embedding_bpr_fwd_cuda);
  m.impl("embedding_bpr_bwd", &pnn_fast::embedding_bpr_bwd_cuda);
  m.impl("gathered_norm_fwd", &pnn_fast::gathered_norm_fwd_cuda);
  m.impl("gathered_norm_bwd", &pnn_fast::gathered_norm_bwd_cuda);
  m.impl("gathered_dots_fwd", &pnn_fast::gathered_dots_fwd_cuda);
  m.impl("gathered_dots_bwd", &pnn_fast::gathered_dots_bwd_cuda);
}
