// nn::Swiglu on the device (cuda_ops.hpp): hidden = silu(gate) * up over rows [gate | up]
// (2F wide) into rows F wide, and its backward into d [gate | up], one pass each way (the
// activation fused, as Liger's SwiGLU kernel). The bf16 overloads are the same kernels on
// bf16 elements (float math, one rounding per store). expf here and the CPU's std::exp differ
// by an ulp or so.
#include <cuda_runtime.h>

#include <cstdint>

#include "ndmesh/nn/cuda_ops.hpp"
#include "tensor/cuda/common.cuh"

namespace ndmesh::cuda {

namespace {

using detail::Bf16Bits;
using detail::bits;
using detail::load;
using detail::store;

__device__ __forceinline__ float sigmoid_of(float g) { return 1.0f / (1.0f + expf(-g)); }

// S: float, or bf16 bits. One thread per hidden element (grid-stride).
template <typename S>
__global__ void swiglu_forward_kernel(S* hidden, const S* pre, std::int64_t rows, std::int64_t f) {
  const std::int64_t n = rows * f, stride = std::int64_t{gridDim.x} * blockDim.x;
  for (std::int64_t i = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) {
    const std::int64_t r = i / f, j = i % f;
    const float g = load(pre + r * 2 * f + j), u = load(pre + r * 2 * f + f + j);
    store(hidden + i, g * sigmoid_of(g) * u);
  }
}

template <typename S>
__global__ void swiglu_backward_kernel(S* dpre, const S* dhidden, const S* pre, std::int64_t rows, std::int64_t f) {
  const std::int64_t n = rows * f, stride = std::int64_t{gridDim.x} * blockDim.x;
  for (std::int64_t i = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) {
    const std::int64_t r = i / f, j = i % f;
    const float g = load(pre + r * 2 * f + j), u = load(pre + r * 2 * f + f + j);
    const float dh = load(dhidden + i), s = sigmoid_of(g);
    store(dpre + r * 2 * f + j, dh * u * (s * (1.0f + g * (1.0f - s))));
    store(dpre + r * 2 * f + f + j, dh * g * s);
  }
}

template <typename S>
void forward(S* hidden, const S* pre, std::int64_t rows, std::int64_t f, const char* what) {
  if (rows <= 0 || f <= 0) return;
  swiglu_forward_kernel<S><<<detail::blocks_for(rows * f), detail::kThreads, 0, detail::compute_stream()>>>(
      hidden, pre, rows, f);
  detail::check_launch(what);
}

template <typename S>
void backward(S* dpre, const S* dhidden, const S* pre, std::int64_t rows, std::int64_t f, const char* what) {
  if (rows <= 0 || f <= 0) return;
  swiglu_backward_kernel<S><<<detail::blocks_for(rows * f), detail::kThreads, 0, detail::compute_stream()>>>(
      dpre, dhidden, pre, rows, f);
  detail::check_launch(what);
}

}  // namespace

void swiglu_forward(float* hidden, const float* pre, std::int64_t rows, std::int64_t ffn) {
  forward<float>(hidden, pre, rows, ffn, "swiglu_forward");
}

void swiglu_forward(BFloat16* hidden, const BFloat16* pre, std::int64_t rows, std::int64_t ffn) {
  forward<Bf16Bits>(bits(hidden), bits(pre), rows, ffn, "swiglu_forward (bf16)");
}

void swiglu_backward(float* dpre, const float* dhidden, const float* pre, std::int64_t rows, std::int64_t ffn) {
  backward<float>(dpre, dhidden, pre, rows, ffn, "swiglu_backward");
}

void swiglu_backward(BFloat16* dpre, const BFloat16* dhidden, const BFloat16* pre, std::int64_t rows,
                     std::int64_t ffn) {
  backward<Bf16Bits>(bits(dpre), bits(dhidden), bits(pre), rows, ffn, "swiglu_backward (bf16)");
}

}  // namespace ndmesh::cuda
