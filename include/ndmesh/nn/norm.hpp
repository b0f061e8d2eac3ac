// Norm: the interface of the normalisation layers (LayerNorm, RmsNorm), so that a block and
// the model's head hold "a norm" and the architecture description picks which (make_norm).
//
// Every norm works on rows of `channels` features, keeps per-row statistics for its
// backward (LayerNorm: mean and rstd; RmsNorm: rstd only, `mean` may then be null), and has
// the fused passes the blocks use: the residual add before the norm, and the residual's
// gradient (and its column sums, a deferred bias's gradient) in the norm's backward.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "ndmesh/core/arch.hpp"
#include "ndmesh/core/dtype.hpp"
#include "ndmesh/tensor/device.hpp"
#include "ndmesh/tensor/params.hpp"

namespace ndmesh::nn {

/// Shape and naming of a norm.
struct NormOptions {
  std::int64_t channels = 0;
  double eps = 1e-5;
  std::string name = "ln";  ///< parameters "<name>.weight" (and "<name>.bias" for LayerNorm)
  ParamShard shard;         ///< replicated; under sequence parallelism grad_sum is set
};

/// A normalisation over the last dimension with a learned scale.
template <typename T>
class Norm {
 public:
  virtual ~Norm() = default;
  /// Initial values: scale 1 (and shift 0).
  virtual void init() const = 0;
  /// out[rows, C] from inp[rows, C]; writes the row statistics the backward reads (mean is
  /// unused, and may be null, where the norm keeps none).
  virtual void forward(const T* inp, T* out, T* mean, T* rstd, std::int64_t rows) const = 0;
  /// The same with the output rounded to bfloat16 once (through float for double).
  virtual void forward(const T* inp, BFloat16* out, T* mean, T* rstd, std::int64_t rows) const = 0;
  /// The residual connection and this norm in one pass over the rows: residual = x + add
  /// (stored; residual may be x), then forward(residual) as stored. With x_bias [channels]
  /// (the deferred bias of the layer that wrote x) residual = (x + x_bias) + add, the adds in
  /// that order.
  virtual void forward_residual(const T* x, const T* add, T* residual, T* out, T* mean, T* rstd, std::int64_t rows,
                                const T* x_bias = nullptr) const = 0;
  virtual void forward_residual(const T* x, const T* add, T* residual, BFloat16* out, T* mean, T* rstd,
                                std::int64_t rows, const T* x_bias = nullptr) const = 0;
  /// Accumulates dinp += d/dinp and the parameter gradients from dout and the saved
  /// statistics. With `dresidual` ([rows, C], may be dinp) dinp = dresidual + d/dinp
  /// instead; with `dresidual_sums` [C] also dresidual_sums += the column sums of dresidual.
  virtual void backward(const T* dout, const T* inp, const T* mean, const T* rstd, T* dinp, std::int64_t rows,
                        const T* dresidual = nullptr, T* dresidual_sums = nullptr) const = 0;
  /// Whether the backward reads the per-row mean (LayerNorm) or only rstd.
  virtual bool keeps_mean() const = 0;
  virtual const NormOptions& options() const = 0;
  /// Where its parameters live (its store's device; the pointers passed must live there too).
  virtual Device device() const = 0;
};

/// The norm of kind `kind` over `store`.
template <typename T>
std::unique_ptr<Norm<T>> make_norm(NormKind kind, ParamStore<T>& store, NormOptions options);

}  // namespace ndmesh::nn
