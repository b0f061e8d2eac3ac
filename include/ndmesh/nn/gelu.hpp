// GELU, tanh approximation (as in GPT-2):
//   gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
#pragma once

#include <cstdint>

#include "ndmesh/core/dtype.hpp"
#include "ndmesh/tensor/device.hpp"
#include "ndmesh/tensor/ops.hpp"

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

  /// Under bf16 products, the MLP's fc where its product does not fuse GELU (rows x cols,
  /// row-major; p the product without its bias): t = p[r, j] + bias[j] (the bias rounded to
  /// bf16: bias.rounded()), pre = t and out = gelu(t), each rounded to bf16 once: what
  /// cuBLASLt's GELU_AUX_BIAS epilogue into bf16 writes (ops::gemm_fused, kGelu).
  static void forward_bias(const T* p, const ops::SharedOperand<T>& bias, BFloat16* pre, BFloat16* out,
                           std::int64_t rows, std::int64_t cols, Device device = Device::kCpu);
  /// dinp[i] = gelu'(inp[i]) dout[i], rounded to bf16 once (inp the pre-activation stored in
  /// bf16): what the dGELU epilogue into bf16 writes (ops::gemm_fused, kDGelu).
  static void backward(const T* dout, const BFloat16* inp, BFloat16* dinp, std::int64_t n,
                       Device device = Device::kCpu);
};

}  // namespace ndmesh::nn
