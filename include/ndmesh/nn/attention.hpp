// Causal multi-head self-attention with grouped-query support (the core, without the
// projections: those are Linear layers in the Block), computed blockwise in the manner of
// FlashAttention-2 so that no seq x seq matrix is ever held.
//
// Input: qkv[b, t, :] = [q heads (H*hd) | k heads (KV*hd) | v heads (KV*hd)]. Query head h
// reads key/value head h / (H / KV), so KV = H is plain multi-head attention and KV = 1
// is multi-query attention. For each (b, h):
//   S = Q Kᵀ / sqrt(hd), P = softmax(S masked to key_pos <= query_pos), out_h = P V,
//   lse_i = log sum_j exp(S_ij) over the visible keys j (natural log).
// The forward keeps out and lse; the backward recomputes P = exp(S - lse) tile by tile.
// Tensor parallelism splits heads: a rank builds this layer with its local H and KV.
//
// The whole-sequence Attention is written with the ring-ready building blocks below
// (attention_partial_forward, attention_merge, attention_row_dot,
// attention_partial_backward): a context-parallel rank holds queries at some global
// positions, receives key/value blocks at other positions around a ring, runs a partial
// forward per block and merges the partial results; in the backward it runs a partial
// backward per block with the FINAL out and lse, accumulating dQ locally and dK, dV into
// a buffer that travels with the block. The serial model is exactly this with one block
// holding the whole sequence.
#pragma once

#include <cstdint>
#include <functional>

#include "ndmesh/core/dtype.hpp"
#include "ndmesh/tensor/device.hpp"

namespace ndmesh::nn {

/// Head counts of an Attention.
struct AttentionOptions {
  std::int64_t heads = 0;     ///< query heads H
  std::int64_t kv_heads = 0;  ///< key/value heads KV; divides H
  std::int64_t head_dim = 0;  ///< hd
};

/// Edge of the square query x key tiles (rows of each side; the last tile of a side may be
/// shorter). Scratch is a few tiles: no buffer grows with seq x seq.
inline constexpr std::int64_t kAttentionTile = 64;

/// Token rows of one side of attention, addressed inside caller-owned packed rows (the
/// partial functions only read through it). Row i < rows starts at data + i * ld and
/// pos[i] is its global position in the sequence; the causal mask is by position: key j
/// is visible to query i iff kv.pos[j] <= q.pos[i]. Positions need not be sorted or
/// contiguous (zigzag chunks are fine), but tiles are skipped or left unmasked only when
/// the positions of a whole tile allow it, so sorted runs compute least.
///  - Query side: `data` points at q head 0; q head h of row i is data[i*ld + h*hd + d].
///  - Key/value side: rows are packed [k heads (KV*hd) | v heads (KV*hd)]; `data` points at
///    k head 0, so k head g is at +g*hd and v head g at +(KV+g)*hd. This is both the tail
///    of a qkv row (data = qkv + H*hd, ld = qkv width) and the row of a standalone
///    key/value buffer as a ring would send it (ld = 2*KV*hd).
template <typename T>
struct AttentionRows {
  T* data = nullptr;
  std::int64_t ld = 0;                ///< elements between consecutive rows
  const std::int64_t* pos = nullptr;  ///< [rows] global positions
  std::int64_t rows = 0;
};

/// Per-query results of a forward, caller-owned: out row i (H*hd values, head h at +h*hd)
/// at out + i*ld, and lse[h * rows + i] for query row i of head h ([H, rows]).
template <typename T>
struct AttentionOutputs {
  T* out = nullptr;
  std::int64_t ld = 0;
  T* lse = nullptr;
};

/// What a partial backward reads and accumulates into, all caller-owned.
template <typename T>
struct AttentionGrads {
  const T* dout = nullptr;   ///< [q rows, H*hd] at dout + i*ld_dout: d loss / d FINAL out
  std::int64_t ld_dout = 0;  ///< row stride of dout
  const T* lse = nullptr;    ///< [H, q rows] the FINAL lse (all keys merged)
  const T* delta = nullptr;  ///< [H, q rows] D from attention_row_dot(final out, dout)
  T* dq = nullptr;           ///< accumulated, addressed like the query rows (head h at +h*hd)
  std::int64_t ld_dq = 0;    ///< row stride of dq
  T* dkv = nullptr;          ///< accumulated, addressed like the key/value rows ([dk | dv])
  std::int64_t ld_dkv = 0;   ///< row stride of dkv
};

/// How a call tiles queries x keys, for ONE head (a call does this for each of the H heads).
struct AttentionTiles {
  std::int64_t computed = 0;  ///< tile pairs with some visible key: products computed
  std::int64_t masked = 0;    ///< of the computed, those crossing the mask (masked element-wise)
  std::int64_t skipped = 0;   ///< tile pairs the mask empties: neither computed nor masked
  std::int64_t elements = 0;  ///< sum over computed pairs of query rows x key rows (score elements)
};

/// The tiling a partial call uses for queries at q_pos[nq] against keys at k_pos[nk]. For
/// a causal square (both 0..seq-1) of n tiles this is n(n+1)/2 computed of which n masked.
AttentionTiles attention_tiles(const std::int64_t* q_pos, std::int64_t nq, const std::int64_t* k_pos,
                               std::int64_t nk);

/// Partial forward of the queries `q` against the keys/values `kv` only: overwrites res.out
/// and res.lse for the q.rows queries with the softmax over these keys (a query with no
/// visible key here gets out = 0 and lse = -inf). Combine with attention_merge. Reads q and
/// kv, writes res; nothing is kept after the call. Returns the tiling of one head.
template <typename T>
AttentionTiles attention_partial_forward(const AttentionOptions& options, AttentionRows<const T> q,
                                         AttentionRows<const T> kv, AttentionOutputs<T> res);

/// (out, lse) <- the softmax over the union of the key sets of (out, lse) and (part_out,
/// part_lse), both [rows] queries laid out as AttentionOutputs (row strides ld and
/// ld_part). Rows where both lse are -inf stay (0, -inf). The part is only read.
template <typename T>
void attention_merge(const AttentionOptions& options, std::int64_t rows, T* out, std::int64_t ld, T* lse,
                     const T* part_out, std::int64_t ld_part, const T* part_lse);

/// delta[h * rows + i] = sum_d dout[i, h, d] * out[i, h, d] (the D of the backward), for
/// [rows] query rows laid out like AttentionOutputs::out. `out` must be the FINAL output.
template <typename T>
void attention_row_dot(const AttentionOptions& options, std::int64_t rows, const T* out, std::int64_t ld_out,
                       const T* dout, std::int64_t ld_dout, T* delta);

/// Partial backward of the queries `q` against the keys/values `kv`: with P = exp(S - lse)
/// recomputed tile by tile from the FINAL lse, accumulates
///   dQ += dS K into g.dq, and dK += dSᵀ Q, dV += Pᵀ dO into g.dkv,
/// with dS = P ∘ (dO Vᵀ - D) / sqrt(hd). Summed over key/value blocks this is the gradient
/// of the whole attention. Reads q, kv, g.dout, g.lse, g.delta; adds into g.dq and g.dkv
/// (which may alias the packed qkv gradient). Returns the tiling of one head.
template <typename T>
AttentionTiles attention_partial_backward(const AttentionOptions& options, AttentionRows<const T> q,
                                          AttentionRows<const T> kv, const AttentionGrads<T>& g);

/// A batch as the ring of context parallelism holds it (parallel/cp/ring_attention.hpp), in
/// memory of the device it is given to: `batch` sequences, each of `seq` query rows at q + (b
/// seq + t) q_ld (head h at + h hd) and `seq` key/value rows at kv + (b seq + t) kv_ld (packed
/// as AttentionRows), at the global positions q_pos and kv_pos ([seq], the same for every
/// sequence). Outputs and their gradients are [batch, seq, H hd], lse and delta [batch, H, seq].
template <typename T>
struct AttentionBatch {
  const T* q = nullptr;
  std::int64_t q_ld = 0;
  const std::int64_t* q_pos = nullptr;
  const T* kv = nullptr;
  std::int64_t kv_ld = 0;
  const std::int64_t* kv_pos = nullptr;
  std::int64_t batch = 0, seq = 0;
};

// The building blocks over a batch where `device` keeps it, one signature for both devices:
// the functions above per sequence on the CPU, their CUDA twins (nn/cuda_ops.hpp, one launch
// per batch, queued on the compute stream) on CUDA; tests/gpu/test_attention_ring.cpp compares
// the two. On the CPU, `poll` (may be empty) runs after every piece of 4 kAttentionTile query
// rows (a tile multiple: the tiling is that of one call): a ring polls its transfers there,
// since without a progress thread MPI moves large messages only inside MPI calls.

/// attention_partial_forward of every sequence: overwrites out and lse.
template <typename T>
void attention_partial_forward(const AttentionOptions& options, const AttentionBatch<T>& x, T* out, T* lse,
                               Device device, const std::function<void()>& poll = {});
/// attention_merge of every sequence: (out, lse) <- the softmax over both key sets.
template <typename T>
void attention_merge(const AttentionOptions& options, std::int64_t batch, std::int64_t seq, T* out, T* lse,
                     const T* part_out, const T* part_lse, Device device);
/// attention_row_dot of every sequence: delta [batch, H, seq] from the FINAL out and dout.
template <typename T>
void attention_row_dot(const AttentionOptions& options, std::int64_t batch, std::int64_t seq, const T* out,
                       const T* dout, T* delta, Device device);
/// attention_partial_backward of every sequence with the FINAL lse and delta: accumulates dQ
/// into dq (rows dq_ld apart, head h at + h hd) and dK, dV into dkv (rows dkv_ld apart, [dk | dv]).
template <typename T>
void attention_partial_backward(const AttentionOptions& options, const AttentionBatch<T>& x, const T* dout,
                                const T* lse, const T* delta, T* dq, std::int64_t dq_ld, T* dkv,
                                std::int64_t dkv_ld, Device device, const std::function<void()>& poll = {});

/// Which kernel runs a Block's attention core on CUDA.
enum class AttentionKernel : std::uint8_t {
  kFlash,          ///< the fp32 flash kernel (src/nn/cuda/attention.cu)
  kCudnn,          ///< cuDNN's SDPA where it can run, else the flash kernel (one warning line)
  kCudnnRequired,  ///< cuDNN's SDPA, or an Error naming the call and the shape
};

/// The kernel for products at `precision`: cuDNN's SDPA under bf16 (NDMESH_ATTENTION=auto,
/// the default; kCudnnRequired with NDMESH_ATTENTION=cudnn), the flash kernel under fp32, with
/// NDMESH_ATTENTION=flash, and for rows at given positions (`positioned`: the ring of context
/// parallelism, which merges partial results through their lse).
AttentionKernel attention_kernel(MatmulPrecision precision, bool positioned);

/// Causal scaled dot-product attention over packed q/k/v rows of whole sequences
/// (positions 0..seq-1): one partial call with all keys.
template <typename T>
class Attention {
 public:
  /// Error unless all sizes are positive and kv_heads divides heads.
  explicit Attention(AttentionOptions options);

  /// Width of a qkv row: (H + 2 KV) * hd.
  std::int64_t qkv_width() const { return (options_.heads + 2 * options_.kv_heads) * options_.head_dim; }
  /// Width of an output row: H * hd.
  std::int64_t out_width() const { return options_.heads * options_.head_dim; }

  /// out[batch, seq, H*hd] and lse[batch, H, seq] from qkv[batch, seq, qkv_width].
  /// `positions` ([seq], the same for every sequence of the batch) are the global
  /// positions of the rows for the causal mask; nullptr: 0..seq-1. Every pointer is memory
  /// of `device` (CUDA: the flash kernel, cuda::attention_forward).
  void forward(const T* qkv, T* out, T* lse, std::int64_t batch, std::int64_t seq,
               const std::int64_t* positions = nullptr, Device device = Device::kCpu) const;
  /// Accumulates dqkv[batch, seq, qkv_width] from dout, qkv and the forward's out and lse.
  void backward(const T* dout, const T* qkv, const T* out, const T* lse, T* dqkv, std::int64_t batch,
                std::int64_t seq, const std::int64_t* positions = nullptr, Device device = Device::kCpu) const;

  /// The options it was built with.
  const AttentionOptions& options() const { return options_; }

 private:
  AttentionOptions options_;
};

/// The seam through which a Block runs its attention core: the default (nullptr in the
/// Block) is Attention::forward/backward over the local rows only; context parallelism
/// plugs in a ring over the cp group (parallel/cp/ring_attention.hpp). Arguments are
/// those of Attention::forward/backward, with the layer whose options to use.
template <typename T>
class AttentionCore {
 public:
  virtual ~AttentionCore() = default;
  virtual void forward(const Attention<T>& attn, const T* qkv, T* out, T* lse, std::int64_t batch,
                       std::int64_t seq, const std::int64_t* positions) const = 0;
  virtual void backward(const Attention<T>& attn, const T* dout, const T* qkv, const T* out, const T* lse,
                        T* dqkv, std::int64_t batch, std::int64_t seq, const std::int64_t* positions) const = 0;
};

/// The local core: Attention::forward/backward on the rows at hand.
template <typename T>
class LocalAttentionCore final : public AttentionCore<T> {
 public:
  void forward(const Attention<T>& attn, const T* qkv, T* out, T* lse, std::int64_t batch, std::int64_t seq,
               const std::int64_t* positions) const override {
    attn.forward(qkv, out, lse, batch, seq, positions);
  }
  void backward(const Attention<T>& attn, const T* dout, const T* qkv, const T* out, const T* lse, T* dqkv,
                std::int64_t batch, std::int64_t seq, const std::int64_t* positions) const override {
    attn.backward(dout, qkv, out, lse, dqkv, batch, seq, positions);
  }
};

}  // namespace ndmesh::nn
