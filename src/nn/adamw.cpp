#include "ndmesh/nn/adamw.hpp"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "ndmesh/core/error.hpp"
#include "ndmesh/tensor/ops.hpp"
#include "tensor/cuda_twin.hpp"

namespace ndmesh::nn {

template <typename T>
AdamW<T>::AdamW(const ParamStore<T>& store, AdamWOptions options, std::vector<Segment> segments)
    : options_(options), segments_(std::move(segments)) {
  NDMESH_CHECK(store.allocated(), "nn", "AdamW built over a parameter store that is not allocated");
  if (segments_.empty()) segments_.push_back({0, store.size()});
  std::int64_t state = 0;
  for (const Segment& seg : segments_) {
    NDMESH_CHECK(seg.offset >= 0 && seg.count >= 0 && seg.offset + seg.count <= store.size(), "nn",
                 "AdamW segment [{}, {}) is outside the store of {} elements", seg.offset,
                 seg.offset + seg.count, store.size());
    for (const auto& view : store.views()) {
      const std::int64_t lo = std::max(seg.offset, view.offset);
      const std::int64_t hi = std::min(seg.offset + seg.count, view.offset + view.numel);
      if (lo < hi) pieces_.push_back({lo, state + (lo - seg.offset), hi - lo, view.decay});
    }
    state += seg.count;
  }
  state_ = state;
  // The moments live with the parameters; allocated on first use (offload_to() may move
  // them to a file before, and they then never take memory).
  device_ = store.device();
}

template <typename T>
void AdamW<T>::offload_to(const std::string& path, std::int64_t chunk) {
  if constexpr (!std::is_same_v<T, float>) {
    fail<InternalError>("nn", "AdamW offload is float only");
  } else {
    NDMESH_CHECK(m_.device() == Device::kCpu, "nn", "AdamW offload to a file needs the CPU store");
    NDMESH_CHECK(offload_ == nullptr, "nn", "AdamW moments offloaded twice");
    offload_ = std::make_unique<OffloadFile>(path, state_, chunk);  // zero-filled
    if (m_.numel() > 0) offload_->write_all(m_.data(), v_.data());
    m_ = Tensor<T>();
    v_ = Tensor<T>();
  }
}

template <typename T>
void AdamW<T>::allocate() const {
  if (offload_ || m_.numel() == state_) return;
  m_ = Tensor<T>({state_}, device_);
  v_ = Tensor<T>({state_}, device_);
}

template <typename T>
void AdamW<T>::moments_to_host(std::vector<T>& m, std::vector<T>& v) const {
  if constexpr (std::is_same_v<T, float>)
    if (offload_) {
      m.resize(static_cast<std::size_t>(state_));
      v.resize(static_cast<std::size_t>(state_));
      offload_->read_all(m.data(), v.data());
      return;
    }
  allocate();
  m = m_.to_host();
  v = v_.to_host();
}

template <typename T>
void AdamW<T>::moments_from_host(const T* m, const T* v) {
  if constexpr (std::is_same_v<T, float>)
    if (offload_) {
      offload_->write_all(m, v);
      return;
    }
  allocate();
  const auto n = static_cast<std::size_t>(m_.numel());
  if (m_.device() == Device::kCpu) {
    std::copy(m, m + n, m_.data());
    std::copy(v, v + n, v_.data());
    return;
  }
  cuda::copy_to_device(m_.data(), m, n * sizeof(T));
  cuda::copy_to_device(v_.data(), v, n * sizeof(T));
}

template <typename T>
double AdamW<T>::grad_square_sum(const ParamStore<T>& store) {
  return ops::square_sum(store.grads().data(), store.size(), store.device());
}

template <typename T>
void AdamW<T>::update(ParamStore<T>& store, double lr, double grad_norm, const T* segment_grads) {
  ++t_;
  const double clip =
      options_.clip_norm > 0 && grad_norm > options_.clip_norm ? options_.clip_norm / grad_norm : 1.0;
  const double b1 = options_.beta1, b2 = options_.beta2;
  const double c1 = 1.0 - std::pow(b1, static_cast<double>(t_));
  const double c2 = 1.0 - std::pow(b2, static_cast<double>(t_));
  // The update of the elements [from, from + count) of a piece, with its moments at ms, vs.
  auto update = [&](const Piece& piece, std::int64_t from, std::int64_t count, T* ms, T* vs) {
    const double decay = piece.decay ? options_.weight_decay : 0.0;
    T* w = store.params().data() + piece.offset + from;
    const T* grads =
        (segment_grads ? segment_grads + piece.state : store.grads().data() + piece.offset) + from;
    NDMESH_CUDA_TWIN(store.device(),
                     cuda::adamw_update(w, grads, ms, vs, count, lr, b1, b2, options_.eps, decay, clip, c1, c2))
    for (std::int64_t i = 0; i < count; ++i) {
      const double g = static_cast<double>(grads[i]) * clip;
      const double m = b1 * static_cast<double>(ms[i]) + (1 - b1) * g;
      const double v = b2 * static_cast<double>(vs[i]) + (1 - b2) * g * g;
      ms[i] = static_cast<T>(m);
      vs[i] = static_cast<T>(v);
      const double wi = static_cast<double>(w[i]);
      w[i] = static_cast<T>(wi - lr * ((m / c1) / (std::sqrt(v / c2) + options_.eps) + decay * wi));
    }
  };
  if constexpr (std::is_same_v<T, float>)
    if (offload_) {
      // The pieces are in state order; each streamed chunk updates the parts of the pieces
      // it holds (elementwise, so the split changes no result).
      std::size_t next = 0;
      offload_->stream([&](std::int64_t first, std::int64_t count, float* ms, float* vs) {
        const std::int64_t last = first + count;
        if (chunk_hook_) chunk_hook_(first, count, false);
        while (next < pieces_.size() && pieces_[next].state + pieces_[next].count <= first) ++next;
        for (std::size_t p = next; p < pieces_.size() && pieces_[p].state < last; ++p) {
          const Piece& piece = pieces_[p];
          const std::int64_t lo = std::max(first, piece.state),
                             hi = std::min(last, piece.state + piece.count);
          update(piece, lo - piece.state, hi - lo, ms + (lo - first), vs + (lo - first));
        }
        if (chunk_hook_) chunk_hook_(first, count, true);
      });
      return;
    }
  allocate();
  // On CUDA every piece in one launch (the same element update, bit for bit).
  NDMESH_CUDA_TWIN(store.device(), {
    std::vector<cuda::AdamWSegment> segments;
    segments.reserve(pieces_.size());
    for (const Piece& piece : pieces_)
      segments.push_back({.param = piece.offset,
                          .grad = segment_grads ? piece.state : piece.offset,
                          .state = piece.state,
                          .count = piece.count,
                          .decay = piece.decay ? options_.weight_decay : 0.0});
    cuda::adamw_update_multi(store.params().data(), nullptr, segment_grads ? segment_grads : store.grads().data(),
                             m_.data(), v_.data(), segments.data(), static_cast<int>(segments.size()), lr, b1, b2,
                             options_.eps, clip, c1, c2);
  })
  for (const Piece& piece : pieces_)
    update(piece, 0, piece.count, m_.data() + piece.state, v_.data() + piece.state);
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
