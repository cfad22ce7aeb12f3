// csr_spmm's argument checks, shared by its CPU and CUDA entry points (host code).
#pragma once

#include <cmath>
#include <optional>

#include <ATen/core/Tensor.h>

#include "common/checks.h"

namespace pnn_fast {

// Contiguous, checked inputs of csr_spmm.
struct CsrSpmmInputs {
  at::Tensor indptr, indices, values, x, addend;
};

// x a floating-point [m, d] table; indptr, indices int64 and values of x's dtype, 1-D, on x's device;
// indptr a partition of indices (as many values as indices); addend, if given, [n, d] in x's dtype; a
// finite non-zero divisor.  Not checked here: that every index is a row of x (the CPU kernel checks
// each in its pass, the CUDA entry before launching), and that a row's indices ascend (the product
// does not need it).  Synchronises on CUDA.
inline CsrSpmmInputs prepare_csr_spmm(const char* op, const at::Tensor& indptr, const at::Tensor& indices,
                                      const at::Tensor& values, const at::Tensor& x,
                                      const std::optional<at::Tensor>& addend, double divisor) {
  check_table(op, x, "x");
  check_tensor(op, x, indptr, "indptr", at::kLong, {-1}, "x");
  check_tensor(op, x, indices, "indices", at::kLong, {-1}, "x");
  check_tensor(op, x, values, "values", x.scalar_type(), {indices.numel()}, "x");
  TORCH_CHECK_VALUE(std::isfinite(divisor) && divisor != 0, op, ": divisor must be finite and non-zero, got ", divisor);
  CsrSpmmInputs in{indptr.contiguous(), indices.contiguous(), values.contiguous(), x.contiguous(), at::Tensor()};
  check_partition(op, in.indptr, in.indices, "indptr", "indices");
  if (addend.has_value()) {
    check_tensor(op, x, *addend, "addend", x.scalar_type(), {in.indptr.numel() - 1, x.size(1)}, "x");
    in.addend = addend->contiguous();
  }
  return in;
}

}  // namespace pnn_fast
