#include "ndmesh/nn/gelu.hpp"

#include <cmath>
#include <type_traits>

#include "tensor/cuda_twin.hpp"

namespace ndmesh::nn {

namespace {
constexpr double kSqrt2OverPi = 0.7978845608028654;
constexpr double kCubic = 0.044715;

// tanh through one exp: glibc's tanhf goes through expm1f and was a quarter of a training
// step. The cancellation near 0 costs ~1e-7 absolute in tanh, which GELU multiplies by
// x/2; float training does not notice. Double (the finite-difference path) keeps std::tanh.
template <typename T>
T tanh_of(T u) {
  if constexpr (std::is_same_v<T, float>) {
    return 1.0f - 2.0f / (std::exp(2.0f * u) + 1.0f);
  } else {
    return std::tanh(u);
  }
}

template <typename T>
T gelu_of(T x) {
  const T a = static_cast<T>(kSqrt2OverPi), k = static_cast<T>(kCubic);
  return T(0.5) * x * (T(1) + tanh_of(a * (x + k * x * x * x)));
}

// gelu'(x) = (1 + t)/2 + x/2 (1 - t²) a (1 + 3 k x²), t = tanh(a (x + k x³)).
template <typename T>
T derivative(T x) {
  const T a = static_cast<T>(kSqrt2OverPi), k = static_cast<T>(kCubic);
  const T t = tanh_of(a * (x + k * x * x * x));
  return T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * a * (T(1) + T(3) * k * x * x);
}
}  // namespace

template <typename T>
void Gelu<T>::forward(const T* inp, T* out, std::int64_t n, Device device) {
  NDMESH_CUDA_TWIN(device, cuda::gelu_forward(out, inp, n))
  for (std::int64_t i = 0; i < n; ++i) out[i] = gelu_of(inp[i]);
}

template <typename T>
void Gelu<T>::forward(const T* inp, BFloat16* out, std::int64_t n, Device device) {
  NDMESH_CUDA_TWIN(device, cuda::gelu_forward(out, inp, n))
  for (std::int64_t i = 0; i < n; ++i) out[i] = BFloat16(static_cast<float>(gelu_of(inp[i])));
}

template <typename T>
void Gelu<T>::forward_bias(const T* p, const ops::SharedOperand<T>& bias, BFloat16* pre, BFloat16* out,
                           std::int64_t rows, std::int64_t cols, Device device) {
  NDMESH_CUDA_TWIN(
      device, cuda::gelu_bias_forward(out, pre, p, static_cast<const BFloat16*>(bias.rounded()), rows, cols))
  const T* b = static_cast<const T*>(bias.rounded());  // bf16 values, kept in T
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t j = 0; j < cols; ++j) {
      const T x = p[r * cols + j] + b[j];
      pre[r * cols + j] = BFloat16(static_cast<float>(x));
      out[r * cols + j] = BFloat16(static_cast<float>(gelu_of(x)));
    }
}

template <typename T>
void Gelu<T>::backward(const T* dout, const BFloat16* inp, BFloat16* dinp, std::int64_t n, Device device) {
  NDMESH_CUDA_TWIN(device, cuda::gelu_backward(dinp, dout, inp, n))
  for (std::int64_t i = 0; i < n; ++i)
    dinp[i] = BFloat16(static_cast<float>(derivative(static_cast<T>(static_cast<float>(inp[i]))) * dout[i]));
}

template <typename T>
void Gelu<T>::backward(const T* dout, const T* inp, T* dinp, std::int64_t n, Device device) {
  NDMESH_CUDA_TWIN(device, cuda::gelu_backward(dinp, dout, inp, n))
  for (std::int64_t i = 0; i < n; ++i) {
    const T d = derivative(inp[i]);
    if (dinp == dout)
      dinp[i] = d * dout[i];
    else
      dinp[i] += d * dout[i];
  }
}

template struct Gelu<float>;
template struct Gelu<double>;

}  // namespace ndmesh::nn
