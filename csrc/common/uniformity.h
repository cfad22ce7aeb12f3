// Host-side pieces of pnn_fast::pairwise_uniformity shared by both backends.
#pragma once

#include <ATen/core/Tensor.h>

#include <cmath>

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

// The loss from the log-sum-exp (0-dim float64) over a set of pairs whose exponentials sum to
// 1 / pair_multiplicity of the sum over all ordered pairs (2 when each unordered pair was taken once).
inline at::Tensor uniformity_from_total(const at::Tensor& total_lse, double pair_multiplicity, const at::Tensor& x) {
  return (total_lse + (std::log(pair_multiplicity) - log_num_pairs(x.size(0)))).to(x.scalar_type());
}

}  // namespace pnn_fast
