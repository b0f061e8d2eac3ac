// AdamW (Loshchilov & Hutter) over a flat ParamStore, with global-norm gradient clipping.
//
// One update, with g the gradient scaled by min(1, clip_norm / ||g||):
//   m = b1 m + (1 - b1) g,  v = b2 v + (1 - b2) g²
//   w -= lr * (m / (1 - b1^t) / (sqrt(v / (1 - b2^t)) + eps) + weight_decay * w)
// Weight decay applies only to views marked `decay` (matrices, not norms or biases).
// The norm is split from the update so that a parallel run can all-reduce the squared
// norm of its shards before updating.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ndmesh/nn/offload.hpp"
#include "ndmesh/tensor/params.hpp"
#include "ndmesh/tensor/tensor.hpp"

namespace ndmesh::nn {

/// Hyper-parameters of AdamW (the learning rate is passed per step).
struct AdamWOptions {
  double beta1 = 0.9;         ///< first-moment decay
  double beta2 = 0.95;        ///< second-moment decay
  double eps = 1e-8;          ///< added to sqrt(v)
  double weight_decay = 0.1;  ///< decoupled, only on views marked `decay`
  double clip_norm = 1.0;     ///< 0: no clipping
};

/// The global gradient norm an update clips with: a number on the host, or the gradients'
/// square sum where they live (a double in device memory on CUDA: ops::square_sum_many_into),
/// which the CUDA update's kernel reads itself, so that the host enqueues the update without
/// waiting for the norm. norm = sqrt(max(0, square sum)) either way, the same double.
struct GradNorm {
  GradNorm(double value) : norm(value) {}  // NOLINT(google-explicit-constructor): a number is a norm
  static GradNorm of_square_sum(const double* square_sum) {
    GradNorm g(0.0);
    g.square_sum = square_sum;
    return g;
  }
  double norm = 0;
  const double* square_sum = nullptr;  ///< when set, the norm's square (where the gradients are)
};

/// A range of the flat parameter buffer.
struct Segment {
  std::int64_t offset = 0;
  std::int64_t count = 0;
};

/// The optimizer and its state (two moments per parameter element, and the step count).
/// It may own only some segments of the flat buffer (a ZeRO shard): then its moments hold
/// those segments one after another and update() touches only them.
template <typename T>
class AdamW {
 public:
  /// State sized for `store` (which must be allocated), over `segments` (empty: all of it).
  AdamW(const ParamStore<T>& store, AdamWOptions options = {}, std::vector<Segment> segments = {});

  /// Sum of squared gradients of the whole store (in double).
  static double grad_square_sum(const ParamStore<T>& store);
  /// Clips with `grad_norm` (the global norm) and applies one update with `lr` to the
  /// owned segments. `segment_grads` holds the gradients of the segments one after
  /// another; nullptr: the store's gradients at the same offsets. A norm given as a square
  /// sum on the device is read by the update's kernel (one CUDA launch for the whole store);
  /// the updates that run on the host (moments offloaded) read it back first.
  void update(ParamStore<T>& store, double lr, GradNorm grad_norm, const T* segment_grads = nullptr);
  /// grad_square_sum + update; returns the gradient norm before clipping.
  double step(ParamStore<T>& store, double lr);

  /// The hyper-parameters.
  const AdamWOptions& options() const { return options_; }
  /// Updates done so far.
  std::int64_t steps() const { return t_; }
  /// First and second moments of the owned segments, one after another (on the store's
  /// device: CPU only through these spans; moments_to_host / moments_from_host anywhere).
  std::span<T> m() { return allocate(), std::span<T>{m_.data(), static_cast<std::size_t>(m_.numel())}; }
  std::span<T> v() { return allocate(), std::span<T>{v_.data(), static_cast<std::size_t>(v_.numel())}; }
  std::span<const T> m() const {
    return allocate(), std::span<const T>{m_.data(), static_cast<std::size_t>(m_.numel())};
  }
  std::span<const T> v() const {
    return allocate(), std::span<const T>{v_.data(), static_cast<std::size_t>(v_.numel())};
  }
  /// The moments on the host (checkpoints), and back.
  void moments_to_host(std::vector<T>& m, std::vector<T>& v) const;
  void moments_from_host(const T* m, const T* v);
  /// Restores the step count (the moments are restored through m() and v()). With the
  /// moments in pinned host memory the master copy is read from the parameters again at the
  /// next update (a checkpoint load wrote them).
  void set_steps(std::int64_t t) {
    t_ = t;
    master_stale_ = true;
  }
  /// The owned segments.
  const std::vector<Segment>& segments() const { return segments_; }
  /// Moves the moments into the file `path` (nn/offload.hpp; CPU stores only): from now on
  /// update() streams them chunk by chunk and m() / v() are empty; the arithmetic is the
  /// same, so the results are the same bit for bit. Called before the first update the
  /// moments are zero and never take memory (AdamW allocates them on first use).
  void offload_to(const std::string& path, std::int64_t chunk = OffloadFile::kDefaultChunk);
  /// The offload file, or nullptr when the moments are in memory.
  const OffloadFile* offload() const { return offload_.get(); }
  /// --offload optimizer on a GPU (float CUDA stores only; ZeRO-Offload): the moments move to
  /// pinned host memory beside an fp32 master copy of the owned parameters (PinnedOffload).
  /// update() then copies the gradients to the host in chunks of `chunk` elements, updates
  /// the master and the moments there with the CPU loop (the CPU run's arithmetic, not the
  /// CUDA kernel's), and copies the updated parameters back, chunk i+1's gradients moving
  /// while chunk i is updated. m() / v() are empty; moments_to_host / _from_host reach them.
  void offload_to_host(std::int64_t chunk = PinnedOffload::kDefaultChunk);
  /// The pinned host offload, or nullptr.
  const PinnedOffload* pinned() const { return pinned_.get(); }
  /// With the moments offloaded: called around the update of each streamed chunk of state
  /// elements [first, first + count), with done = false before and true after (where
  /// --offload optimizer+params reads those parameters in and writes them back).
  using ChunkHook = std::function<void(std::int64_t first, std::int64_t count, bool done)>;
  void set_chunk_hook(ChunkHook hook) { chunk_hook_ = std::move(hook); }
  /// Elements of each moment (the owned segments' total), wherever they live.
  std::int64_t state_elements() const { return state_; }

 private:
  // Owned elements that are parameters (not padding), split by weight decay.
  struct Piece {
    std::int64_t offset;  // in the flat buffer
    std::int64_t state;   // in m_ / v_ / segment_grads
    std::int64_t count;
    bool decay;
  };
  AdamWOptions options_;
  std::vector<Segment> segments_;
  std::vector<Piece> pieces_;
  std::int64_t t_ = 0;
  std::int64_t state_ = 0;
  std::unique_ptr<OffloadFile> offload_;
  std::unique_ptr<PinnedOffload> pinned_;
  bool master_stale_ = true;  // pinned_: the master is read from the parameters at the next update
  ChunkHook chunk_hook_;
  Device device_ = Device::kCpu;
  // Allocates the (zero) moments in memory unless they are offloaded or allocated already.
  void allocate() const;
  // update() with the moments in pinned host memory; `host_update(w, g, m, v, n, decay)` is
  // the CPU loop.
  template <typename Loop>
  void update_pinned(ParamStore<T>& store, const T* segment_grads, Loop&& host_update);
  mutable Tensor<T> m_;
  mutable Tensor<T> v_;
};

}  // namespace ndmesh::nn
