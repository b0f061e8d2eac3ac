#include "ndmesh/nn/swiglu.hpp"

#include <cmath>
#include <type_traits>

#include "tensor/cuda_twin.hpp"

namespace ndmesh::nn {

namespace {
template <typename C>
C sigmoid_of(C g) {
  return C(1) / (C(1) + std::exp(-g));
}

// The math in C (double for double, float otherwise), S the storage (T or BFloat16).
template <typename C, typename S>
C value(S x) {
  return static_cast<C>(static_cast<std::conditional_t<std::is_same_v<S, BFloat16>, float, S>>(x));
}

template <typename C, typename S>
S stored(C v) {
  if constexpr (std::is_same_v<S, BFloat16>)
    return BFloat16(static_cast<float>(v));
  else
    return static_cast<S>(v);
}

template <typename C, typename S>
void forward_rows(const S* pre, S* hidden, std::int64_t rows, std::int64_t f) {
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t j = 0; j < f; ++j) {
      const C g = value<C>(pre[r * 2 * f + j]), u = value<C>(pre[r * 2 * f + f + j]);
      hidden[r * f + j] = stored<C, S>(g * sigmoid_of(g) * u);
    }
}

template <typename C, typename S>
void backward_rows(const S* dhidden, const S* pre, S* dpre, std::int64_t rows, std::int64_t f) {
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t j = 0; j < f; ++j) {
      const C g = value<C>(pre[r * 2 * f + j]), u = value<C>(pre[r * 2 * f + f + j]);
      const C dh = value<C>(dhidden[r * f + j]);
      const C s = sigmoid_of(g);
      dpre[r * 2 * f + j] = stored<C, S>(dh * u * (s * (C(1) + g * (C(1) - s))));
      dpre[r * 2 * f + f + j] = stored<C, S>(dh * g * s);
    }
}
}  // namespace

template <typename T>
void Swiglu<T>::forward(const T* pre, T* hidden, std::int64_t rows, std::int64_t ffn, Device device) {
  NDMESH_CUDA_TWIN(device, cuda::swiglu_forward(hidden, pre, rows, ffn))
  forward_rows<T>(pre, hidden, rows, ffn);
}

template <typename T>
void Swiglu<T>::forward(const BFloat16* pre, BFloat16* hidden, std::int64_t rows, std::int64_t ffn, Device device) {
  NDMESH_CUDA_TWIN(device, cuda::swiglu_forward(hidden, pre, rows, ffn))
  forward_rows<float>(pre, hidden, rows, ffn);
}

template <typename T>
void Swiglu<T>::backward(const T* dhidden, const T* pre, T* dpre, std::int64_t rows, std::int64_t ffn,
                         Device device) {
  NDMESH_CUDA_TWIN(device, cuda::swiglu_backward(dpre, dhidden, pre, rows, ffn))
  backward_rows<T>(dhidden, pre, dpre, rows, ffn);
}

template <typename T>
void Swiglu<T>::backward(const BFloat16* dhidden, const BFloat16* pre, BFloat16* dpre, std::int64_t rows,
                         std::int64_t ffn, Device device) {
  NDMESH_CUDA_TWIN(device, cuda::swiglu_backward(dpre, dhidden, pre, rows, ffn))
  backward_rows<float>(dhidden, pre, dpre, rows, ffn);
}

template struct Swiglu<float>;
template struct Swiglu<double>;

}  // namespace ndmesh::nn
