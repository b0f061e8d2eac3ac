// The CUDA implementations of the layers' operations (docs/gpu.md):
// one .cu file per layer under src/nn/cuda/ (src/tensor/cuda/ for gemm and the element-wise
// helpers), each the device twin of the CPU function named in its comment, with the same
// layouts, the same accumulate-or-overwrite contract and the same arithmetic up to
// summation order. tests/gpu compares every one with its CPU twin on odd shapes.
//
// Declared only; defined where CUDA is built (NDMESH_CUDA). Every pointer is device
// memory; every call is ordered on the process's compute stream (cuda::stream()) and
// returns without waiting for it, except those that return a number to the host. fp32
// throughout, TF32 off: the CUDA fp32 path reproduces the CPU run (bf16 mixed precision
// adds its own entry points).
#pragma once

#include <cstdint>

#include "ndmesh/core/dtype.hpp"

namespace ndmesh::cuda {

// ---------------------------------------------------------------- tensor (src/tensor/cuda)

/// ndmesh::gemm (tensor/blas.hpp) on the device, through cuBLASLt: C[m,n] = alpha op(A)[m,k]
/// op(B)[k,n] + beta C, row-major with row strides lda, ldb, ldc. TF32 off.
void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
          std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc);
/// dst[i] += src[i], i < n.
void add_inplace(float* dst, const float* src, std::int64_t n);
/// dst[i] = value, i < n.
void fill(float* dst, float value, std::int64_t n);
/// sum of x[i]^2, i < n, accumulated in double; waits for the stream.
double square_sum(const float* x, std::int64_t n);
/// sum of x[i], i < n, accumulated in double; waits for the stream.
double sum(const float* x, std::int64_t n);
/// x[i] *= factor, i < n.
void scale(float* x, float factor, std::int64_t n);
/// Rounds to bfloat16 (nearest even, as ndmesh::BFloat16) and back.
void cast(BFloat16* dst, const float* src, std::int64_t n);
void cast(float* dst, const BFloat16* src, std::int64_t n);

// ---------------------------------------------------------------- layers (src/nn/cuda)

/// nn::Linear::add_bias: out[r, j] += bias[j], r < rows, j < cols.
void bias_forward(float* out, const float* bias, std::int64_t rows, std::int64_t cols);
/// nn::Linear::backward_bias: dbias[j] += sum over r of dout[r, j].
void bias_backward(float* dbias, const float* dout, std::int64_t rows, std::int64_t cols);

/// nn::Embedding::forward_at, the token part: out[r, :] = wte[tokens[r] - vocab_start, :] for
/// tokens of this rank's shard [vocab_start, vocab_start + local_vocab), zeros otherwise
/// (r < rows, C channels). Tokens are checked on the host before they are copied here.
void embedding_tokens_forward(float* out, const std::int32_t* tokens, const float* wte, std::int64_t rows,
                              std::int64_t channels, std::int64_t vocab_start, std::int64_t local_vocab);
/// The position part: out[i, :] += wpe[positions[(first_row + i) % seq], :], i < rows.
void embedding_positions_forward(float* out, const float* wpe, const std::int64_t* positions, std::int64_t first_row,
                                 std::int64_t rows, std::int64_t seq, std::int64_t channels);
/// nn::Embedding::backward_at: for every row r < rows of the full d output, dwte[tokens[r]
/// - vocab_start, :] += dout[r, :] (tokens of the shard only) and dwpe[positions[r % seq], :]
/// += dout[r, :]. Deterministic: the same sums in the same order on every run.
void embedding_backward(float* dwte, float* dwpe, const float* dout, const std::int32_t* tokens,
                        const std::int64_t* positions, std::int64_t rows, std::int64_t seq, std::int64_t channels,
                        std::int64_t vocab_start, std::int64_t local_vocab);

/// nn::LayerNorm::forward: out[rows, C] = (x - mean) * rstd * weight + bias, writes mean[rows]
/// and rstd[rows] (rstd = 1 / sqrt(var + eps), var the biased variance).
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, std::int64_t rows, std::int64_t channels, float eps);
/// nn::LayerNorm::backward: accumulates dinp, dweight and dbias from dout, inp and the
/// forward's mean and rstd.
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, std::int64_t rows,
                        std::int64_t channels);

/// nn::Gelu::forward (tanh approximation): out[i] = gelu(inp[i]).
void gelu_forward(float* out, const float* inp, std::int64_t n);
/// nn::Gelu::backward: dinp[i] += gelu'(inp[i]) dout[i].
void gelu_backward(float* dinp, const float* dout, const float* inp, std::int64_t n);

/// nn::Attention::forward (causal, grouped-query): out[b, t, H hd] and lse[b, H, t] from
/// qkv[b, t, (H + 2 KV) hd] ([q heads | k heads | v heads]; query head h reads kv head
/// h / (H / KV)); key j visible to query i iff positions[j] <= positions[i] (positions
/// [seq], nullptr: 0..seq-1). Flash-style: no seq x seq matrix is stored.
void attention_forward(float* out, float* lse, const float* qkv, std::int64_t batch, std::int64_t seq,
                       std::int64_t heads, std::int64_t kv_heads, std::int64_t head_dim,
                       const std::int64_t* positions);
/// nn::Attention::backward: accumulates dqkv from dout, qkv and the forward's out and lse
/// (P recomputed from lse; no seq x seq matrix stored).
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                        std::int64_t batch, std::int64_t seq, std::int64_t heads, std::int64_t kv_heads,
                        std::int64_t head_dim, const std::int64_t* positions);

/// nn::CrossEntropy::forward (one rank holds the whole vocabulary): probs[rows, vocab] =
/// softmax(logits) (may alias logits), losses[rows] = -log probs[target]; returns the mean
/// loss (accumulated in double; waits for the stream).
double cross_entropy_forward(float* probs, float* losses, const float* logits, const std::int32_t* targets,
                             std::int64_t rows, std::int64_t vocab);
/// nn::CrossEntropy::backward: dlogits[rows, vocab] += (probs - onehot(target)) * scale.
void cross_entropy_backward(float* dlogits, const float* probs, const std::int32_t* targets, std::int64_t rows,
                            std::int64_t vocab, float scale);

/// One AdamW step over n elements, as nn::AdamW::update computes each (in double):
///   g = grad * clip; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
///   w -= lr * ((m / c1) / (sqrt(v / c2) + eps) + decay * w)
/// with c1 = 1 - b1^t, c2 = 1 - b2^t given by the caller.
void adamw_update(float* w, const float* grad, float* m, float* v, std::int64_t n, double lr, double beta1,
                  double beta2, double eps, double decay, double clip, double c1, double c2);

}  // namespace ndmesh::cuda
