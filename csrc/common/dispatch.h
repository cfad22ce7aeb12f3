// Dtype dispatch shared by both backends: float32/float64 and, accumulating in float32,
// float16/bfloat16.
#pragma once

#include <ATen/Dispatch.h>

#define PNN_DISPATCH_FLOATING_TYPES(TYPE, NAME, ...) \
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, TYPE, NAME, __VA_ARGS__)
