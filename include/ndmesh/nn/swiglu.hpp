// SwiGLU's activation (Shazeer 2020; Llama), over a gated MLP's pre-activation rows
// [gate | up] (2F wide) into the hidden rows (F wide):
//   hidden = silu(gate) * up,  silu(g) = g * sigmoid(g),
//   d gate = d hidden * up * silu'(g),  d up = d hidden * silu(g),
//   silu'(g) = sigmoid(g) * (1 + g * (1 - sigmoid(g))).
// One pass over the rows each way (the activation fused, as Liger's SwiGLU kernel).
#pragma once

#include <cstdint>

#include "ndmesh/core/dtype.hpp"
#include "ndmesh/tensor/device.hpp"

namespace ndmesh::nn {

/// Element-wise SwiGLU over rows; no parameters.
template <typename T>
struct Swiglu {
  /// hidden[r, j] = silu(pre[r, j]) * pre[r, F + j] for rows x F (pre is rows x 2F).
  static void forward(const T* pre, T* hidden, std::int64_t rows, std::int64_t ffn, Device device = Device::kCpu);
  /// The same on bfloat16 rows (computed in float, rounded once): under bf16 products.
  static void forward(const BFloat16* pre, BFloat16* hidden, std::int64_t rows, std::int64_t ffn,
                      Device device = Device::kCpu);
  /// dpre[r, j] = dhidden * up * silu'(gate), dpre[r, F + j] = dhidden * silu(gate) (written).
  static void backward(const T* dhidden, const T* pre, T* dpre, std::int64_t rows, std::int64_t ffn,
                       Device device = Device::kCpu);
  /// The same on bfloat16 rows, each output rounded once.
  static void backward(const BFloat16* dhidden, const BFloat16* pre, BFloat16* dpre, std::int64_t rows,
                       std::int64_t ffn, Device device = Device::kCpu);
};

}  // namespace ndmesh::nn
