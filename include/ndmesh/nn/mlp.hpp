// MLP: fc (C -> F), GELU, proj (F -> C). For tensor parallelism fc is the
// column-parallel half (rows of its weight and its bias split over tp) and proj the
// row-parallel half (columns split; its bias is deferred: the caller adds it after
// reducing the output over tp). The options give the full F; a rank computes F / tp.
#pragma once

#include <cstdint>
#include <string>

#include "ndmesh/core/dtype.hpp"
#include "ndmesh/nn/feed_forward.hpp"
#include "ndmesh/nn/linear.hpp"
#include "ndmesh/nn/tp.hpp"
#include "ndmesh/tensor/tensor.hpp"

namespace ndmesh::nn {

/// Two-layer perceptron with GELU: out = proj(gelu(fc(inp))) without proj's bias. Under bf16
/// products fc's product writes the pre-activation and GELU of it into bfloat16 (cuBLASLt's
/// GELU_AUX_BIAS epilogue on a GPU), each rounded once from the fp32 value.
template <typename T>
class Mlp final : public FeedForwardPasses<Mlp<T>, T> {
 public:
  /// Declares "<name>.fc.weight" [F, C] and "<name>.proj.weight" [C, F] (and their biases
  /// with options.bias).
  Mlp(ParamStore<T>& store, MlpOptions options);

  std::int64_t pre_width() const override { return this->local_ffn(); }
  /// The d pre-activation, written by proj's backward and read by fc's products as it lies.
  std::int64_t scratch_width() const override { return this->local_ffn(); }

  /// The options it was built with.
  const MlpOptions& options() const override { return options_; }
  const Linear<T>& fc() const override { return fc_; }
  const Linear<T>& proj() const override { return proj_; }

 private:
  friend class FeedForwardPasses<Mlp<T>, T>;
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
