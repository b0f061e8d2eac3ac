// Softmax cross-entropy over the vocabulary, fused: the forward keeps the probabilities,
// the backward is (probs - onehot(target)) * scale. `scale` is the weight of each row in
// the total loss (1/rows for a mean; 1/global_tokens when ranks split the batch).
#pragma once

#include <cstdint>

#include "ndmesh/nn/tp.hpp"

namespace ndmesh::nn {

/// Softmax + negative log-likelihood of the targets.
template <typename T>
struct CrossEntropy {
  /// probs[rows, vocab] = softmax(logits) (may alias logits); losses[rows] = -log p[target].
  /// Returns the mean loss (accumulated in double). Error on a target outside [0, vocab).
  static double forward(const T* logits, const std::int32_t* targets, T* probs, T* losses, std::int64_t rows,
                        std::int64_t vocab);
  /// dlogits[rows, vocab] += (probs - onehot(target)) * scale. dlogits may be probs: then
  /// the gradient is written over the probabilities (no second buffer, no zeroing), the
  /// same values as added into zeros.
  static void backward(const T* probs, const std::int32_t* targets, T* dlogits, std::int64_t rows,
                       std::int64_t vocab, T scale);

  /// Vocabulary-parallel (Megatron): this rank holds logits[rows, local_vocab] of the
  /// tokens [vocab_start, vocab_start + local_vocab). The row maxima are max-reduced and
  /// the sums of exp(z - max) together with the target's logit sum-reduced over `comm`
  /// (two all-reduces of rows and 2 rows values), so no rank ever holds a full row of
  /// logits. probs (may alias logits) gets this rank's part of the softmax, losses[rows]
  /// the full per-row losses (the same on every rank); returns their mean.
  static double forward(const T* logits, const std::int32_t* targets, T* probs, T* losses, std::int64_t rows,
                        std::int64_t local_vocab, std::int64_t vocab_start, std::int64_t vocab,
                        TpComm<T>& comm);
  /// dlogits[rows, local_vocab] += (probs - onehot(target)) * scale, the one-hot only
  /// on the rank that holds the target; in place when dlogits is probs, as above.
  static void backward(const T* probs, const std::int32_t* targets, T* dlogits, std::int64_t rows,
                       std::int64_t local_vocab, std::int64_t vocab_start, T scale);

  /// The vocabulary-parallel pair above where the logits live: on the CPU those; on CUDA
  /// their CUDA twins (nn/cuda_ops.hpp). `targets` is where the kernels read them
  /// (ops::stage: device memory on CUDA). The forward leaves the loss in `losses` (where
  /// they live: nothing waits for the device; LossSum sums them).
  static void forward(Device device, const T* logits, const std::int32_t* targets, T* probs, T* losses,
                        std::int64_t rows, std::int64_t local_vocab, std::int64_t vocab_start, std::int64_t vocab,
                        TpComm<T>& comm);
  static void backward(Device device, const T* probs, const std::int32_t* targets, T* dlogits, std::int64_t rows,
                       std::int64_t local_vocab, std::int64_t vocab_start, T scale);
};

}  // namespace ndmesh::nn
