// RmsNorm backward, per row with xhat = x * rstd and g = dout * w:
//   dx = rstd * (g - xhat * mean(g * xhat)),  dw += dout * xhat.
#include "ndmesh/nn/rmsnorm.hpp"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "ndmesh/core/error.hpp"
#include "tensor/cuda_twin.hpp"

namespace ndmesh::nn {

template <typename T>
RmsNorm<T>::RmsNorm(ParamStore<T>& store, NormOptions options) : store_(&store), options_(std::move(options)) {
  NDMESH_CHECK(options_.channels > 0, "nn", "rmsnorm '{}' has channels={}", options_.name, options_.channels);
  weight_ = store.add(options_.name + ".weight", {options_.channels}, false, options_.shard);
}

template <typename T>
void RmsNorm<T>::init() const {
  std::fill(store_->mutable_param(weight_), store_->mutable_param(weight_) + options_.channels, T(1));
}

template <typename T>
template <typename Out>
void RmsNorm<T>::forward_to(const T* inp, Out* out, T* rstd, std::int64_t rows) const {
  const std::int64_t c = options_.channels;
  const T* w = store_->param(weight_);
  NDMESH_CUDA_TWIN(device(), cuda::rmsnorm_forward(out, rstd, inp, w, rows, c, static_cast<float>(options_.eps)))
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* x = inp + r * c;
    Out* y = out + r * c;
    T ms = 0;
    for (std::int64_t i = 0; i < c; ++i) ms += x[i] * x[i];
    ms /= static_cast<T>(c);
    const T s = T(1) / std::sqrt(ms + static_cast<T>(options_.eps));
    for (std::int64_t i = 0; i < c; ++i) {
      const T v = x[i] * s * w[i];
      if constexpr (std::is_same_v<Out, BFloat16>)
        y[i] = BFloat16(static_cast<float>(v));
      else
        y[i] = v;
    }
    rstd[r] = s;
  }
}

template <typename T>
void RmsNorm<T>::forward(const T* inp, T* out, T* /*mean*/, T* rstd, std::int64_t rows) const {
  forward_to(inp, out, rstd, rows);
}

template <typename T>
void RmsNorm<T>::forward(const T* inp, BFloat16* out, T* /*mean*/, T* rstd, std::int64_t rows) const {
  forward_to(inp, out, rstd, rows);
}

template <typename T>
template <typename Out>
void RmsNorm<T>::forward_residual_to(const T* x, const T* add, T* residual, Out* out, T* rstd, std::int64_t rows,
                                     const T* x_bias) const {
  const std::int64_t c = options_.channels;
  NDMESH_CUDA_TWIN(device(), cuda::residual_rmsnorm_forward(residual, out, rstd, x, add, store_->param(weight_), rows,
                                                            c, static_cast<float>(options_.eps), x_bias))
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t j = 0; j < c; ++j) {
      const std::int64_t i = r * c + j;
      residual[i] = (x_bias != nullptr ? x[i] + x_bias[j] : x[i]) + add[i];
    }
  forward_to(residual, out, rstd, rows);
}

template <typename T>
void RmsNorm<T>::forward_residual(const T* x, const T* add, T* residual, T* out, T* /*mean*/, T* rstd,
                                  std::int64_t rows, const T* x_bias) const {
  forward_residual_to(x, add, residual, out, rstd, rows, x_bias);
}

template <typename T>
void RmsNorm<T>::forward_residual(const T* x, const T* add, T* residual, BFloat16* out, T* /*mean*/, T* rstd,
                                  std::int64_t rows, const T* x_bias) const {
  forward_residual_to(x, add, residual, out, rstd, rows, x_bias);
}

template <typename T>
void RmsNorm<T>::backward(const T* dout, const T* inp, const T* /*mean*/, const T* rstd, T* dinp, std::int64_t rows,
                          const T* dresidual, T* dresidual_sums) const {
  const std::int64_t c = options_.channels;
  const T* w = store_->param(weight_);
  T* dw = store_->grad(weight_);
  NDMESH_CHECK(dresidual_sums == nullptr || dresidual != nullptr, "nn",
               "rmsnorm '{}': the residual's column sums need the residual's gradient", options_.name);
  if (dresidual == nullptr) dresidual = dinp;  // accumulate
  NDMESH_CUDA_TWIN(device(), cuda::rmsnorm_backward(dinp, dw, dout, inp, w, rstd, rows, c, dresidual, dresidual_sums))
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* x = inp + r * c;
    const T* dy = dout + r * c;
    const T* dres = dresidual + r * c;
    T* dx = dinp + r * c;
    const T s = rstd[r];
    T gx_mean = 0;
    for (std::int64_t i = 0; i < c; ++i) {
      const T xhat = x[i] * s;
      gx_mean += dy[i] * w[i] * xhat;
      dw[i] += dy[i] * xhat;
    }
    if (dresidual_sums != nullptr)  // read before dx is written: dresidual may be dinp
      for (std::int64_t i = 0; i < c; ++i) dresidual_sums[i] += dres[i];
    gx_mean /= static_cast<T>(c);
    for (std::int64_t i = 0; i < c; ++i) {
      const T xhat = x[i] * s;
      dx[i] = dres[i] + s * (dy[i] * w[i] - xhat * gx_mean);
    }
  }
}

template class RmsNorm<float>;
template class RmsNorm<double>;

}  // namespace ndmesh::nn
