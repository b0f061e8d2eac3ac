// FeedForward: the interface of a block's MLP (the GELU Mlp, the gated SwiGLU GatedMlp), so
// that a block holds "an MLP" and the architecture description picks which
// (make_feed_forward).
//
// Every MLP is a column-parallel up projection `fc` (C -> pre_width), an activation
// (pre -> hidden, local_ffn() wide) and a row-parallel down projection `proj` (hidden -> C)
// whose bias, when it has one, is deferred: the caller adds it after reducing the output
// over tp. The options give the full width F; a rank computes F / tp.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ndmesh/core/arch.hpp"
#include "ndmesh/core/dtype.hpp"
#include "ndmesh/nn/linear.hpp"
#include "ndmesh/nn/tp.hpp"
#include "ndmesh/tensor/tensor.hpp"

namespace ndmesh::nn {

/// Sizes and naming of an MLP.
struct MlpOptions {
  std::int64_t channels = 0;  ///< C
  std::int64_t ffn = 0;       ///< F, the hidden width
  std::string name = "mlp";   ///< parameters "<name>.fc.*", "<name>.proj.*"
  TpShape tp;                 ///< the tensor-parallel split (default: none)
  bool bias = true;           ///< fc and proj carry biases
};

/// What an MLP forward keeps for its backward, for `rows` rows: the pre-activation (fc's
/// output, pre_width() wide) and the hidden activation (local_ffn() wide). Under bf16
/// products both are kept in bfloat16 (`pre16`, `hidden16`; `pre` and `hidden` stay empty):
/// every product that reads them rounds them to bf16 anyway, and the activation's derivative
/// in the backward is taken at the stored (rounded) pre-activation, as PyTorch's autocast and
/// llm.c do.
template <typename T>
struct MlpActivations {
  Tensor<T> pre;              ///< [rows, pre width] fc's output (fp32 products)
  Tensor<T> hidden;           ///< [rows, F] the activation's output (fp32 products)
  Tensor<BFloat16> hidden16;  ///< [rows, F] rounded to bf16 (bf16 products)
  Tensor<BFloat16> pre16;     ///< [rows, pre width] rounded to bf16 (bf16 products)
  void resize(std::int64_t rows, std::int64_t pre_width, std::int64_t ffn, bool bf16 = false) {
    if (bf16) {
      pre16.set_device(pre.device());
      hidden16.set_device(pre.device());
      pre16.resize({rows, pre_width});
      hidden16.resize({rows, ffn});
    } else {
      pre.resize({rows, pre_width});
      hidden.resize({rows, ffn});
    }
  }
};

/// A block's MLP.
template <typename T>
class FeedForward {
 public:
  virtual ~FeedForward() = default;
  /// F / tp: the hidden width this rank computes.
  std::int64_t local_ffn() const { return options().ffn / options().tp.size; }
  /// The width of fc's output on this rank: local_ffn(), or twice that for a gated MLP.
  virtual std::int64_t pre_width() const = 0;
  /// Elements per row of the backward's scratch (T, or bfloat16 under bf16 products).
  virtual std::int64_t scratch_width() const = 0;
  /// Whether its activations are kept in bfloat16 (MlpActivations::hidden16): under bf16
  /// products.
  bool hidden_in_bf16() const { return proj().matmul_precision() == MatmulPrecision::kBf16; }
  /// Sizes acts for `rows` rows: acts.resize(rows, pre_width(), hidden_width(),
  /// hidden_in_bf16()); a mixture of experts keeps its routing in T (`pre`) under bf16
  /// products too.
  virtual void resize_activations(MlpActivations<T>& acts, std::int64_t rows) const {
    acts.resize(rows, pre_width(), hidden_width(), hidden_in_bf16());
  }
  /// out[rows, C] = proj(act(fc(inp))) without proj's bias (this rank's partial sum under tp;
  /// see proj().add_bias); fills acts (sized by resize_activations).
  virtual void forward(const T* inp, T* out, MlpActivations<T>& acts, std::int64_t rows) const = 0;
  /// forward from an input stored in bfloat16 (a norm's output under bf16 products).
  virtual void forward(const BFloat16* inp, T* out, MlpActivations<T>& acts, std::int64_t rows) const = 0;
  /// Accumulates dinp and the parameter gradients (not proj's bias: proj().backward_bias).
  /// `scratch` holds at least rows * scratch_width() elements, T or, under bf16 products,
  /// bfloat16; its contents are overwritten. dinp is written, not added to (GradInto::kSet).
  virtual void backward(const T* dout, const T* inp, const MlpActivations<T>& acts, T* dinp, T* scratch,
                        std::int64_t rows) const = 0;
  virtual void backward(const T* dout, const T* inp, const MlpActivations<T>& acts, T* dinp,
                        BFloat16* scratch, std::int64_t rows) const = 0;
  virtual void backward(const T* dout, const BFloat16* inp, const MlpActivations<T>& acts, T* dinp,
                        BFloat16* scratch, std::int64_t rows) const = 0;
  /// The options it was built with.
  virtual const MlpOptions& options() const = 0;
  virtual const Linear<T>& fc() const = 0;
  virtual const Linear<T>& proj() const = 0;
  /// The width of MlpActivations::hidden per row (Block sizes it so): local_ffn(), or what
  /// another kind keeps (a mixture of experts keeps its routing in `pre` and nothing here).
  virtual std::int64_t hidden_width() const { return local_ffn(); }

  // A mixture of experts' extra loss and routing (nn/moe.hpp); a dense MLP has none.
  /// The auxiliary load-balancing loss of the last forward (0: none).
  virtual double aux_loss() const { return 0; }
  /// The weight of the auxiliary loss in the gradient the next backward accumulates (the
  /// micro-batch's share of the step's loss; DecoderT sets it before each backward).
  virtual void set_aux_weight(double) const {}
  /// Routed experts, and the tokens routed to each by the last forward (before capacity
  /// drops; empty for a dense MLP).
  virtual std::int64_t experts() const { return 0; }
  virtual const std::vector<double>& expert_load() const {
    static const std::vector<double> kNone;
    return kNone;
  }
  /// After an optimizer step: the sigmoid router's balancing bias moves by its rate toward an
  /// even load, given the step's tokens per expert `load[experts()]` (summed over the ranks).
  virtual void update_router_bias(const double* /*load*/) const {}
  /// The positions in the sequence of seq tokens of the rows' seq-axis (rows are batch x
  /// positions.size(); under context parallelism a rank's chunks of the sequence): where each
  /// row stands in its micro-batch, which a capacity's drop rule orders (nn/moe.hpp).
  virtual void set_token_positions(const std::vector<std::int64_t>& /*positions*/, std::int64_t /*seq*/) const {}
};

/// The five passes of FeedForward as calls of Derived's two templates, forward_from(inp, out,
/// acts, rows) and backward_from(dout, inp, acts, dinp, scratch, rows) (over the input's and
/// the scratch's element types), so that an MLP writes each pass once. Derived makes the base
/// a friend when they are private.
template <typename Derived, typename T>
class FeedForwardPasses : public FeedForward<T> {
 public:
  // Defined in src/nn/feed_forward_passes.hpp, instantiated with each MLP.
  void forward(const T* inp, T* out, MlpActivations<T>& acts, std::int64_t rows) const final;
  void forward(const BFloat16* inp, T* out, MlpActivations<T>& acts, std::int64_t rows) const final;
  void backward(const T* dout, const T* inp, const MlpActivations<T>& acts, T* dinp, T* scratch,
                std::int64_t rows) const final;
  void backward(const T* dout, const T* inp, const MlpActivations<T>& acts, T* dinp, BFloat16* scratch,
                std::int64_t rows) const final;
  void backward(const T* dout, const BFloat16* inp, const MlpActivations<T>& acts, T* dinp, BFloat16* scratch,
                std::int64_t rows) const final;
};

/// The MLP of kind `kind` over `store`.
template <typename T>
std::unique_ptr<FeedForward<T>> make_feed_forward(MlpKind kind, ParamStore<T>& store, MlpOptions options);

}  // namespace ndmesh::nn
