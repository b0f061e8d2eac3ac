// LayerNorm backward, per row with xhat = (x - mean) * rstd and g = dout * w:
//   dx = rstd * (g - mean(g) - xhat * mean(g * xhat)).
#include "ndmesh/nn/layernorm.hpp"

#include <cmath>
#include <type_traits>

#include "ndmesh/core/error.hpp"
#include "tensor/cuda_twin.hpp"

namespace ndmesh::nn {

template <typename T>
LayerNorm<T>::LayerNorm(ParamStore<T>& store, LayerNormOptions options)
    : store_(&store), options_(std::move(options)) {
  NDMESH_CHECK(options_.channels > 0, "nn", "layernorm '{}' has channels={}", options_.name,
               options_.channels);
  weight_ = store.add(options_.name + ".weight", {options_.channels}, false, options_.shard);
  bias_ = store.add(options_.name + ".bias", {options_.channels}, false, options_.shard);
}

template <typename T>
void LayerNorm<T>::init() const {
  std::fill(store_->mutable_param(weight_), store_->mutable_param(weight_) + options_.channels, T(1));
  std::fill(store_->mutable_param(bias_), store_->mutable_param(bias_) + options_.channels, T(0));
}

template <typename T>
template <typename Out>
void LayerNorm<T>::forward_to(const T* inp, Out* out, T* mean, T* rstd, std::int64_t rows) const {
  const std::int64_t c = options_.channels;
  const T* w = store_->param(weight_);
  const T* b = store_->param(bias_);
  NDMESH_CUDA_TWIN(device(), cuda::layernorm_forward(out, mean, rstd, inp, w, b, rows, c, static_cast<float>(options_.eps)))
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* x = inp + r * c;
    Out* y = out + r * c;
    T m = 0;
    for (std::int64_t i = 0; i < c; ++i) m += x[i];
    m /= static_cast<T>(c);
    T var = 0;
    for (std::int64_t i = 0; i < c; ++i) var += (x[i] - m) * (x[i] - m);
    var /= static_cast<T>(c);
    T s = T(1) / std::sqrt(var + static_cast<T>(options_.eps));
    for (std::int64_t i = 0; i < c; ++i) {
      const T v = (x[i] - m) * s * w[i] + b[i];
      if constexpr (std::is_same_v<Out, BFloat16>)
        y[i] = BFloat16(static_cast<float>(v));
      else
        y[i] = v;
    }
    mean[r] = m;
    rstd[r] = s;
  }
}

template <typename T>
void LayerNorm<T>::forward(const T* inp, T* out, T* mean, T* rstd, std::int64_t rows) const {
  forward_to(inp, out, mean, rstd, rows);
}

template <typename T>
void LayerNorm<T>::forward(const T* inp, BFloat16* out, T* mean, T* rstd, std::int64_t rows) const {
  forward_to(inp, out, mean, rstd, rows);
}

template <typename T>
template <typename Out>
void LayerNorm<T>::forward_residual_to(const T* x, const T* add, T* residual, Out* out, T* mean, T* rstd,
                                       std::int64_t rows, const T* x_bias) const {
  const std::int64_t c = options_.channels;
  NDMESH_CUDA_TWIN(device(), cuda::residual_layernorm_forward(residual, out, mean, rstd, x, add, store_->param(weight_),
                                                              store_->param(bias_), rows, c,
                                                              static_cast<float>(options_.eps), x_bias))
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t j = 0; j < c; ++j) {
      const std::int64_t i = r * c + j;
      residual[i] = (x_bias != nullptr ? x[i] + x_bias[j] : x[i]) + add[i];
    }
  forward_to(residual, out, mean, rstd, rows);
}

template <typename T>
void LayerNorm<T>::forward_residual(const T* x, const T* add, T* residual, T* out, T* mean, T* rstd,
                                    std::int64_t rows, const T* x_bias) const {
  forward_residual_to(x, add, residual, out, mean, rstd, rows, x_bias);
}

template <typename T>
void LayerNorm<T>::forward_residual(const T* x, const T* add, T* residual, BFloat16* out, T* mean, T* rstd,
                                    std::int64_t rows, const T* x_bias) const {
  forward_residual_to(x, add, residual, out, mean, rstd, rows, x_bias);
}

template <typename T>
void LayerNorm<T>::backward(const T* dout, const T* inp, const T* mean, const T* rstd, T* dinp,
                            std::int64_t rows, const T* dresidual, T* dresidual_sums) const {
  const std::int64_t c = options_.channels;
  const T* w = store_->param(weight_);
  T* dw = store_->grad(weight_);
  T* db = store_->grad(bias_);
  NDMESH_CHECK(dresidual_sums == nullptr || dresidual != nullptr, "nn",
               "layernorm '{}': the residual's column sums need the residual's gradient", options_.name);
  if (dresidual == nullptr) dresidual = dinp;  // accumulate
  NDMESH_CUDA_TWIN(device(), cuda::layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, rows, c, dresidual,
                                                      dresidual_sums))
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* x = inp + r * c;
    const T* dy = dout + r * c;
    const T* dres = dresidual + r * c;
    T* dx = dinp + r * c;
    const T m = mean[r], s = rstd[r];
    T g_mean = 0, gx_mean = 0;
    for (std::int64_t i = 0; i < c; ++i) {
      T xhat = (x[i] - m) * s;
      T g = dy[i] * w[i];
      g_mean += g;
      gx_mean += g * xhat;
      dw[i] += dy[i] * xhat;
      db[i] += dy[i];
    }
    if (dresidual_sums != nullptr)  // read before dx is written: dresidual may be dinp
      for (std::int64_t i = 0; i < c; ++i) dresidual_sums[i] += dres[i];
    g_mean /= static_cast<T>(c);
    gx_mean /= static_cast<T>(c);
    for (std::int64_t i = 0; i < c; ++i) {
      T xhat = (x[i] - m) * s;
      dx[i] = dres[i] + s * (dy[i] * w[i] - g_mean - xhat * gx_mean);
    }
  }
}

template class LayerNorm<float>;
template class LayerNorm<double>;

}  // namespace ndmesh::nn
