// Host-side pieces of pnn_fast::pairwise_uniformity shared by both backends.
#pragma once

#include <ATen/core/Tensor.h>

#include <cmath>
#include <tuple>

namespace pnn_fast {

constexpr const char* kUniformityFwd = "pnn_fast::pairwise_uniformity_fwd";
constexpr const char* kUniformityBwd = "pnn_fast::pairwise_uniformity_bwd";

inline at::Tensor prepare_points(const char* op, const at::Tensor& x, double t) {
  TORCH_CHECK(x.dim() == 2 && at::isFloatingType(x.scalar_type()), op, ": x must be a floating-point [n, d] tensor, got ",
              x.scalar_type(), " ", x.sizes());
  TORCH_CHECK(std::isfinite(t), op, ": t must be finite, got ", t);
  return x.contiguous();
}

// log(n (n - 1)), the number of ordered pairs.
inline double log_num_pairs(int64_t n) {
  return std::log(static_cast<double>(n)) + std::log(static_cast<double>(n - 1));
}

// keep, when given: bool [n] on x's device, contiguous.
inline c10::optional<at::Tensor> prepare_keep(const char* op, const at::Tensor& x, const c10::optional<at::Tensor>& keep) {
  if (!keep.has_value() || !keep->defined()) return c10::nullopt;
  TORCH_CHECK(keep->device() == x.device(), op, ": keep is on ", keep->device(), " but x is on ", x.device());
  TORCH_CHECK(keep->scalar_type() == at::kBool && keep->dim() == 1 && keep->size(0) == x.size(0), op,
              ": keep must be a bool [n] tensor with n = ", x.size(0), ", got ", keep->scalar_type(), " ", keep->sizes());
  return keep->contiguous();
}

// The forward's outputs from the log-sum-exp (0-dim float64) over a set of pairs whose
// exponentials sum to 1 / pair_multiplicity of the sum over all ordered pairs (2 when each
// unordered pair was taken once): (the loss in x's dtype, the float64 log-sum-exp over all ordered
// pairs).  The backward takes the second, so its weights exp(l_ij - L) never see L rounded to
// x's dtype (in bfloat16 that rounding alone would scale every gradient by up to 1%).
inline std::tuple<at::Tensor, at::Tensor> uniformity_outputs(const at::Tensor& total_lse, double pair_multiplicity,
                                                             const at::Tensor& x) {
  const at::Tensor ordered = total_lse.to(at::kDouble) + std::log(pair_multiplicity);
  return {(ordered - log_num_pairs(x.size(0))).to(x.scalar_type()), ordered};
}

// The outputs for fewer than two points: a zero loss and no pairs (the backward returns zeros).
inline std::tuple<at::Tensor, at::Tensor> empty_uniformity_outputs(const at::Tensor& x) {
  return {at::zeros({}, x.options()), at::full({}, -INFINITY, x.options().dtype(at::kDouble))};
}

}  // namespace pnn_fast
