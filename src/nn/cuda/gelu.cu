// nn::Gelu on the device (cuda_ops.hpp): GELU with the tanh approximation,
//   gelu(x) = x/2 (1 + tanh(a (x + k x³))), a = sqrt(2/pi), k = 0.044715,
//   gelu'(x) = (1 + t)/2 + x/2 (1 - t²) a (1 + 3 k x²), t = tanh(a (x + k x³)).
// The bf16 overloads are the same kernels on bf16 elements (float math, one rounding per
// store). tanhf here and the CPU's 1 - 2/(exp(2u) + 1) differ by a few 1e-8 absolute. Like the CPU
// layer it reads the biased input; fusing the bias (a cuBLASLt GELU_BIAS epilogue) is later
// work for the bf16 path.
#include <cuda_runtime.h>

#include <cstdint>

#include "ndmesh/nn/cuda_ops.hpp"
#include "tensor/cuda/common.cuh"

namespace ndmesh::cuda {

namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;

using detail::Bf16Bits;
using detail::bits;
using detail::load;
using detail::store;

__device__ __forceinline__ float gelu_of(float x) {
  return 0.5f * x * (1.0f + tanhf(kSqrt2OverPi * (x + kCubic * x * x * x)));
}

__device__ __forceinline__ float gelu_grad(float x) {
  const float t = tanhf(kSqrt2OverPi * (x + kCubic * x * x * x));
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * kSqrt2OverPi * (1.0f + 3.0f * kCubic * x * x);
}

// S, D: float, or bfloat16 bits (computed in float, rounded once on the store).
template <typename S, typename D>
__global__ void gelu_forward_kernel(D* out, const S* inp, std::int64_t n) {
  const std::int64_t stride = std::int64_t{gridDim.x} * blockDim.x;
  for (std::int64_t i = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float x = load(inp + i);
    store(out + i, gelu_of(x));
  }
}

// kInPlace: dinp is dout, each element read then written by its own thread; the product
// alone is what adding it into zeros gives.
template <typename S, bool kInPlace>
__global__ void gelu_backward_kernel(S* dinp, const S* dout, const S* inp, std::int64_t n) {
  const std::int64_t stride = std::int64_t{gridDim.x} * blockDim.x;
  for (std::int64_t i = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float x = load(inp + i);
    const float d = gelu_grad(x);
    const float g = __fmul_rn(d, load(dout + i));
    store(dinp + i, kInPlace ? g : __fadd_rn(load(dinp + i), g));
  }
}

template <typename S, typename D>
void forward(D* out, const S* inp, std::int64_t n) {
  if (n <= 0) return;
  gelu_forward_kernel<S, D><<<detail::blocks_for(n), detail::kThreads, 0, detail::compute_stream()>>>(out, inp, n);
  detail::check_launch("gelu_forward");
}

template <typename S>
void backward(S* dinp, const S* dout, const S* inp, std::int64_t n) {
  if (n <= 0) return;
  if (dinp == dout) {
    gelu_backward_kernel<S, true><<<detail::blocks_for(n), detail::kThreads, 0, detail::compute_stream()>>>(
        dinp, dout, inp, n);
    detail::check_launch("gelu_backward (in place)");
  } else {
    gelu_backward_kernel<S, false><<<detail::blocks_for(n), detail::kThreads, 0, detail::compute_stream()>>>(
        dinp, dout, inp, n);
    detail::check_launch("gelu_backward");
  }
}

// t = p + bias[column] in float; pre = t and out = gelu(t), each rounded once.
__global__ void gelu_bias_forward_kernel(Bf16Bits* out, Bf16Bits* pre, const float* p, const Bf16Bits* bias,
                                         std::int64_t rows, std::int64_t cols) {
  const std::int64_t n = rows * cols, stride = std::int64_t{gridDim.x} * blockDim.x;
  for (std::int64_t i = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float x = __fadd_rn(p[i], load(bias + i % cols));
    store(pre + i, x);
    store(out + i, gelu_of(x));
  }
}

// dinp = gelu'(inp) dout, rounded once on the store (fp32 dout, bf16 inp).
__global__ void gelu_backward_mixed_kernel(Bf16Bits* dinp, const float* dout, const Bf16Bits* inp,
                                           std::int64_t n) {
  const std::int64_t stride = std::int64_t{gridDim.x} * blockDim.x;
  for (std::int64_t i = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float x = load(inp + i);
    const float d = gelu_grad(x);
    store(dinp + i, __fmul_rn(d, dout[i]));
  }
}

}  // namespace

void gelu_bias_forward(BFloat16* out, BFloat16* pre, const float* p, const BFloat16* bias, std::int64_t rows,
                       std::int64_t cols) {
  const std::int64_t n = rows * cols;
  if (n <= 0) return;
  gelu_bias_forward_kernel<<<detail::blocks_for(n), detail::kThreads, 0, detail::compute_stream()>>>(
      bits(out), bits(pre), p, bits(bias), rows, cols);
  detail::check_launch("gelu_bias_forward");
}

void gelu_backward(BFloat16* dinp, const float* dout, const BFloat16* inp, std::int64_t n) {
  if (n <= 0) return;
  gelu_backward_mixed_kernel<<<detail::blocks_for(n), detail::kThreads, 0, detail::compute_stream()>>>(
      bits(dinp), dout, bits(inp), n);
  detail::check_launch("gelu_backward (into bf16)");
}

void gelu_forward(float* out, const float* inp, std::int64_t n) { forward(out, inp, n); }
void gelu_forward(BFloat16* out, const BFloat16* inp, std::int64_t n) { forward(bits(out), bits(inp), n); }
void gelu_forward(BFloat16* out, const float* inp, std::int64_t n) { forward(bits(out), inp, n); }
void gelu_backward(float* dinp, const float* dout, const float* inp, std::int64_t n) { backward(dinp, dout, inp, n); }
void gelu_backward(BFloat16* dinp, const BFloat16* dout, const BFloat16* inp, std::int64_t n) {
  backward(bits(dinp), bits(dout), bits(inp), n);
}

}  // namespace ndmesh::cuda
