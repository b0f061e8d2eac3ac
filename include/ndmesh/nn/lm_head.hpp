// LM head: logits = x · Wᵀ with W [vocab, C], either its own parameter (untied) or the
// token embedding table (tied: both uses accumulate into the same gradient view). Under
// tensor parallelism W is split on the vocabulary like the embedding's table (a
// column-parallel linear): a rank computes the logits of its vocab / tp tokens only.
//
// With its loss (forward_loss, backward_loss) it is the classifier, and the one place that
// chooses how the loss runs:
//  - fused, on CUDA with the whole vocabulary on the rank (and no split backward for these
//    activations): the
//    logits in the element type of the products (bfloat16 under bf16, its rows padded to a
//    multiple of 128 elements, which keeps every row 256-byte aligned for cuBLASLt and the
//    classifier's loads; fp32 otherwise, unpadded), then
//    cuda::classifier_forward_backward in place over them: the loss and the logits' gradient
//    in one kernel, no probabilities buffer; the backward runs the head's two products on
//    that gradient as stored (under bf16 nothing is rounded again);
//  - otherwise (the CPU, a vocabulary split over tp, a split backward): fp32 logits,
//    rounded to bfloat16 values under bf16 (what the fused path stores, so that both agree),
//    CrossEntropy's passes into probabilities, and the backward's gradient over them.
// Either way the per-token losses are summed where they are (LossSum): the loss is read on
// the host only when somebody asks for it.
#pragma once

#include <cstdint>
#include <string>

#include "ndmesh/core/dtype.hpp"
#include "ndmesh/nn/linear.hpp"
#include "ndmesh/nn/tp.hpp"
#include "ndmesh/tensor/device.hpp"
#include "ndmesh/tensor/params.hpp"
#include "ndmesh/tensor/tensor.hpp"

namespace ndmesh::nn {

/// A sum of per-token losses kept where they were computed: a double on the host for the
/// CPU; on CUDA a double in device memory that each add() adds to on the compute stream, so
/// that the step does not wait for the device until take().
template <typename T>
class LossSum {
 public:
  explicit LossSum(Device device = Device::kCpu);
  /// sum += losses[0] + ... + losses[n - 1] (in double; the CPU in order, CUDA in
  /// cuda::sum_into's fixed tree).
  void add(const T* losses, std::int64_t n);
  /// The sum since the last take() (waits for the device on CUDA); starts again from 0.
  double take();
  /// take() into *result where the sum lives (host memory on the CPU; on CUDA device memory,
  /// a copy on the stream: nothing waits).
  void take_into(double* result);
  Device device() const { return device_; }

 private:
  Device device_;
  double host_ = 0;
  bool added_ = false;      // since the last take()
  DeviceBuffer on_device_;  // one double (CUDA)
};

/// What the classifier keeps of one micro-batch's forward for its backward.
template <typename T>
struct ClassifierActivations {
  /// The loss runs fused into the logits (see the top of this file; set by LmHead::resize).
  bool fused = false;
  Tensor<T> logits;           ///< [N, V / tp] unfused: logits, then probabilities, then (backward) their gradient
  Tensor<BFloat16> logits16;  ///< [N, padded V] fused under bf16: the logits, then (forward) their gradient
  Tensor<T> losses;           ///< [N] per-token losses
  /// Bytes allocated here.
  std::int64_t bytes() const {
    return (logits.numel() + losses.numel()) * static_cast<std::int64_t>(sizeof(T)) +
           logits16.numel() * static_cast<std::int64_t>(sizeof(BFloat16));
  }
};

/// Sizes and tying of an LmHead.
struct LmHeadOptions {
  std::int64_t vocab = 0;
  /// Rows of the output layer: vocab padded (a multiple of tp). The logits past vocab are
  /// computed (from zero rows) but never enter the softmax or the loss. 0: vocab.
  std::int64_t padded_vocab = 0;
  std::int64_t channels = 0;
  int tied_weight = -1;          ///< id of the [vocab, C] token table to share, or -1 for an own weight
  std::string name = "lm_head";  ///< own weight "<name>.weight"
  TpShape tp;                    ///< vocabulary split (default: none)
};

/// Projection of hidden states onto the vocabulary (no bias).
template <typename T>
class LmHead {
 public:
  LmHead(ParamStore<T>& store, LmHeadOptions options);

  /// Logits this rank computes: the padded vocabulary / tp.
  std::int64_t local_vocab() const { return rows() / options_.tp.size; }
  /// Of those, the ones of real tokens (the rest are the padding's): at most local_vocab().
  std::int64_t valid_vocab() const;
  /// local_vocab() rounded up to a multiple of 128: the row length of the fused bf16 logits.
  std::int64_t padded_vocab() const { return (local_vocab() + 127) / 128 * 128; }
  /// logits[rows, local_vocab] = inp[rows, C] · Wᵀ.
  void forward(const T* inp, T* logits, std::int64_t rows) const { proj_.forward(inp, logits, rows); }
  /// Accumulates dW; dinp added to, or written with GradInto::kSet (Linear::backward).
  void backward(const T* dlogits, const T* inp, T* dinp, std::int64_t rows, GradInto into = GradInto::kAdd) const {
    proj_.backward(dlogits, inp, dinp, rows, into);
  }

  /// Whether forward_loss can fuse the loss into the logits (see the top of this file):
  /// where the parameters are now (ParamStore::to) decides, and not for a backward whose
  /// weight half may run later (`deferred`: DeferWeightGrads keeps a copy of the logits'
  /// gradient in T).
  bool fuses(bool deferred = false) const;
  /// Sizes `a` for `rows` tokens where the head's parameters live, fused where fuses(deferred).
  void resize(ClassifierActivations<T>& a, std::int64_t rows, bool deferred = false) const;
  /// The logits of inp [rows, C] and the per-token losses against `targets` (where the
  /// kernels read them: ops::stage) into a.losses, added to `sum`; `comm` is the
  /// vocabulary's tp group. Fused, the logits' gradient, (softmax - onehot) * scale, is
  /// written now (the weight of a token in the loss: 1/tokens of the step's mean).
  void forward_loss(const T* inp, const std::int32_t* targets, ClassifierActivations<T>& a, std::int64_t rows,
                    T scale, TpComm<T>& comm, LossSum<T>& sum) const;
  /// The backward of forward_loss: the logits' gradient (unfused: written over the
  /// probabilities now), then dinp (written, GradInto::kSet) and the weight gradient
  /// (accumulated). `inp` is the forward's input.
  void backward_loss(ClassifierActivations<T>& a, const std::int32_t* targets, const T* inp, T* dinp,
                     std::int64_t rows, T scale) const;

  bool tied() const { return options_.tied_weight >= 0; }
  int weight_id() const { return proj_.weight_id(); }
  /// The options it was built with.
  const LmHeadOptions& options() const { return options_; }

 private:
  std::int64_t rows() const { return options_.padded_vocab > 0 ? options_.padded_vocab : options_.vocab; }
  LmHeadOptions options_;
  Linear<T> proj_;
};

}  // namespace ndmesh::nn
