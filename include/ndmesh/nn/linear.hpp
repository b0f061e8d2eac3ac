// Linear: out = inp · Wᵀ + b, with W stored [out, in] (one output feature per row).
//
// Storing W as [out, in] makes both tensor-parallel splits plain row ranges or column
// ranges of W: a column-parallel linear owns a range of output features (rows of W,
// entries of b), a row-parallel linear owns a range of input features. The layer itself
// only knows its local `in` and `out`; a strategy builds it with the split sizes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ndmesh/tensor/ops.hpp"
#include "ndmesh/tensor/params.hpp"
#include "ndmesh/tensor/tensor.hpp"

namespace ndmesh::nn {

/// Shape and naming of a Linear.
struct LinearOptions {
  std::int64_t in = 0;   ///< input features
  std::int64_t out = 0;  ///< output features
  bool bias = true;
  std::string name = "linear";  ///< prefix of the parameter names (".weight", ".bias")
  int shared_weight = -1;       ///< id of an existing [out, in] parameter to use as W (tied weights)
  ParamShard weight_shard;      ///< tensor-parallel split of W (default: replicated)
  ParamShard bias_shard;        ///< tensor-parallel split of b (default: replicated)
  /// forward/backward leave the bias out; the caller applies add_bias / backward_bias
  /// after reducing the output over the tp group (the row-parallel linear).
  bool deferred_bias = false;
  /// Its products in T (fp32) whatever its store's matmul_precision(): a layer the
  /// architecture keeps in fp32 under bf16 products (the MoE router, nn/moe.hpp).
  bool fp32_products = false;
};

/// A fully connected layer over rows of features. Its three products (forward, input and
/// weight gradient) take their operands as its store's matmul_precision() says: under bf16
/// both operands rounded to bfloat16, accumulated in fp32 into the fp32 output, input
/// gradient and weight gradient (the bias and everything else stay T).
/// How a backward hands over its input's gradient: added to what the buffer holds, or
/// written over it (the buffer need not be zeroed first; the same values as added to zeros).
enum class GradInto : std::uint8_t { kAdd, kSet };

template <typename T>
class Linear {
 public:
  /// Declares "<name>.weight" [out, in] (unless shared) and "<name>.bias" [out] in `store`.
  Linear(ParamStore<T>& store, LinearOptions options);

  /// out[rows, out] = inp[rows, in] · Wᵀ + b (overwrites out). Under bf16 products on CUDA
  /// the bias is added by the product itself (a cuBLASLt epilogue, ops::gemm_fused).
  void forward(const T* inp, T* out, std::int64_t rows) const;
  /// forward from an input stored in bfloat16 (an activation kept in bf16 under bf16 products:
  /// the operand the products read, nothing rounded again).
  void forward(const BFloat16* inp, T* out, std::int64_t rows) const;
  /// Under bf16 products, the MLP's fc and GELU into bfloat16 (a bias that is not deferred):
  /// pre = inp · Wᵀ + b (b rounded to bf16 like the operands, added in fp32) and out =
  /// gelu(pre) (nn::Gelu's tanh form of the fp32 pre), each rounded once. On CUDA the product
  /// writes both (cuBLASLt's GELU_AUX_BIAS epilogue) where it can; elsewhere the fp32 product
  /// and nn::Gelu::forward_bias compute the same.
  void forward_gelu(const T* inp, BFloat16* pre, BFloat16* out, std::int64_t rows) const;
  void forward_gelu(const BFloat16* inp, BFloat16* pre, BFloat16* out, std::int64_t rows) const;
  /// Under bf16 products, the backward of a layer whose input is gelu(pre), both stored in
  /// bfloat16 (the MLP's proj; inp = gelu(pre)): dpre = (dout · W) ⊙ gelu'(pre) rounded once
  /// into bfloat16 (written), dW += doutᵀ · inp, a bias gradient only if not deferred. On CUDA
  /// outside a DeferWeightGrads scope GELU's derivative runs in the input gradient's product
  /// (the dGELU epilogue) where it can; elsewhere the fp32 product and nn::Gelu::backward
  /// compute the same (under DeferWeightGrads the weight part is recorded, as backward()).
  void backward_gelu(const T* dout, const BFloat16* inp, const BFloat16* pre, BFloat16* dpre,
                     std::int64_t rows) const;
  /// Accumulates: dinp += dout · W (skipped when dinp is null; written over dinp, which then
  /// need not be zeroed, with GradInto::kSet), dW += doutᵀ · inp, db += column sums of dout
  /// (under bf16 products of dout rounded to bf16, what the products read: on CUDA the
  /// weight gradient's product sums them as it reads them).
  /// While a DeferWeightGrads is alive on this thread, only dinp is computed here and the
  /// weight part is recorded in its sink (the split backward of zero-bubble pipelines).
  void backward(const T* dout, const T* inp, T* dinp, std::int64_t rows, GradInto into = GradInto::kAdd) const;
  /// backward with the input stored in bfloat16 (under bf16 products).
  void backward(const T* dout, const BFloat16* inp, T* dinp, std::int64_t rows, GradInto into = GradInto::kAdd) const;
  /// Under bf16 products, into bfloat16: out = inp · Wᵀ (+ b, rounded to bf16 like the
  /// operands, added in fp32 before the rounding; not for a deferred bias), rows `ld_out` >= out
  /// apart (the columns past `out` are not written; a layer with a bias writes rows out apart),
  /// each output rounded once (ops::gemm into bfloat16).
  void forward(const T* inp, BFloat16* out, std::int64_t ld_out, std::int64_t rows) const;
  /// forward into bfloat16, rows out apart, from an input in T or stored in bfloat16.
  void forward(const T* inp, BFloat16* out, std::int64_t rows) const { forward(inp, out, options_.out, rows); }
  void forward(const BFloat16* inp, BFloat16* out, std::int64_t rows) const;
  /// backward from an output gradient stored in bfloat16, rows `ld_dout` apart (under bf16
  /// products; a layer with a bias takes rows out apart): the same two products, on dout as
  /// stored (nothing rounded again), and the bias gradient from its sums. In a DeferWeightGrads
  /// scope the weight part is recorded with dout widened (exact).
  void backward(const BFloat16* dout, std::int64_t ld_dout, const T* inp, T* dinp, std::int64_t rows,
                GradInto into = GradInto::kAdd) const;
  /// That backward with the input stored in bfloat16 too (dout's rows out apart).
  void backward(const BFloat16* dout, const BFloat16* inp, T* dinp, std::int64_t rows,
                GradInto into = GradInto::kAdd) const;
  /// backward with the input's gradient written into bfloat16 (under bf16 products): dinp =
  /// dout · W rounded once (written, as GradInto::kSet), dW += doutᵀ · inp, db as backward().
  void backward(const T* dout, const BFloat16* inp, BFloat16* dinp, std::int64_t rows) const;
  /// The weight part alone: dW += doutᵀ · inp, db += column sums of dout.
  void backward_weight(const T* dout, const T* inp, std::int64_t rows) const;
  void backward_weight(const T* dout, const BFloat16* inp, std::int64_t rows) const;

  /// out[rows, out] += b (the deferred bias), then += residual[rows, out] where given (the
  /// residual connection in the same pass: the adds in that order).
  void add_bias(T* out, std::int64_t rows, const T* residual = nullptr) const;
  /// The bias's values (where the layer lives), or nullptr without one.
  const T* bias() const { return bias_ < 0 ? nullptr : store_->param(bias_); }
  /// db += column sums of dout[rows, out] (the deferred bias).
  void backward_bias(const T* dout, std::int64_t rows) const;
  /// The bias's gradient (where the layer lives), or nullptr without one: where a pass that
  /// reads dout anyway adds its column sums (LayerNorm::backward's dresidual_sums).
  T* bias_grad() const { return bias_ < 0 ? nullptr : store_->grad(bias_); }

  /// The options it was built with.
  const LinearOptions& options() const { return options_; }
  /// Where its parameters live (its store's device).
  Device device() const { return store_->device(); }
  /// How its products take their operands: its store's matmul_precision(), or fp32 with
  /// LinearOptions::fp32_products.
  MatmulPrecision matmul_precision() const {
    return options_.fp32_products ? MatmulPrecision::kFp32 : store_->matmul_precision();
  }
  /// The [out, in] weight (shared when tied).
  int weight_id() const { return weight_; }
  /// -1 without bias.
  int bias_id() const { return bias_; }
  /// One past the last flat-buffer element of its weight and bias gradients (what a
  /// deferred weight gradient still has to write below).
  std::int64_t grads_end() const;
  /// The first flat-buffer element of its weight and bias gradients.
  std::int64_t grads_begin() const;

 private:
  // dW += doutᵀ · inp, db += column sums of dout, with dout rounded as the products take it
  // (its rows `ld_dout` apart; 0: out apart).
  void weight_product(const ops::SharedOperand<T>& dout, const ops::SharedOperand<T>& inp, std::int64_t rows,
                      std::int64_t ld_dout = 0) const;
  // The bodies of the overloads above: the input `inp` (T) or `inp16` (bfloat16), one null.
  void forward(const ops::SharedOperand<T>& x, T* out, std::int64_t rows) const;
  void backward(const T* dout, const T* inp, const BFloat16* inp16, T* dinp, std::int64_t rows, GradInto into) const;
  void forward_gelu(const ops::SharedOperand<T>& x, BFloat16* pre, BFloat16* out, std::int64_t rows) const;
  // The layer's input as its products take it: inp16 as stored, else inp rounded as its precision says.
  ops::SharedOperand<T> input(const T* inp, const BFloat16* inp16, std::int64_t rows) const;
  // db += column sums of dout as the products take it (rounded under bf16), rows out apart.
  void backward_bias(const ops::SharedOperand<T>& dout, std::int64_t rows) const;
  // The bodies of the bfloat16 overloads: forward into bf16, backward from a bf16 dout.
  void forward(const ops::SharedOperand<T>& x, BFloat16* out, std::int64_t ld_out, std::int64_t rows) const;
  void backward(const BFloat16* dout, std::int64_t ld_dout, const T* inp, const BFloat16* inp16, T* dinp,
                std::int64_t rows, GradInto into) const;
  // b as its products add it under bf16: the store's bfloat16 copy where current, else b rounded.
  ops::SharedOperand<T> bias_operand() const;
  // W as the B operand of its products: the store's bfloat16 copy where one is current
  // (ParamStore::param_bf16), else W itself, rounded for this product under bf16.
  ops::SharedOperand<T> weight_operand() const;
  // An operand of its products: x's `extent` elements as its precision takes them.
  ops::SharedOperand<T> operand(const T* x, std::int64_t extent) const {
    return ops::SharedOperand<T>(device(), matmul_precision(), x, extent);
  }
  // Whether its products can take a cuBLASLt epilogue (ops::gemm_fused): bf16 on a GPU. The
  // fused entry points check it before rounding an operand that only the fused call reads.
  bool may_fuse() const { return device() != Device::kCpu && matmul_precision() == MatmulPrecision::kBf16; }
  ParamStore<T>* store_;
  LinearOptions options_;
  int weight_ = -1;
  int bias_ = -1;
};

/// Weight gradients set aside by Linear::backward for a later pass: the "W" half of the
/// zero-bubble schedules' split backward. Each entry holds a copy of the layer's output
/// gradient where the layer lives (device memory on CUDA, copied on the compute stream) and
/// a pointer to its input, which must stay alive (it lives in the micro-batch's
/// activations) until run().
template <typename T>
class DeferredWeightGrads {
 public:
  /// `inp` or `inp16` (the input stored in bfloat16) is the layer's input; one of them null.
  void record(const Linear<T>& layer, const T* dout, const T* inp, const BFloat16* inp16, std::int64_t rows);
  /// record() from an output gradient stored in bfloat16 (rows `out` apart), kept widened (exact).
  void record(const Linear<T>& layer, const BFloat16* dout, const T* inp, const BFloat16* inp16, std::int64_t rows);
  /// Adds every recorded weight gradient, in record order, and forgets them. After each
  /// one, `final_from` (when given) is called with the flat offset from which every
  /// gradient is final as far as the remaining records go (the largest grads_end() of
  /// those still to run; 0 after the last): data parallelism starts reducing there. Before
  /// each one, `writes_at` (when given) is called with its grads_begin(): ZeRO's per-unit
  /// work space backs the unit there (parallel::GradReducer::writes_at).
  void run(const std::function<void(std::int64_t)>& final_from = {},
           const std::function<void(std::int64_t)>& writes_at = {});
  bool empty() const { return entries_.empty(); }

 private:
  struct Entry {
    const Linear<T>* layer;
    Tensor<T> dout;  // [rows, out] on the layer's device
    const T* inp;
    const BFloat16* inp16;
    std::int64_t rows;
  };
  std::vector<Entry> entries_;
};

/// While alive, every Linear::backward on this thread computes only its input gradient
/// and records the weight gradient in `sink` (scopes nest). Made with nullptr, the opposite:
/// weight gradients at once, even inside a deferring scope, for layers whose inputs do not
/// outlive their backward (a mixture of experts gathers each expert's rows into buffers of
/// its own backward, which a deferred weight gradient would read after they are freed).
template <typename T>
class DeferWeightGrads {
 public:
  explicit DeferWeightGrads(DeferredWeightGrads<T>& sink);
  explicit DeferWeightGrads(std::nullptr_t);
  ~DeferWeightGrads();
  DeferWeightGrads(const DeferWeightGrads&) = delete;
  DeferWeightGrads& operator=(const DeferWeightGrads&) = delete;

 private:
  DeferredWeightGrads<T>* previous_;
};

}  // namespace ndmesh::nn
