// MLP: fc (C -> F), GELU, proj (F -> C). For tensor parallelism fc is the
// column-parallel half (rows of its weight and its bias split over tp) and proj the
// row-parallel half (columns split; its bias is deferred: the caller adds it after
// reducing the output over tp). The options give the full F; a rank computes F / tp.
#pragma once

#include <cstdint>
#include <string>

#include "ndmesh/core/dtype.hpp"
#include "ndmesh/nn/linear.hpp"
#include "ndmesh/nn/tp.hpp"
#include "ndmesh/tensor/tensor.hpp"

namespace ndmesh::nn {

/// Sizes and naming of an Mlp.
struct MlpOptions {
  std::int64_t channels = 0;  ///< C
  std::int64_t ffn = 0;       ///< F
  std::string name = "mlp";   ///< parameters "<name>.fc.*", "<name>.proj.*"
  TpShape tp;                 ///< the tensor-parallel split (default: none)
};

/// What the MLP forward keeps for its backward, for `rows` rows. Under bf16 products both
/// are kept in bfloat16 (`fc16`, `gelu16`; `fc` and `gelu` stay empty), as fc's product
/// writes them with cuBLASLt's GELU epilogue: the pre-activation rounded once from fc's fp32
/// output (with its bias) and gelu of that fp32 value rounded once. Every product that reads
/// the hidden (proj's forward and weight gradient) rounds it to bf16 anyway; GELU's
/// derivative in the backward is taken at the stored (rounded) pre-activation, as PyTorch's
/// autocast and llm.c do.
template <typename T>
struct MlpActivations {
  Tensor<T> fc;             ///< [rows, F] before GELU (fp32 products)
  Tensor<T> gelu;           ///< [rows, F] after GELU (fp32 products)
  Tensor<BFloat16> gelu16;  ///< [rows, F] after GELU, rounded to bf16 (bf16 products)
  Tensor<BFloat16> fc16;    ///< [rows, F] before GELU, rounded to bf16 (bf16 products)
  void resize(std::int64_t rows, std::int64_t ffn, bool bf16 = false) {
    if (bf16) {
      for (Tensor<BFloat16>* t : {&gelu16, &fc16}) {
        t->set_device(fc.device());
        t->resize({rows, ffn});
      }
    } else {
      fc.resize({rows, ffn});
      gelu.resize({rows, ffn});
    }
  }
};

/// Two-layer perceptron with GELU.
template <typename T>
class Mlp {
 public:
  Mlp(ParamStore<T>& store, MlpOptions options);

  /// F / tp: the width this rank computes.
  std::int64_t local_ffn() const { return options_.ffn / options_.tp.size; }
  /// Whether its activations keep the hidden gelu(fc) in bfloat16 (MlpActivations::gelu16):
  /// under bf16 products.
  bool hidden_in_bf16() const { return proj_.matmul_precision() == MatmulPrecision::kBf16; }
  /// out[rows, C] = proj(gelu(fc(inp))) without proj's bias (this rank's partial sum
  /// under tp; see proj().add_bias); fills acts (sized by acts.resize(rows, local_ffn(),
  /// hidden_in_bf16())).
  void forward(const T* inp, T* out, MlpActivations<T>& acts, std::int64_t rows) const;
  /// forward from an input stored in bfloat16 (a norm's output under bf16 products).
  void forward(const BFloat16* inp, T* out, MlpActivations<T>& acts, std::int64_t rows) const;
  /// Accumulates dinp and the parameter gradients (not proj's bias: proj().backward_bias).
  /// `scratch` holds at least rows * local_ffn() elements, T or, under bf16 products
  /// (hidden_in_bf16()), bfloat16 (the d pre-activation, written by proj's backward and read
  /// by fc's products as it lies); its contents are overwritten. dinp is written, not added to
  /// (GradInto::kSet).
  void backward(const T* dout, const T* inp, const MlpActivations<T>& acts, T* dinp, T* scratch,
                std::int64_t rows) const;
  void backward(const T* dout, const T* inp, const MlpActivations<T>& acts, T* dinp, BFloat16* scratch,
                std::int64_t rows) const;
  void backward(const T* dout, const BFloat16* inp, const MlpActivations<T>& acts, T* dinp, BFloat16* scratch,
                std::int64_t rows) const;

  /// The options it was built with.
  const MlpOptions& options() const { return options_; }
  const Linear<T>& fc() const { return fc_; }
  const Linear<T>& proj() const { return proj_; }

 private:
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
