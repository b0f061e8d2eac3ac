// RmsNorm over the last dimension (Zhang and Sennrich 2019; Llama):
//   out = x * rstd * w,  rstd = 1 / sqrt(mean(x^2) + eps),
// no mean subtraction and no shift. The forward saves rstd per row for the backward.
#pragma once

#include <cstdint>

#include "ndmesh/nn/norm.hpp"

namespace ndmesh::nn {

/// Root-mean-square normalisation with a learned scale.
template <typename T>
class RmsNorm final : public Norm<T> {
 public:
  /// Declares "<name>.weight" [channels].
  RmsNorm(ParamStore<T>& store, NormOptions options);
  void init() const override;
  void forward(const T* inp, T* out, T* mean, T* rstd, std::int64_t rows) const override;
  void forward(const T* inp, BFloat16* out, T* mean, T* rstd, std::int64_t rows) const override;
  void forward_residual(const T* x, const T* add, T* residual, T* out, T* mean, T* rstd, std::int64_t rows,
                        const T* x_bias = nullptr) const override;
  void forward_residual(const T* x, const T* add, T* residual, BFloat16* out, T* mean, T* rstd, std::int64_t rows,
                        const T* x_bias = nullptr) const override;
  /// With g = dout * w and xhat = x * rstd: dx = rstd * (g - xhat * mean(g * xhat)),
  /// dw += dout * xhat.
  void backward(const T* dout, const T* inp, const T* mean, const T* rstd, T* dinp, std::int64_t rows,
                const T* dresidual = nullptr, T* dresidual_sums = nullptr) const override;
  bool keeps_mean() const override { return false; }
  const NormOptions& options() const override { return options_; }
  Device device() const override { return store_->device(); }
  int weight_id() const { return weight_; }

 private:
  template <typename Out>
  void forward_to(const T* inp, Out* out, T* rstd, std::int64_t rows) const;
  template <typename Out>
  void forward_residual_to(const T* x, const T* add, T* residual, Out* out, T* rstd, std::int64_t rows,
                           const T* x_bias) const;
  ParamStore<T>* store_;
  NormOptions options_;
  int weight_ = -1;
};

}  // namespace ndmesh::nn
