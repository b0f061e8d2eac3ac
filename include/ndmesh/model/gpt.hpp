// Gpt: a GPT-2 style decoder built from the nn layers:
//   tokens -> Embedding -> Block x L -> LayerNorm -> LmHead -> softmax cross-entropy.
//
// All parameters live in one ParamStore (one flat buffer, named views). Initialisation
// is deterministic and per parameter: each view draws from an Rng seeded with
// (seed, view name), so the values of a parameter do not depend on which other
// parameters exist (a pipeline stage holding blocks 4..7 gets the same weights as the
// full model). GptT<double> exists for finite-difference checks; Gpt is float.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ndmesh/config/config.hpp"
#include "ndmesh/nn/block.hpp"
#include "ndmesh/nn/embedding.hpp"
#include "ndmesh/nn/layernorm.hpp"
#include "ndmesh/nn/lm_head.hpp"
#include "ndmesh/tensor/params.hpp"
#include "ndmesh/tensor/tensor.hpp"

namespace ndmesh::model {

/// Run-time options of a Gpt (the shape comes from the ModelSpec).
struct GptOptions {
  std::uint64_t seed = 1;  ///< initialisation seed
  std::int64_t batch = 1;  ///< sequences per forward
  std::int64_t seq = 0;    ///< tokens per sequence; 0: spec.seq
  double init_std = 0.02;  ///< std of the matrices; residual projections get init_std / sqrt(2 L)
};

/// Every problem with a ModelSpec for this model, one line each (field, value, fix).
std::vector<std::string> gpt_problems(const ModelSpec& spec);

/// A GPT-style decoder with its activations for one batch.
template <typename T>
class GptT {
 public:
  /// ConfigError listing gpt_problems(spec) when the spec is not usable.
  GptT(const ModelSpec& spec, GptOptions options = {});
  GptT(const GptT&) = delete;
  GptT& operator=(const GptT&) = delete;

  /// Runs the model on tokens[batch, seq]; with targets (same shape) returns the mean
  /// cross-entropy, otherwise NaN. Keeps what backward() needs.
  double forward(const std::int32_t* tokens, const std::int32_t* targets);
  /// Accumulates into params().grads() the gradient of the mean loss of the last forward
  /// (which must have had targets). Call params().zero_grad() between steps.
  void backward();

  ParamStore<T>& params() { return store_; }
  const ParamStore<T>& params() const { return store_; }
  const ModelSpec& spec() const { return spec_; }
  std::int64_t batch() const { return batch_; }
  std::int64_t seq() const { return seq_; }
  /// Softmax probabilities [batch, seq, vocab] of the last forward.
  const T* probs() const { return probs_.data(); }
  /// Matrix-product floating point operations of one forward + backward over one batch
  /// (3x the forward; attention counted over the full seq x seq square, as computed).
  double flops_per_step() const;

  const nn::Embedding<T>& embedding() const { return embed_; }
  const std::vector<nn::Block<T>>& blocks() const { return blocks_; }

 private:
  void init(std::uint64_t seed, double init_std);

  ModelSpec spec_;
  std::int64_t batch_, seq_;
  ParamStore<T> store_;
  nn::Embedding<T> embed_;
  std::vector<nn::Block<T>> blocks_;
  nn::LayerNorm<T> lnf_;
  nn::LmHead<T> head_;

  // Activations of the last forward.
  std::vector<std::int32_t> tokens_, targets_;
  Tensor<T> encoded_;                          ///< [N, C] embedding output
  std::vector<nn::BlockActivations<T>> acts_;  ///< one per block
  Tensor<T> lnf_out_, lnf_mean_, lnf_rstd_;    ///< final norm
  Tensor<T> probs_;                            ///< [N, V] logits, then probabilities in place
  Tensor<T> losses_;                           ///< [N]
  // Backward work space.
  nn::BlockScratch<T> scratch_;
  Tensor<T> dlogits_, dlnf_, dres_a_, dres_b_;
  bool have_targets_ = false;
};

/// The float model used for training.
using Gpt = GptT<float>;

}  // namespace ndmesh::model
