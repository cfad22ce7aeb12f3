// pnn_fast::class_terms_fwd / _bwd on CPU: L_rank and L_constrain of each row from its class
// centroids (pnn_rows.h's class_terms_row), forward and backward, in place of the some 60 ATen ops
// on [B, d] tensors that the same terms cost through autograd.  Rows are independent, so every
// result is the same for any number of threads.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "common/checks.h"
#include "common/dispatch.h"
#include "cpu/cpu_rows.h"

namespace pnn_fast {
namespace {

constexpr const char* kFwd = "pnn_fast::class_terms_fwd";
constexpr const char* kBwd = "pnn_fast::class_terms_bwd";

std::tuple<at::Tensor, at::Tensor> class_terms_fwd_cpu(const at::Tensor& user_emb, const at::Tensor& pos_emb,
                                                       const at::Tensor& neutral, const at::Tensor& negative,
                                                       const at::Tensor& noise_pos, const at::Tensor& noise_neg,
                                                       const at::Tensor& valid, const at::Tensor& num_negative) {
  const ClassTermsInputs in =
      prepare_class_terms(kFwd, user_emb, pos_emb, neutral, negative, noise_pos, noise_neg, valid, num_negative);
  const int64_t rows = in.user_emb.size(0), d = in.user_emb.size(1);
  at::Tensor rank = at::empty({rows}, in.user_emb.options());
  at::Tensor constrain = at::empty({rows}, in.user_emb.options());
  PNN_DISPATCH_FLOATING_TYPES(in.user_emb.scalar_type(), kFwd, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const ClassTermsBatch<scalar_t> batch = class_terms_batch<scalar_t>(in);
    scalar_t* rank_out = rank.data_ptr<scalar_t>();
    scalar_t* constrain_out = constrain.data_ptr<scalar_t>();
    at::parallel_for(0, rows, lookup_grain(6 * d), [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) {
        acc_t row_rank, row_constrain;
        class_terms_row(batch.row(b), SerialRowSum{}, row_rank, row_constrain);
        rank_out[b] = static_cast<scalar_t>(row_rank);
        constrain_out[b] = static_cast<scalar_t>(row_constrain);
      }
    });
  });
  return {rank, constrain};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> class_terms_bwd_cpu(
    const at::Tensor& grad_rank, const at::Tensor& grad_constrain, const at::Tensor& user_emb,
    const at::Tensor& pos_emb, const at::Tensor& neutral, const at::Tensor& negative, const at::Tensor& noise_pos,
    const at::Tensor& noise_neg, const at::Tensor& valid, const at::Tensor& num_negative) {
  const ClassTermsInputs in =
      prepare_class_terms(kBwd, user_emb, pos_emb, neutral, negative, noise_pos, noise_neg, valid, num_negative);
  const at::Tensor rank_grad = row_output_grad(kBwd, in, grad_rank, "grad_rank");
  const at::Tensor constrain_grad = row_output_grad(kBwd, in, grad_constrain, "grad_constrain");
  const int64_t rows = in.user_emb.size(0), d = in.user_emb.size(1);
  at::Tensor grads[4];
  for (at::Tensor& g : grads) g = at::empty({rows, d}, in.user_emb.options());
  PNN_DISPATCH_FLOATING_TYPES(in.user_emb.scalar_type(), kBwd, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const ClassTermsBatch<scalar_t> batch = class_terms_batch<scalar_t>(in);
    const acc_t* g_rank = rank_grad.data_ptr<acc_t>();
    const acc_t* g_constrain = constrain_grad.data_ptr<acc_t>();
    scalar_t* out[4] = {grads[0].data_ptr<scalar_t>(), grads[1].data_ptr<scalar_t>(), grads[2].data_ptr<scalar_t>(),
                        grads[3].data_ptr<scalar_t>()};
    at::parallel_for(0, rows, lookup_grain(12 * d), [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) {
        class_terms_row_backward(batch.row(b), SerialRowSum{}, g_rank[b], g_constrain[b], out[0] + b * d, out[1] + b * d,
                                 out[2] + b * d, out[3] + b * d);
      }
    });
  });
  return {grads[0], grads[1], grads[2], grads[3]};
}

}  // namespace
}  // namespace pnn_fast

TORCH_LIBRARY_IMPL(pnn_fast, CPU, m) {
  m.impl("class_terms_fwd", &pnn_fast::class_terms_fwd_cpu);
  m.impl("class_terms_bwd", &pnn_fast::class_terms_bwd_cpu);
}
