#include "ndmesh/nn/adamw.hpp"

#include <algorithm>
#include <cmath>

#include "ndmesh/core/error.hpp"

namespace ndmesh::nn {

template <typename T>
AdamW<T>::AdamW(const ParamStore<T>& store, AdamWOptions options, std::vector<Segment> segments)
    : options_(options), segments_(std::move(segments)) {
  NDMESH_CHECK(store.allocated(), "nn", "AdamW built over a parameter store that is not allocated");
  if (segments_.empty()) segments_.push_back({0, store.size()});
  std::int64_t state = 0;
  for (const Segment& seg : segments_) {
    NDMESH_CHECK(seg.offset >= 0 && seg.count >= 0 && seg.offset + seg.count <= store.size(), "nn",
                 "AdamW segment [{}, {}) is outside the store of {} elements", seg.offset, seg.offset + seg.count,
                 store.size());
    for (const auto& view : store.views()) {
      const std::int64_t lo = std::max(seg.offset, view.offset);
      const std::int64_t hi = std::min(seg.offset + seg.count, view.offset + view.numel);
      if (lo < hi) pieces_.push_back({lo, state + (lo - seg.offset), hi - lo, view.decay});
    }
    state += seg.count;
  }
  m_.assign(static_cast<std::size_t>(state), T(0));
  v_.assign(static_cast<std::size_t>(state), T(0));
}

template <typename T>
double AdamW<T>::grad_square_sum(const ParamStore<T>& store) {
  double sum = 0;
  for (T g : store.grads()) sum += static_cast<double>(g) * static_cast<double>(g);
  return sum;
}

template <typename T>
void AdamW<T>::update(ParamStore<T>& store, double lr, double grad_norm, const T* segment_grads) {
  ++t_;
  const double clip =
      options_.clip_norm > 0 && grad_norm > options_.clip_norm ? options_.clip_norm / grad_norm : 1.0;
  const double b1 = options_.beta1, b2 = options_.beta2;
  const double c1 = 1.0 - std::pow(b1, static_cast<double>(t_));
  const double c2 = 1.0 - std::pow(b2, static_cast<double>(t_));
  for (const Piece& piece : pieces_) {
    const double decay = piece.decay ? options_.weight_decay : 0.0;
    T* w = store.params().data() + piece.offset;
    const T* grads = segment_grads ? segment_grads + piece.state : store.grads().data() + piece.offset;
    T* ms = m_.data() + piece.state;
    T* vs = v_.data() + piece.state;
    for (std::int64_t i = 0; i < piece.count; ++i) {
      const double g = static_cast<double>(grads[i]) * clip;
      const double m = b1 * static_cast<double>(ms[i]) + (1 - b1) * g;
      const double v = b2 * static_cast<double>(vs[i]) + (1 - b2) * g * g;
      ms[i] = static_cast<T>(m);
      vs[i] = static_cast<T>(v);
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
