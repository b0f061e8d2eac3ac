// GELU, tanh approximation (as in GPT-2):
//   gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
#pragma once

#include <cstdint>

#include "ndmesh/core/dtype.hpp"
#include "ndmesh/tensor/device.hpp"

namespace ndmesh::nn {

/// Element-wise GELU; no parameters.
template <typename T>
struct Gelu {
  /// out[i] = gelu(inp[i]) for n elements (on `device`).
  static void forward(const T* inp, T* out, std::int64_t n, Device device = Device::kCpu);
  /// The same values rounded to bfloat16 once (through float for double): the activation
  /// stored in bf16, equal to forward() then a rounding.
  static void forward(const T* inp, BFloat16* out, std::int64_t n, Device device = Device::kCpu);
  /// dinp[i] += gelu'(inp[i]) * dout[i]. dinp may be dout: then the gradient is written over
  /// dout (what adding into zeros gives), so the MLP needs no second buffer and no zeroing.
  static void backward(const T* dout, const T* inp, T* dinp, std::int64_t n, Device device = Device::kCpu);
};

}  // namespace ndmesh::nn
