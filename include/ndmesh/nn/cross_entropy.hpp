// Softmax cross-entropy over the vocabulary, fused: the forward keeps the probabilities,
// the backward is (probs - onehot(target)) * scale. `scale` is the weight of each row in
// the total loss (1/rows for a mean; 1/global_tokens when ranks split the batch).
#pragma once

#include <cstdint>

namespace ndmesh::nn {

/// Softmax + negative log-likelihood of the targets.
template <typename T>
struct CrossEntropy {
  /// probs[rows, vocab] = softmax(logits) (may alias logits); losses[rows] = -log p[target].
  /// Returns the mean loss (accumulated in double). Error on a target outside [0, vocab).
  static double forward(const T* logits, const std::int32_t* targets, T* probs, T* losses, std::int64_t rows,
                        std::int64_t vocab);
  /// dlogits[rows, vocab] += (probs - onehot(target)) * scale.
  static void backward(const T* probs, const std::int32_t* targets, T* dlogits, std::int64_t rows,
                       std::int64_t vocab, T scale);
};

}  // namespace ndmesh::nn
