// LM head: logits = x · Wᵀ with W [vocab, C], either its own parameter (untied) or the
// token embedding table (tied: both uses accumulate into the same gradient view). Under
// tensor parallelism W is split on the vocabulary like the embedding's table (a
// column-parallel linear): a rank computes the logits of its vocab / tp tokens only.
#pragma once

#include <cstdint>
#include <string>

#include "ndmesh/nn/linear.hpp"
#include "ndmesh/nn/tp.hpp"
#include "ndmesh/tensor/params.hpp"

namespace ndmesh::nn {

/// Sizes and tying of an LmHead.
struct LmHeadOptions {
  std::int64_t vocab = 0;
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

  /// Logits this rank computes: vocab / tp.
  std::int64_t local_vocab() const { return options_.vocab / options_.tp.size; }
  /// logits[rows, local_vocab] = inp[rows, C] · Wᵀ.
  void forward(const T* inp, T* logits, std::int64_t rows) const { proj_.forward(inp, logits, rows); }
  /// Accumulates dW; dinp added to, or written with GradInto::kSet (Linear::backward).
  void backward(const T* dlogits, const T* inp, T* dinp, std::int64_t rows, GradInto into = GradInto::kAdd) const {
    proj_.backward(dlogits, inp, dinp, rows, into);
  }

  bool tied() const { return options_.tied_weight >= 0; }
  int weight_id() const { return proj_.weight_id(); }
  /// The options it was built with.
  const LmHeadOptions& options() const { return options_; }

 private:
  LmHeadOptions options_;
  Linear<T> proj_;
};

}  // namespace ndmesh::nn
