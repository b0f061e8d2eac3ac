// LayerNorm over the last dimension: out = (x - mean) * rstd * w + b, rstd = 1/sqrt(var + eps).
// The forward saves mean and rstd per row so the backward does not recompute them.
#pragma once

#include <cstdint>
#include <string>

#include "ndmesh/core/dtype.hpp"
#include "ndmesh/nn/norm.hpp"
#include "ndmesh/tensor/params.hpp"

namespace ndmesh::nn {

/// Shape and naming of a LayerNorm (parameters "<name>.weight", "<name>.bias").
using LayerNormOptions = NormOptions;

/// Layer normalisation with learned scale and shift.
template <typename T>
class LayerNorm final : public Norm<T> {
 public:
  /// Declares "<name>.weight" and "<name>.bias" [channels].
  LayerNorm(ParamStore<T>& store, LayerNormOptions options);

  /// Initial values: weight 1, bias 0.
  void init() const override;
  /// out[rows, C] from inp[rows, C]; writes mean[rows] and rstd[rows] for backward.
  void forward(const T* inp, T* out, T* mean, T* rstd, std::int64_t rows) const override;
  /// The same with the output rounded to bfloat16 once (through float for double): a norm's
  /// output kept in bf16 for the bf16 products that read it (they would round it anyway).
  void forward(const T* inp, BFloat16* out, T* mean, T* rstd, std::int64_t rows) const override;
  /// The residual connection and this norm in one pass over the rows: residual = x + add
  /// (stored; residual may be x), then forward(residual) as stored. With x_bias [channels]
  /// (the deferred bias of the layer that wrote x) residual = (x + x_bias) + add, the adds in
  /// that order (as Linear::add_bias, then the add). On CUDA one kernel
  /// (cuda::residual_layernorm_forward) instead of a bias pass, an add, a write and a read.
  void forward_residual(const T* x, const T* add, T* residual, T* out, T* mean, T* rstd, std::int64_t rows,
                        const T* x_bias = nullptr) const override;
  /// forward_residual with the normalised output in bfloat16 (the residual stays T).
  void forward_residual(const T* x, const T* add, T* residual, BFloat16* out, T* mean, T* rstd, std::int64_t rows,
                        const T* x_bias = nullptr) const override;
  /// Accumulates dinp += d/dinp, dweight, dbias from dout and the saved mean/rstd. With
  /// `dresidual` ([rows, C], may be dinp) dinp = dresidual + d/dinp instead: the residual
  /// path's gradient and the norm's in one pass (no copy of it into dinp first). With
  /// `dresidual_sums` [C] also dresidual_sums += the column sums of dresidual, in the pass that
  /// sums dweight and dbias: the gradient of the bias added on the residual path before this
  /// norm (a projection's deferred bias), which would otherwise read dresidual once more.
  void backward(const T* dout, const T* inp, const T* mean, const T* rstd, T* dinp, std::int64_t rows,
                const T* dresidual = nullptr, T* dresidual_sums = nullptr) const override;
  bool keeps_mean() const override { return true; }

  /// The options it was built with.
  const LayerNormOptions& options() const override { return options_; }
  /// Where its parameters live (its store's device; the pointers passed must live there too).
  Device device() const override { return store_->device(); }

 private:
  // The bodies of forward and forward_residual, the output T or BFloat16.
  template <typename Out>
  void forward_to(const T* inp, Out* out, T* mean, T* rstd, std::int64_t rows) const;
  template <typename Out>
  void forward_residual_to(const T* x, const T* add, T* residual, Out* out, T* mean, T* rstd, std::int64_t rows,
                           const T* x_bias) const;
  ParamStore<T>* store_;
  LayerNormOptions options_;
  int weight_ = -1;
  int bias_ = -1;
};

}  // namespace ndmesh::nn
