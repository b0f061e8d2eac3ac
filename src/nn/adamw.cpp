#include "ndmesh/nn/adamw.hpp"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "ndmesh/core/error.hpp"
#include "ndmesh/core/streams.hpp"
#include "ndmesh/tensor/device.hpp"
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
void AdamW<T>::offload_to_host(std::int64_t chunk) {
  if constexpr (!std::is_same_v<T, float>) {
    fail<InternalError>("nn", "AdamW offload is float only");
  } else {
    NDMESH_CHECK(device_ == Device::kCuda, "nn", "AdamW offload to pinned host memory needs a CUDA store");
    NDMESH_CHECK(offload_ == nullptr && pinned_ == nullptr, "nn", "AdamW moments offloaded twice");
    pinned_ = std::make_unique<PinnedOffload>(state_, chunk);  // zero moments
    if (m_.numel() > 0) {
      cuda::copy_to_host(pinned_->m(), m_.data(), static_cast<std::size_t>(state_) * sizeof(T));
      cuda::copy_to_host(pinned_->v(), v_.data(), static_cast<std::size_t>(state_) * sizeof(T));
    }
    m_ = Tensor<T>();
    v_ = Tensor<T>();
    master_stale_ = true;
  }
}

template <typename T>
void AdamW<T>::allocate() const {
  if (offload_ || pinned_ || m_.numel() == state_) return;
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
  if (pinned_) {
    m.assign(pinned_->m(), pinned_->m() + state_);
    v.assign(pinned_->v(), pinned_->v() + state_);
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
  if (pinned_) {
    std::copy(m, m + state_, pinned_->m());
    std::copy(v, v + state_, pinned_->v());
    master_stale_ = true;  // a checkpoint load writes the parameters too
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
void AdamW<T>::update(ParamStore<T>& store, double lr, GradNorm norm, const T* segment_grads) {
  ++t_;
  // The multi-tensor kernel clips with a square sum on the device itself; every other path
  // computes the factor here (reading the square sum back from the device first).
  const bool offloaded = pinned_ != nullptr || offload_ != nullptr;
  const bool clips_on_device = norm.square_sum != nullptr && store.device() == Device::kCuda && !offloaded;
  if (norm.square_sum != nullptr && !clips_on_device) {
    double square = 0;
    if (store.device() == Device::kCuda)
      cuda::copy_to_host(&square, norm.square_sum, sizeof square);
    else
      square = *norm.square_sum;
    norm = GradNorm(std::sqrt(std::max(0.0, square)));
  }
  const double grad_norm = norm.norm;
  const double clip =
      options_.clip_norm > 0 && grad_norm > options_.clip_norm ? options_.clip_norm / grad_norm : 1.0;
  const double b1 = options_.beta1, b2 = options_.beta2;
  const double c1 = 1.0 - std::pow(b1, static_cast<double>(t_));
  const double c2 = 1.0 - std::pow(b2, static_cast<double>(t_));
  // The CPU loop over n elements: weights w, gradients grads, moments ms, vs (host memory).
  auto host_update = [&](T* w, const T* grads, T* ms, T* vs, std::int64_t count, double decay) {
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
    if (pinned_) {
      update_pinned(store, segment_grads, host_update);
      return;
    }
  // The update of the elements [from, from + count) of a piece, with its moments at ms, vs.
  auto update = [&](const Piece& piece, std::int64_t from, std::int64_t count, T* ms, T* vs) {
    const double decay = piece.decay ? options_.weight_decay : 0.0;
    T* w = store.params().data() + piece.offset + from;
    const T* grads =
        (segment_grads ? segment_grads + piece.state : store.grads().data() + piece.offset) + from;
    NDMESH_CUDA_TWIN(store.device(),
                     cuda::adamw_update(w, grads, ms, vs, count, lr, b1, b2, options_.eps, decay, clip, c1, c2))
    host_update(w, grads, ms, vs, count, decay);
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
    // Owning every parameter, it writes the store's bfloat16 copy with the update (the
    // weights the next step's bf16 products read); a shard's update leaves it stale.
    BFloat16* w16 = state_ == store.size() ? store.bf16_copy() : nullptr;
    cuda::adamw_update_multi(store.params().data(), w16, segment_grads ? segment_grads : store.grads().data(),
                             m_.data(), v_.data(), segments.data(), static_cast<int>(segments.size()), lr, b1, b2,
                             options_.eps, clip, c1, c2, clips_on_device ? norm.square_sum : nullptr,
                             options_.clip_norm);
    if (w16 != nullptr) store.bf16_written();
  })
  for (const Piece& piece : pieces_)
    update(piece, 0, piece.count, m_.data() + piece.state, v_.data() + piece.state);
}

template <typename T>
template <typename Loop>
void AdamW<T>::update_pinned(ParamStore<T>& store, const T* segment_grads, Loop&& host_update) {
  PinnedOffload& p = *pinned_;
  StreamOps& ops = cuda::stream_ops();
  void* copies = cuda::copy_stream();
  const std::int64_t chunk = p.chunk(), chunks = (state_ + chunk - 1) / chunk;
  T* params = store.params().data();
  const T* grads = store.grads().data();
  // Calls f(piece, lo, hi) for the part [lo, hi) of each piece inside state [first, last).
  std::size_t next = 0;
  auto each = [&](std::int64_t first, std::int64_t last, std::size_t from, auto&& f) {
    for (std::size_t k = from; k < pieces_.size() && pieces_[k].state < last; ++k) {
      const Piece& piece = pieces_[k];
      const std::int64_t lo = std::max(first, piece.state), hi = std::min(last, piece.state + piece.count);
      if (lo < hi) f(piece, lo, hi);
    }
  };
  auto bytes = [](std::int64_t n) { return static_cast<std::size_t>(n) * sizeof(T); };
  // The copy stream starts after the backward and the reductions on the compute stream.
  ops.record(p.event(2), cuda::stream());
  ops.wait(copies, p.event(2));
  if (master_stale_) {  // the parameters are the master's source (start, or a load)
    each(0, state_, 0, [&](const Piece& piece, std::int64_t lo, std::int64_t hi) {
      cuda::copy_async(p.master() + lo, params + piece.offset + (lo - piece.state), bytes(hi - lo), copies);
      p.bytes_to_host += static_cast<std::int64_t>(bytes(hi - lo));
    });
    master_stale_ = false;
  }
  // Chunk c's gradients into staging buffer c % 2 (padding between pieces is not copied).
  std::size_t fetch_from = 0;
  auto fetch = [&](std::int64_t c) {
    const std::int64_t first = c * chunk, last = std::min(state_, first + chunk);
    while (fetch_from < pieces_.size() && pieces_[fetch_from].state + pieces_[fetch_from].count <= first) ++fetch_from;
    T* staging = p.staging(static_cast<int>(c % 2));
    each(first, last, fetch_from, [&](const Piece& piece, std::int64_t lo, std::int64_t hi) {
      const T* src = segment_grads ? segment_grads + lo : grads + piece.offset + (lo - piece.state);
      cuda::copy_async(staging + (lo - first), src, bytes(hi - lo), copies);
      p.bytes_to_host += static_cast<std::int64_t>(bytes(hi - lo));
    });
    ops.record(p.event(static_cast<int>(c % 2)), copies);
  };
  if (chunks > 0) fetch(0);
  for (std::int64_t c = 0; c < chunks; ++c) {
    // Chunk c+1's gradients move while chunk c is updated (its buffer's chunk c-1 is done).
    if (c + 1 < chunks) fetch(c + 1);
    cuda::wait_event(p.event(static_cast<int>(c % 2)));
    const std::int64_t first = c * chunk, last = std::min(state_, first + chunk);
    while (next < pieces_.size() && pieces_[next].state + pieces_[next].count <= first) ++next;
    const T* staging = p.staging(static_cast<int>(c % 2));
    each(first, last, next, [&](const Piece& piece, std::int64_t lo, std::int64_t hi) {
      host_update(p.master() + lo, staging + (lo - first), p.m() + lo, p.v() + lo, hi - lo,
                  piece.decay ? options_.weight_decay : 0.0);
      cuda::copy_async(params + piece.offset + (lo - piece.state), p.master() + lo, bytes(hi - lo), copies);
      p.bytes_to_device += static_cast<std::int64_t>(bytes(hi - lo));
    });
  }
  // The parameters are on the device before the next forward (and before the master changes).
  ops.record(p.event(3), copies);
  cuda::wait_event(p.event(3));
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
