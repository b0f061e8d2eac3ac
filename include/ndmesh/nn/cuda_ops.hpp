// The CUDA implementations of the layers' operations (docs/gpu.md):
// one .cu file per layer under src/nn/cuda/ (src/tensor/cuda/ for gemm and the element-wise
// helpers), each the device twin of the CPU function named in its comment, with the same
// layouts, the same accumulate-or-overwrite contract and the same arithmetic up to
// summation order. tests/gpu compares every one with its CPU twin on odd shapes.
//
// Declared only; defined where CUDA is built (NDMESH_CUDA). Every pointer is device
// memory; every call is ordered on the process's compute stream (cuda::stream()) and
// returns without waiting for it, except those that return a number to the host. fp32
// throughout, TF32 off: the CUDA fp32 path reproduces the CPU run. bf16 mixed precision
// adds its own entry points (the last section): bfloat16 activations, fp32 parameters,
// statistics, accumulation and loss; each is the same kernel as its fp32 twin with the
// loads widened and the stores rounded (tests/gpu compares the two).
#pragma once

#include <cstdint>
#include <string>

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
/// x[r, j] = value for j in [from, width), r < rows (ops::fill_columns).
void fill_columns(float* x, std::int64_t rows, std::int64_t width, std::int64_t from, float value);
/// sum of x[i]^2, i < n, accumulated in double; waits for the stream.
double square_sum(const float* x, std::int64_t n);
/// The sum over pieces i < count (in piece order, in double) of square_sum(xs[i], ns[i]):
/// the same arithmetic as calling square_sum per piece and adding on the host, with one
/// read back instead of one per piece and three launches whatever the count (the global
/// gradient norm over every tensor).
double square_sum_many(const float* const* xs, const std::int64_t* ns, int count);
/// square_sum_many's sum written into *result (device memory) on the stream: no wait (the
/// global gradient norm that the optimizer's kernel clips with, read on the host after it).
void square_sum_many_into(double* result, const float* const* xs, const std::int64_t* ns, int count);
/// sum of x[i], i < n, accumulated in double; waits for the stream.
double sum(const float* x, std::int64_t n);
/// *acc += sum's sum of x[i], i < n (acc device memory; without `accumulate`, *acc = it):
/// ordered on the stream, no wait.
void sum_into(double* acc, const float* x, std::int64_t n, bool accumulate = true);
/// x[i] = x[i] rounded to bfloat16 (ndmesh::BFloat16's rounding) and kept as float, i < n.
void round_to_bf16(float* x, std::int64_t n);
/// x[i] *= factor, i < n.
void scale(float* x, float factor, std::int64_t n);
/// Rounds to bfloat16 (nearest even, as ndmesh::BFloat16) and back.
void cast(BFloat16* dst, const float* src, std::int64_t n);
void cast(float* dst, const BFloat16* src, std::int64_t n);

// ---------------------------------------------------------------- layers (src/nn/cuda)

/// nn::Linear::add_bias: out[r, j] += bias[j], then += residual[r, j] where residual is
/// given (the residual connection in the same pass), r < rows, j < cols.
void bias_forward(float* out, const float* bias, std::int64_t rows, std::int64_t cols,
                  const float* residual = nullptr);
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
/// += dout[r, :], in increasing r: the CPU's sums in the CPU's order (the same bits on every
/// run). `tokens` [rows] and `positions` [seq] are HOST memory: the rows are bucketed by table
/// row on the host and the buckets uploaded (cuda::upload: no wait).
void embedding_backward(float* dwte, float* dwpe, const float* dout, const std::int32_t* tokens,
                        const std::int64_t* positions, std::int64_t rows, std::int64_t seq, std::int64_t channels,
                        std::int64_t vocab_start, std::int64_t local_vocab);

/// nn::LayerNorm::forward: out[rows, C] = (x - mean) * rstd * weight + bias, writes mean[rows]
/// and rstd[rows] (rstd = 1 / sqrt(var + eps), var the biased variance).
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, std::int64_t rows, std::int64_t channels, float eps);
/// The same from fp32 rows into a bf16 output (computed in float, rounded once on the store):
/// a norm's output kept in bf16 for the bf16 products that read it.
void layernorm_forward(BFloat16* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, std::int64_t rows, std::int64_t channels, float eps);
/// nn::LayerNorm::backward: accumulates dinp, dweight and dbias from dout, inp and the
/// forward's mean and rstd; with `dresidual` (may be dinp) dinp = dresidual + the norm's
/// input gradient instead, and with `dresidual_sums` also dresidual_sums += its column sums
/// (read before dinp is written).
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, std::int64_t rows,
                        std::int64_t channels, const float* dresidual = nullptr, float* dresidual_sums = nullptr);

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

// attention_forward and attention_backward on the tensor cores, through cuDNN's fused flash
// attention (SDPA, src/nn/cuda/attention_cudnn.cpp; built with NDMESH_CUDNN): the same
// layouts and the same causal, grouped-query attention over whole sequences (positions
// 0..seq-1), with q, k, v, out and dout rounded to bfloat16 (cuda::cast), fp32 statistics and
// accumulation, and out, lse and the gradient written back as fp32. lse is the same natural
// log-sum-exp of the scaled scores as the flash kernel's, so either backward reads either
// forward's. One graph per shape, built on first use and cached. They return false when cuDNN
// cannot run here (not built, libcudnn.so.9 not loadable, or no engine for this shape; one
// warning line the first time, naming the shape): the caller then runs the flash kernel.
// With `required` (NDMESH_ATTENTION=cudnn) each of those is an Error naming the call and the
// shape instead. A failing cuDNN call is an Error naming the call and the shape.

/// cuDNN SDPA forward: out[b, t, H hd], lse[b, H, t] from qkv (as attention_forward).
bool attention_forward_cudnn(float* out, float* lse, const float* qkv, std::int64_t batch, std::int64_t seq,
                             std::int64_t heads, std::int64_t kv_heads, std::int64_t head_dim, bool required);
/// cuDNN SDPA backward: dqkv from dout, qkv and the forward's out and lse, as
/// attention_backward computes it, but written (every element; no zeroing first), where
/// attention_backward adds into dqkv.
bool attention_backward_cudnn(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                              std::int64_t batch, std::int64_t seq, std::int64_t heads, std::int64_t kv_heads,
                              std::int64_t head_dim, bool required);
/// The same on bfloat16 as cuDNN reads and writes them (bf16 mixed precision stores the
/// attention's input, output and gradients so: nn::BlockActivations::qkv16, atty16): q, k, v
/// read where they lie in qkv, the output and d qkv written, d out read as stored. The float
/// overloads are these exactly: they round qkv and dout, and widen out and dqkv.
bool attention_forward_cudnn(BFloat16* out, float* lse, const BFloat16* qkv, std::int64_t batch, std::int64_t seq,
                             std::int64_t heads, std::int64_t kv_heads, std::int64_t head_dim, bool required);
bool attention_backward_cudnn(BFloat16* dqkv, const BFloat16* dout, const BFloat16* qkv, const BFloat16* out,
                              const float* lse, std::int64_t batch, std::int64_t seq, std::int64_t heads,
                              std::int64_t kv_heads, std::int64_t head_dim, bool required);
/// Empty when cuDNN attention can run in this process (built, libcudnn.so.9 loaded, a handle
/// made; loads it on the first call), else why not. init() first.
std::string attention_cudnn_unavailable_reason();

// Ring attention (context parallelism, parallel/cp/ring_attention.cpp): the building blocks
// of nn/attention.hpp over a batch. Every sequence b holds `seq` query rows at q + (b seq + t)
// q_ld (head h at + h hd) and `seq` key/value rows at kv + (b seq + t) kv_ld, packed [k heads
// | v heads]; q_pos and kv_pos ([seq], device memory, the same for every sequence) are their
// global positions: key j is visible to query i iff kv_pos[j] <= q_pos[i]. out is [b, seq,
// H hd], lse, delta [b, H, seq].

/// nn::attention_partial_forward: overwrites out and lse with the softmax over these keys
/// only (a query with no visible key gets out = 0, lse = -inf).
void attention_partial_forward(float* out, float* lse, const float* q, std::int64_t q_ld, const std::int64_t* q_pos,
                               const float* kv, std::int64_t kv_ld, const std::int64_t* kv_pos, std::int64_t batch,
                               std::int64_t seq, std::int64_t heads, std::int64_t kv_heads, std::int64_t head_dim);
/// nn::attention_merge: (out, lse) <- the softmax over the union of both key sets.
void attention_merge(float* out, float* lse, const float* part_out, const float* part_lse, std::int64_t batch,
                     std::int64_t seq, std::int64_t heads, std::int64_t head_dim);
/// nn::attention_row_dot: delta[b, h, t] = sum_d dout[b, t, h, d] out[b, t, h, d].
void attention_row_dot(float* delta, const float* out, const float* dout, std::int64_t batch, std::int64_t seq,
                       std::int64_t heads, std::int64_t head_dim);
/// nn::attention_partial_backward with the FINAL lse and delta: accumulates dQ into dq
/// (rows dq_ld apart, head h at + h hd) and dK, dV into dkv (rows dkv_ld apart, [dk | dv]).
void attention_partial_backward(float* dq, std::int64_t dq_ld, float* dkv, std::int64_t dkv_ld, const float* dout,
                                const float* q, std::int64_t q_ld, const std::int64_t* q_pos, const float* kv,
                                std::int64_t kv_ld, const std::int64_t* kv_pos, const float* lse, const float* delta,
                                std::int64_t batch, std::int64_t seq, std::int64_t heads, std::int64_t kv_heads,
                                std::int64_t head_dim);
/// dst[r ld_dst + c] = src[r ld_src + c] (or += with accumulate), r < rows, c < cols: the
/// key/value columns of qkv rows into a ring block and its dK/dV back.
void copy_rows(float* dst, std::int64_t ld_dst, const float* src, std::int64_t ld_src, std::int64_t rows,
               std::int64_t cols, bool accumulate);

/// nn::CrossEntropy::forward (one rank holds the whole vocabulary): probs[rows, vocab] =
/// softmax(logits) (may alias logits), losses[rows] = -log probs[target] (their sum stays on
/// the device: sum_into).
void cross_entropy_forward(float* probs, float* losses, const float* logits, const std::int32_t* targets,
                             std::int64_t rows, std::int64_t vocab);
/// The vocabulary-parallel cross-entropy (nn::CrossEntropy::forward with a tp group): each
/// rank holds the columns [vocab_start, vocab_start + local_vocab) of every row's logits, and
/// the caller all-reduces over the group between the passes:
///   1. row_max[r] = max of the row's local logits;              then all-reduce max;
///   2. sums[r] = sum exp(z - row_max[r]) over the local columns, sums[rows + r] = the target's
///      z - row_max[r] on the rank that holds it, 0 elsewhere;   then all-reduce sum;
///   3. probs = exp(z - row_max) / sums[r] (may alias logits), losses[r] = log sums[r] -
///      sums[rows + r].
void cross_entropy_row_max(float* row_max, const float* logits, std::int64_t rows, std::int64_t local_vocab);
void cross_entropy_row_sums(float* sums, const float* logits, const float* row_max, const std::int32_t* targets,
                            std::int64_t rows, std::int64_t local_vocab, std::int64_t vocab_start);
void cross_entropy_finish(float* probs, float* losses, const float* logits, const float* row_max,
                            const float* sums, std::int64_t rows, std::int64_t local_vocab);
/// nn::CrossEntropy::backward: dlogits[rows, vocab] += (probs - onehot(target)) * scale, the
/// columns being [vocab_start, vocab_start + vocab) of the vocabulary (tensor parallelism);
/// written over probs when dlogits is probs.
void cross_entropy_backward(float* dlogits, const float* probs, const std::int32_t* targets, std::int64_t rows,
                            std::int64_t vocab, float scale, std::int64_t vocab_start = 0);

/// One AdamW step over n elements, as nn::AdamW::update computes each (in double):
///   g = grad * clip; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
///   w -= lr * ((m / c1) / (sqrt(v / c2) + eps) + decay * w)
/// with c1 = 1 - b1^t, c2 = 1 - b2^t given by the caller.
void adamw_update(float* w, const float* grad, float* m, float* v, std::int64_t n, double lr, double beta1,
                  double beta2, double eps, double decay, double clip, double c1, double c2);

// ---------------------------------------------------------------- bf16 mixed precision
// Activations and their gradients are bfloat16 (ndmesh::BFloat16), everything else fp32.
// Each kernel reads bf16 as float, computes exactly what its fp32 overload computes, and
// rounds each output once (to nearest even) when it stores it.

/// residual = x + r (stored, rounded to the element type), then layernorm_forward of the
/// residual as stored into out; mean, rstd fp32. With x_bias [channels] (the deferred bias of
/// the layer that wrote x), residual = (x + x_bias) + r, the two adds in that order. The
/// float overload is the fp32 twin.
void residual_layernorm_forward(float* residual, float* out, float* mean, float* rstd, const float* x,
                                const float* r, const float* weight, const float* bias, std::int64_t rows,
                                std::int64_t channels, float eps, const float* x_bias = nullptr);
/// fp32 rows and residual, the normalised output in bf16 (rounded once).
void residual_layernorm_forward(float* residual, BFloat16* out, float* mean, float* rstd, const float* x,
                                const float* r, const float* weight, const float* bias, std::int64_t rows,
                                std::int64_t channels, float eps, const float* x_bias = nullptr);
void residual_layernorm_forward(BFloat16* residual, BFloat16* out, float* mean, float* rstd, const BFloat16* x,
                                const BFloat16* r, const float* weight, const float* bias, std::int64_t rows,
                                std::int64_t channels, float eps, const float* x_bias = nullptr);
/// layernorm_backward on bf16 rows: dinp accumulated in float and rounded once; the
/// weight and bias gradients fp32.
void layernorm_backward(BFloat16* dinp, float* dweight, float* dbias, const BFloat16* dout, const BFloat16* inp,
                        const float* weight, const float* mean, const float* rstd, std::int64_t rows,
                        std::int64_t channels);

/// gelu_forward / gelu_backward on bf16 elements.
void gelu_forward(BFloat16* out, const BFloat16* inp, std::int64_t n);
/// gelu_forward from fp32 into bf16: computed in float, rounded once (the MLP's hidden
/// activation stored in bf16 under bf16 products).
void gelu_forward(BFloat16* out, const float* inp, std::int64_t n);
void gelu_backward(BFloat16* dinp, const BFloat16* dout, const BFloat16* inp, std::int64_t n);
/// The MLP's fc under bf16 where its GELU_AUX_BIAS epilogue declines (rows x cols,
/// row-major): t = p[r, j] + bias[j] in float (p the fp32 product, bias bf16), pre = t and
/// out = gelu(t), each rounded once: what the epilogue writes (nn::Gelu::forward_bias).
void gelu_bias_forward(BFloat16* out, BFloat16* pre, const float* p, const BFloat16* bias, std::int64_t rows,
                       std::int64_t cols);
/// dinp[i] = gelu'(inp[i]) dout[i] rounded once (fp32 dout, the bf16 pre-activation): the
/// MLP's d pre-activation where the dGELU epilogue into bf16 declines.
void gelu_backward(BFloat16* dinp, const float* dout, const BFloat16* inp, std::int64_t n);

/// bias_forward on bf16 rows (fp32 bias); bias_backward from bf16 rows into an fp32 dbias.
void bias_forward(BFloat16* out, const float* bias, std::int64_t rows, std::int64_t cols,
                  const BFloat16* residual = nullptr);
void bias_backward(float* dbias, const BFloat16* dout, std::int64_t rows, std::int64_t cols);

/// Tokens and positions in one pass: out[r, :] = wte[tokens[r], :] + wpe[positions[r % seq], :]
/// (fp32 tables, the whole vocabulary), rounded once; the float overload is the fp32 twin of
/// embedding_tokens_forward followed by embedding_positions_forward.
void embedding_forward(float* out, const std::int32_t* tokens, const float* wte, const float* wpe,
                       const std::int64_t* positions, std::int64_t rows, std::int64_t seq, std::int64_t channels);
void embedding_forward(BFloat16* out, const std::int32_t* tokens, const float* wte, const float* wpe,
                       const std::int64_t* positions, std::int64_t rows, std::int64_t seq, std::int64_t channels);
/// embedding_backward from a bf16 d output into the fp32 tables (whole vocabulary; tokens and
/// positions in host memory).
void embedding_backward(float* dwte, float* dwpe, const BFloat16* dout, const std::int32_t* tokens,
                        const std::int64_t* positions, std::int64_t rows, std::int64_t seq, std::int64_t channels);

/// The classifier's loss and gradient in one kernel, in place and without a probs buffer:
/// logits [rows, padded_vocab] (the vocabulary padded to a multiple of 128, the padding
/// columns never read) become dlogits = (softmax(z) - onehot(target)) * scale over the
/// first `vocab` columns and 0 in the padding; losses[rows] = log(sum) - (z_target - max),
/// fp32. The loss stays on the device (sum_into; nn::LossSum). The
/// float overload is the fp32 twin.
void classifier_forward_backward(float* logits, float* losses, const std::int32_t* targets, std::int64_t rows,
                                 std::int64_t vocab, std::int64_t padded_vocab, float scale);
void classifier_forward_backward(BFloat16* logits, float* losses, const std::int32_t* targets, std::int64_t rows,
                                 std::int64_t vocab, std::int64_t padded_vocab, float scale);

/// One parameter tensor (or piece of one) of a multi-tensor AdamW step: `count` elements
/// from `param` in the flat parameters, from `grad` in the gradients and from `state` in
/// the moments, with its weight decay.
struct AdamWSegment {
  std::int64_t param = 0, grad = 0, state = 0, count = 0;
  double decay = 0;
};
/// adamw_update over every segment in one launch (the segments and their chunk table are
/// uploaded once and cached for the same list): w, m, v as adamw_update computes them, bit
/// for bit, and, when w_bf16 is not null, w_bf16[i] = the new w[i] rounded to bfloat16 (the
/// copy the bf16 forward reads, written by the step itself). With `square_sum` (device
/// memory: the global gradient norm's square, cuda::square_sum_many_into) the kernel clips
/// with the factor nn::AdamW computes on the host from clip_norm and sqrt(max(0, *square_sum))
/// instead of `clip`, bit for bit, so that nothing waits for the norm before the update.
void adamw_update_multi(float* w, BFloat16* w_bf16, const float* grad, float* m, float* v,
                        const AdamWSegment* segments, int segment_count, double lr, double beta1, double beta2,
                        double eps, double clip, double c1, double c2, const double* square_sum = nullptr,
                        double clip_norm = 0);

/// What a bf16 gemm fuses after the product (cuBLASLt epilogues; row-major C[m, n]):
///   kBias:    C += bias[n] on every row;
///   kGeluAux: aux = product + bias[n] (stored as C), C = gelu(aux) (tanh form): the MLP's
///             fc and GELU in one call, aux kept for the backward;
///   kDGelu:   C = product * gelu'(aux) and dbias[n] = its column sums: the backward of
///             kGeluAux with its bias gradient;
///   kBGradB:  (gemm_bf16_f32, the weight gradient with trans_a: A = dout [k, m]) also
///             dbias[m] = the sums of op(A) over k: the bias gradient from the same read;
///   kDGeluNoBiasGrad: C = product * gelu'(aux), no bias gradient (the layer before GELU
///             sums its bias gradient in its own weight gradient's product).
/// Bias gradients are written, not accumulated. The bias and its gradient have C's element
/// type: cuBLASLt 13.1 (H200) offers no algorithm for an fp32 bias with a bf16 C, nor for a
/// bf16 bias with an fp32 C (every epilogue, every shape tried; docs/gpu.md).
enum class GemmEpilogue : std::uint8_t { kNone, kBias, kGeluAux, kDGelu, kBGradB, kDGeluNoBiasGrad };
/// gemm with bf16 A, B and C (row-major as gemm), fp32 accumulation (cuBLASLt,
/// CUBLAS_COMPUTE_32F) and one rounding of each output. GPU only: cuBLASLt does not run in
/// the emulator.
void gemm_bf16(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
               const BFloat16* a, std::int64_t lda, const BFloat16* b, std::int64_t ldb, float beta, BFloat16* c,
               std::int64_t ldc, GemmEpilogue epilogue = GemmEpilogue::kNone, const BFloat16* bias = nullptr,
               BFloat16* aux = nullptr, BFloat16* dbias = nullptr);
/// gemm_bf16 (alpha 1, beta 0) with an epilogue whose bias and aux are bf16, C's type:
///   kBias:            C = the product + bias[n] in fp32, each output rounded once;
///   kGeluAux:         aux = the product + bias[n], C = gelu(aux), both rounded once from
///                     the fp32 value (the MLP's fc, its pre-activation and hidden in bf16);
///   kDGeluNoBiasGrad: C = the product * gelu'(aux) (aux read), rounded once (the MLP's d
///                     pre-activation in bf16).
/// True when it ran; false, having run nothing, where cuBLASLt has no algorithm for it (one
/// log line names the product the first time) or a GELU aux's rows are not a multiple of 8
/// apart: its caller then runs the product into fp32 and the epilogue's step apart (ops::gemm
/// into bf16, ops::gemm_fused into bf16). A call cuBLASLt fails after its heuristic offered an
/// algorithm (INVALID_VALUE, ...) is an Error naming the product, not a decline.
[[nodiscard]] bool try_gemm_bf16(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                                 const BFloat16* a, std::int64_t lda, const BFloat16* b, std::int64_t ldb,
                                 BFloat16* c, std::int64_t ldc, GemmEpilogue epilogue, const BFloat16* bias,
                                 BFloat16* aux);
/// gemm with bf16 A and B into an fp32 C: the weight gradient accumulated in fp32 (beta 1).
void gemm_bf16_f32(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                   const BFloat16* a, std::int64_t lda, const BFloat16* b, std::int64_t ldb, float beta, float* c,
                   std::int64_t ldc, GemmEpilogue epilogue = GemmEpilogue::kNone, float* dbias = nullptr);
/// gemm_bf16_f32 with any epilogue, its bias, aux and bias gradient fp32 (C's type): true
/// when it ran; false, having run nothing, where cuBLASLt has no algorithm for it (one log
/// line names the product the first time) or a GELU aux's rows are not a multiple of 8
/// apart. Its callers then run the product and the epilogue's steps apart (ops::gemm_fused).
/// A failing call is an Error naming the product, as try_gemm_bf16's.
[[nodiscard]] bool try_gemm_bf16_f32(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                                     float alpha, const BFloat16* a, std::int64_t lda, const BFloat16* b,
                                     std::int64_t ldb, float beta, float* c, std::int64_t ldc, GemmEpilogue epilogue,
                                     const float* bias, float* aux, float* dbias);

// ---------------------------------------------------------------- Llama's layers
// The layers of the Llama family (nn/rmsnorm.hpp, nn/swiglu.hpp, nn/rope.hpp): fp32, and
// bfloat16 where the model keeps those activations in bf16 (float math, one rounding per store).

/// nn::RmsNorm::forward: out[rows, C] = x * rstd * weight, writes rstd[rows]
/// (rstd = 1 / sqrt(mean(x^2) + eps)); the bf16 overload rounds the output once.
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, std::int64_t rows,
                     std::int64_t channels, float eps);
void rmsnorm_forward(BFloat16* out, float* rstd, const float* inp, const float* weight, std::int64_t rows,
                     std::int64_t channels, float eps);
/// residual = (x + x_bias) + r (x_bias may be null), stored, then rmsnorm_forward of it: the
/// residual connection and the next norm in one pass.
void residual_rmsnorm_forward(float* residual, float* out, float* rstd, const float* x, const float* r,
                              const float* weight, std::int64_t rows, std::int64_t channels, float eps,
                              const float* x_bias = nullptr);
void residual_rmsnorm_forward(float* residual, BFloat16* out, float* rstd, const float* x, const float* r,
                              const float* weight, std::int64_t rows, std::int64_t channels, float eps,
                              const float* x_bias = nullptr);
/// nn::RmsNorm::backward: accumulates dinp and dweight (dinp = dresidual + the norm's input
/// gradient where dresidual is given, and dresidual_sums += its column sums).
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                      const float* rstd, std::int64_t rows, std::int64_t channels, const float* dresidual = nullptr,
                      float* dresidual_sums = nullptr);
/// nn::Swiglu::forward: hidden[r, j] = silu(pre[r, j]) * pre[r, F + j] (rows x F, pre rows x 2F).
void swiglu_forward(float* hidden, const float* pre, std::int64_t rows, std::int64_t ffn);
void swiglu_forward(BFloat16* hidden, const BFloat16* pre, std::int64_t rows, std::int64_t ffn);
/// nn::Swiglu::backward: d gate and d up written into dpre (rows x 2F).
void swiglu_backward(float* dpre, const float* dhidden, const float* pre, std::int64_t rows, std::int64_t ffn);
void swiglu_backward(BFloat16* dpre, const BFloat16* dhidden, const BFloat16* pre, std::int64_t rows,
                     std::int64_t ffn);
/// nn::Rope: rotates the first `heads` heads of head_dim of each row of x [rows, width] in
/// place by positions[r % seq] (nullptr: r % seq) times inv_freq [head_dim / 2] (rotate-half
/// pairs); `inverse` rotates back (the backward).
void rope_rotate(float* x, const float* inv_freq, const std::int64_t* positions, std::int64_t rows, std::int64_t seq,
                 std::int64_t width, std::int64_t heads, std::int64_t head_dim, bool inverse);
void rope_rotate(BFloat16* x, const float* inv_freq, const std::int64_t* positions, std::int64_t rows,
                 std::int64_t seq, std::int64_t width, std::int64_t heads, std::int64_t head_dim, bool inverse);

}  // namespace ndmesh::cuda
