// GatedMlp: the SwiGLU MLP of Llama (Shazeer 2020),
//   out = down(silu(gate(x)) * up(x)),
// with gate and up as one column-parallel product `fc` (C -> 2F: the gate rows, then the up
// rows; under tp each rank holds its F / tp rows of each, so its output is [gate | up] of its
// slice) and down as the row-parallel `proj` (F -> C). The activation runs in one pass over
// fc's output (nn::Swiglu).
#pragma once

#include "ndmesh/nn/feed_forward.hpp"

namespace ndmesh::nn {

/// The gated (SwiGLU) MLP.
template <typename T>
class GatedMlp final : public FeedForwardPasses<GatedMlp<T>, T> {
 public:
  /// Declares "<name>.fc.weight" [2F, C] and "<name>.proj.weight" [C, F] (and their biases
  /// with options.bias).
  GatedMlp(ParamStore<T>& store, MlpOptions options);
  std::int64_t pre_width() const override { return 2 * this->local_ffn(); }
  /// The hidden's gradient and the pre-activation's, side by side.
  std::int64_t scratch_width() const override { return 3 * this->local_ffn(); }
  const MlpOptions& options() const override { return options_; }
  const Linear<T>& fc() const override { return fc_; }
  const Linear<T>& proj() const override { return proj_; }

 private:
  friend class FeedForwardPasses<GatedMlp<T>, T>;
  template <typename In>
  void forward_from(const In* inp, T* out, MlpActivations<T>& acts, std::int64_t rows) const;
  template <typename In, typename S>
  void backward_from(const T* dout, const In* inp, const MlpActivations<T>& acts, T* dinp, S* scratch,
                     std::int64_t rows) const;
  MlpOptions options_;
  Linear<T> fc_;
  Linear<T> proj_;
};

}  // namespace ndmesh::nn
