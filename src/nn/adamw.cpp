#include "ndmesh/nn/adamw.hpp"

#include <cmath>

#include "ndmesh/core/error.hpp"

namespace ndmesh::nn {

template <typename T>
AdamW<T>::AdamW(const ParamStore<T>& store, AdamWOptions options)
    : options_(options),
      m_(static_cast<std::size_t>(store.size()), T(0)),
      v_(static_cast<std::size_t>(store.size()), T(0)) {
  NDMESH_CHECK(store.allocated(), "nn", "AdamW built over a parameter store that is not allocated");
}

template <typename T>
double AdamW<T>::grad_square_sum(const ParamStore<T>& store) {
  double sum = 0;
  for (T g : store.grads()) sum += static_cast<double>(g) * static_cast<double>(g);
  return sum;
}

template <typename T>
void AdamW<T>::update(ParamStore<T>& store, double lr, double grad_norm) {
  NDMESH_CHECK(static_cast<std::int64_t>(m_.size()) == store.size(), "nn",
               "AdamW state has {} elements but the store has {}", m_.size(), store.size());
  ++t_;
  const double clip =
      options_.clip_norm > 0 && grad_norm > options_.clip_norm ? options_.clip_norm / grad_norm : 1.0;
  const double b1 = options_.beta1, b2 = options_.beta2;
  const double c1 = 1.0 - std::pow(b1, static_cast<double>(t_));
  const double c2 = 1.0 - std::pow(b2, static_cast<double>(t_));
  T* w = store.params().data();
  const T* grads = store.grads().data();
  for (const auto& view : store.views()) {
    const double decay = view.decay ? options_.weight_decay : 0.0;
    for (std::int64_t i = view.offset; i < view.offset + view.numel; ++i) {
      const double g = static_cast<double>(grads[i]) * clip;
      const double m = b1 * static_cast<double>(m_[i]) + (1 - b1) * g;
      const double v = b2 * static_cast<double>(v_[i]) + (1 - b2) * g * g;
      m_[i] = static_cast<T>(m);
      v_[i] = static_cast<T>(v);
      const double wi = static_cast<double>(w[i]);
      w[i] = static_cast<T>(wi - lr * ((m / c1) / (std::sqrt(v / c2) + options_.eps) + decay * wi));
    }
  }
}

template <typename T>
double AdamW<T>::step(ParamStore<T>& store, double lr) {
  double norm = std::sqrt(grad_square_sum(store));
  update(store, lr, norm);
  return norm;
}

template class AdamW<float>;
template class AdamW<double>;

}  // namespace ndmesh::nn
