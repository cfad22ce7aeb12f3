// Autograd of the table-lookup ops on a training step's hot path, in C++.
//
// A BPR step on ML-1M takes about 1 ms on one CPU core.  Routing embedding_bpr_fwd through a
// Python autograd registration (torch.library.register_autograd) added about 0.14 ms to it: the
// Python wrapper on the way forward and the Python backward node.  A torch::autograd::Function
// registered for the Autograd key does the same routing without entering Python.  The other ops
// keep their Python autograd (pnn_fast/ops/<op>.py), where a step costs tens of milliseconds.
//
// Both functions only route tensors: the math is in the *_bwd ops, whatever the backend.  Their
// fake (meta) kernels stay in Python, so torch.compile traces through these functions.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/library.h>

namespace pnn_fast {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

template <class Signature>
c10::TypedOperatorHandle<Signature> find_op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

using BprFwd = std::tuple<at::Tensor, at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                               const at::Tensor&, const at::Tensor&,
                                                               const at::Tensor&, double);
using BprBwd = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                   const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                   const at::Tensor&, const at::Tensor&, double);

// (loss, coef, norms) = embedding_bpr_fwd(user_table, item_table, users, pos_items, neg_items,
// reg_weight); coef and norms are not differentiable.  Backward: (grad_user_table,
// grad_item_table, None, None, None, None).
class EmbeddingBprFunction : public torch::autograd::Function<EmbeddingBprFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& user_table, const at::Tensor& item_table,
                               const at::Tensor& users, const at::Tensor& pos_items, const at::Tensor& neg_items,
                               double reg_weight) {
    static const auto fwd = find_op<BprFwd>("pnn_fast::embedding_bpr_fwd");
    at::AutoDispatchBelowADInplaceOrView below;  // to the backend kernel, not back into this one
    auto [loss, coef, norms] = fwd.call(user_table, item_table, users, pos_items, neg_items, reg_weight);
    ctx->mark_non_differentiable({coef, norms});
    ctx->save_for_backward({coef, norms, user_table, item_table, users, pos_items, neg_items});
    ctx->saved_data["reg_weight"] = reg_weight;
    return {loss, coef, norms};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto bwd = find_op<BprBwd>("pnn_fast::embedding_bpr_bwd");
    const variable_list saved = ctx->get_saved_variables();
    auto [grad_user, grad_item] = bwd.call(grads[0], saved[0], saved[1], saved[2], saved[3], saved[4], saved[5],
                                           saved[6], ctx->saved_data["reg_weight"].toDouble());
    return {ctx->needs_input_grad(0) ? grad_user : at::Tensor(), ctx->needs_input_grad(1) ? grad_item : at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

std::tuple<at::Tensor, at::Tensor, at::Tensor> embedding_bpr_fwd_autograd(
    const at::Tensor& user_table, const at::Tensor& item_table, const at::Tensor& users, const at::Tensor& pos_items,
    const at::Tensor& neg_items, double reg_weight) {
  variable_list out = EmbeddingBprFunction::apply(user_table, item_table, users, pos_items, neg_items, reg_weight);
  return {out[0], out[1], out[2]};
}

// norm = gathered_norm_fwd(table, ids).  Backward: (grad_table, None).
class GatheredNormFunction : public torch::autograd::Function<GatheredNormFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& table, const at::Tensor& ids) {
    static const auto fwd = find_op<at::Tensor(const at::Tensor&, const at::Tensor&)>("pnn_fast::gathered_norm_fwd");
    at::AutoDispatchBelowADInplaceOrView below;
    at::Tensor norm = fwd.call(table, ids);
    ctx->save_for_backward({table, ids, norm});
    return norm;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto bwd =
        find_op<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&)>(
            "pnn_fast::gathered_norm_bwd");
    const variable_list saved = ctx->get_saved_variables();
    return {bwd.call(grads[0], saved[0], saved[1], saved[2]), at::Tensor()};
  }
};

at::Tensor gathered_norm_fwd_autograd(const at::Tensor& table, const at::Tensor& ids) {
  return GatheredNormFunction::apply(table, ids);
}

}  // namespace
}  // namespace pnn_fast

TORCH_LIBRARY_IMPL(pnn_fast, Autograd, m) {
  m.impl("embedding_bpr_fwd", &pnn_fast::embedding_bpr_fwd_autograd);
  m.impl("gathered_norm_fwd", &pnn_fast::gathered_norm_fwd_autograd);
  // The backward ops have no derivative of their own. Without an Autograd kernel, a backward run with
  // create_graph=True (a gradient penalty) gave their outputs no history, and the second derivative
  // through them came out silently zero. PyTorch's not-implemented fallback gives their outputs a
  // node that raises "derivative for pnn_fast::<op>_bwd is not implemented" when differentiated, so
  // a first backward works as before and only a second one stops, naming the op.
  for (const char* op : {"class_centroids_bwd", "class_terms_bwd", "pairwise_uniformity_bwd", "embedding_bpr_bwd",
                         "gathered_norm_bwd", "gathered_dots_bwd", "unit_rows_bwd",
                         "masked_logsumexp_bwd"}) {
    m.impl(op, torch::autograd::autogradNotImplementedFallback());
  }
}
