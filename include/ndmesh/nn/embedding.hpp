// Embedding: token embedding plus learned absolute positions,
//   out[b, t, :] = wte[token[b, t], :] + wpe[position_offset + t, :],
// or the token embedding alone where positions enter elsewhere (rotary, max_seq 0).
// A context-parallel rank holds tokens at arbitrary global positions (zigzag chunks):
// forward_at/backward_at take the position of each local row; position_offset is the
// contiguous special case.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ndmesh/nn/tp.hpp"
#include "ndmesh/tensor/tensor.hpp"
#include "ndmesh/tensor/params.hpp"

namespace ndmesh::nn {

/// Sizes and naming of an Embedding.
struct EmbeddingOptions {
  std::int64_t vocab = 0;
  /// Rows of the token table: vocab padded (a multiple of tp; its rows past vocab are zero,
  /// no token looks them up). 0: vocab.
  std::int64_t padded_vocab = 0;
  std::int64_t channels = 0;
  std::int64_t max_seq = 0;    ///< rows of the position table; 0: none (rotary positions)
  std::string name = "embed";  ///< parameters "<name>.tokens" [vocab, C], "<name>.positions" [max_seq, C]
};

/// Token and position embedding. Under tensor parallelism the token table is split on
/// the (padded) vocabulary (rank r holds rows [r V/tp, (r+1) V/tp)): each rank embeds the tokens
/// it holds (zeros for the others) and the rows are summed over tp (g: an all-reduce, or
/// a reduce-scatter to the rank's rows under sequence parallelism). The position table is
/// replicated; its gradient comes from the full d output on every rank.
template <typename T>
class Embedding {
 public:
  /// Declares "<name>.tokens" and "<name>.positions" in `store`.
  Embedding(ParamStore<T>& store, EmbeddingOptions options, TpContext<T> tp = {});

  /// out[batch, seq, C] (the rank's local rows under sequence parallelism). Error when a
  /// token is outside [0, vocab) or the positions run past max_seq.
  void forward(const std::int32_t* tokens, T* out, std::int64_t batch, std::int64_t seq,
               std::int64_t position_offset = 0) const;
  /// Accumulates the token and position table gradients from dout[batch, seq, C] (local
  /// rows under sequence parallelism).
  void backward(const T* dout, const std::int32_t* tokens, std::int64_t batch, std::int64_t seq,
                std::int64_t position_offset = 0) const;

  /// Same with the global position of each of the seq rows (the same for every sequence of
  /// the batch): out[b, t, :] = wte[token[b, t], :] + wpe[positions[t], :]. On CUDA (the
  /// store's device) tokens and positions are device memory too, and the caller has checked
  /// them on the host.
  void forward_at(const std::int32_t* tokens, T* out, std::int64_t batch, std::int64_t seq,
                  const std::int64_t* positions) const;
  /// On CUDA the backward groups the rows by table row on the host (cuda::embedding_backward):
  /// `host_tokens` [batch seq] and `host_positions` [seq] are the same values in host memory
  /// (the caller has them); without them they are copied back from the device first (a wait).
  void backward_at(const T* dout, const std::int32_t* tokens, std::int64_t batch, std::int64_t seq,
                   const std::int64_t* positions, const std::int32_t* host_tokens = nullptr,
                   const std::int64_t* host_positions = nullptr) const;

  /// The options it was built with.
  const EmbeddingOptions& options() const { return options_; }
  /// The [vocab, C] token table (what a tied LM head shares).
  int token_weight_id() const { return tokens_; }
  /// The [max_seq, C] position table, or -1 without one.
  int position_weight_id() const { return positions_; }
  /// First token of this rank's vocabulary shard and its size.
  std::int64_t vocab_start() const { return vocab_start_; }
  std::int64_t local_vocab() const { return local_vocab_; }

 private:
  ParamStore<T>* store_;
  EmbeddingOptions options_;
  TpContext<T> tp_;
  std::int64_t vocab_start_ = 0, local_vocab_ = 0;
  // Sequence parallel: the [N, C] partial or gathered rows, where the store's buffers live.
  T* work(std::int64_t elements) const;
  mutable Tensor<T> work_;
  int tokens_ = -1;
  int positions_ = -1;
};

}  // namespace ndmesh::nn
