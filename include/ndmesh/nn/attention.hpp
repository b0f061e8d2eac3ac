// Causal multi-head self-attention with grouped-query support (the core, without the
// projections: those are Linear layers in the Block).
//
// Input: qkv[b, t, :] = [q heads (H*hd) | k heads (KV*hd) | v heads (KV*hd)]. Query head h
// reads key/value head h / (H / KV), so KV = H is plain multi-head attention and KV = 1
// is multi-query attention. For each (b, h):
//   S = Q Kᵀ / sqrt(hd), P = softmax(S masked to j <= i), out_h = P V.
// P is saved [b, h, t, t] for the backward. Tensor parallelism splits heads: a rank builds
// this layer with its local H and KV (KV / tp kv heads, H / tp query heads).
#pragma once

#include <cstdint>

namespace ndmesh::nn {

/// Head counts of an Attention.
struct AttentionOptions {
  std::int64_t heads = 0;     ///< query heads H
  std::int64_t kv_heads = 0;  ///< key/value heads KV; divides H
  std::int64_t head_dim = 0;  ///< hd
};

/// Causal scaled dot-product attention over packed q/k/v rows.
template <typename T>
class Attention {
 public:
  /// Error unless all sizes are positive and kv_heads divides heads.
  explicit Attention(AttentionOptions options);

  /// Width of a qkv row: (H + 2 KV) * hd.
  std::int64_t qkv_width() const { return (options_.heads + 2 * options_.kv_heads) * options_.head_dim; }
  /// Width of an output row: H * hd.
  std::int64_t out_width() const { return options_.heads * options_.head_dim; }

  /// out[batch, seq, H*hd] from qkv[batch, seq, qkv_width]; att[batch, H, seq, seq] gets
  /// the probabilities (zero above the diagonal).
  void forward(const T* qkv, T* out, T* att, std::int64_t batch, std::int64_t seq) const;
  /// Accumulates dqkv from dout, qkv and the saved att.
  void backward(const T* dout, const T* qkv, const T* att, T* dqkv, std::int64_t batch,
                std::int64_t seq) const;

  /// The options it was built with.
  const AttentionOptions& options() const { return options_; }

 private:
  AttentionOptions options_;
};

}  // namespace ndmesh::nn
