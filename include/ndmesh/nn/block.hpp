// Block: one pre-norm transformer decoder block with two residual branches,
//   res1 = x + proj(attention(rope(qkv(ln1(x)))))
//   out  = res1 + mlp(ln2(res1)).
// The norms (LayerNorm or RmsNorm), the MLP (GELU or SwiGLU), the rotary positions (or none)
// and the linears' biases are what the options pick; the block holds them through the
// layers' interfaces (Norm, FeedForward) and never branches on the architecture.
// A pipeline stage is a contiguous range of these. Tensor parallelism (the TpContext)
// splits each branch Megatron-style: qkv column-parallel (this rank's q heads and its
// grouped k/v heads), proj row-parallel, MLP fc column- and proj row-parallel, with f
// before each column-parallel linear and g after each row-parallel one (see tp.hpp). The
// options give the full model's sizes; a rank computes heads / tp and ffn / tp. With
// sequence parallelism the block's input, norms, residuals and output hold the rank's
// rows [first_row, first_row + local_rows) of the batch * seq token rows.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>

#include "ndmesh/core/recompute.hpp"
#include "ndmesh/core/arch.hpp"
#include "ndmesh/nn/attention.hpp"
#include "ndmesh/nn/feed_forward.hpp"
#include "ndmesh/nn/linear.hpp"
#include "ndmesh/nn/moe.hpp"
#include "ndmesh/nn/norm.hpp"
#include "ndmesh/nn/rope.hpp"
#include "ndmesh/nn/tp.hpp"
#include "ndmesh/tensor/tensor.hpp"

namespace ndmesh::nn {

/// Sizes and naming of a Block.
struct BlockOptions {
  std::int64_t channels = 0;  ///< C
  std::int64_t heads = 0;     ///< query heads
  std::int64_t kv_heads = 0;  ///< key/value heads (divides heads)
  std::int64_t head_dim = 0;  ///< 0: channels / heads
  std::int64_t ffn = 0;       ///< MLP width
  std::string name = "block";
  NormKind norm = NormKind::kLayerNorm;
  double norm_eps = 1e-5;
  MlpKind mlp = MlpKind::kGelu;
  bool bias = true;  ///< the linears (qkv, proj, the MLP's) carry biases
  /// Rotary positions applied to the queries and keys before the attention core (head_dim
  /// is filled in); none: the positions come in with the input (a learned table).
  std::optional<RopeOptions> rope;
  /// A mixture of experts instead of the MLP (nn/moe.hpp; its experts are of kind `mlp`).
  std::optional<MoeOptions> moe;
};

/// Activation recomputation (Korthikanti et al. 2022), as this library defines it for its
/// blockwise (flash-style) attention, which never stores s x s scores:
///  - kNone: the forward keeps every tensor of BlockActivations;
///  - kSelective: it keeps everything but the attention core's output (atty) and its
///    log-sum-exp (lse); the backward re-runs the attention core forward from the kept qkv
///    (into a workspace shared by the blocks) before the output projection's backward;
///  - kFull: it keeps only the block output (the next block's input; the stage keeps the
///    first block's input); the backward re-runs the whole block forward from its input
///    (into one shared BlockActivations) right before that block's backward.
/// The recomputed forward is the same code on the same inputs, so the losses and gradients
/// are bit for bit those of kNone. DecoderT (model/decoder.hpp) implements it with
/// recompute_attention() and forward().
using ndmesh::Recompute;  // core/recompute.hpp: the one enum and parser

/// What one block's forward keeps for its backward (one micro-batch). Under recompute
/// some of these stay empty (see Recompute).
template <typename T>
struct BlockActivations {
  Tensor<T> ln1, ln1_mean, ln1_rstd;  ///< [n, C], [n], [n] (n: the rank's local rows)
  Tensor<T> ln1_full, ln2_full;       ///< sequence parallel: ln1, ln2 gathered, [N, C]
  Tensor<T> qkv;                      ///< [N, (H + 2KV) hd]
  Tensor<T> lse;                      ///< [B, H, T] log-sum-exp of each query's attention scores
  Tensor<T> atty;                     ///< [N, H hd] attention output before proj (the backward reads it)
  Tensor<T> res1;                     ///< [N, C] after the attention residual
  Tensor<T> ln2, ln2_mean, ln2_rstd;  ///< [N, C], [N], [N]
  MlpActivations<T> mlp;
  Tensor<T> out;  ///< [N, C] block output
  /// Under bf16 products the two norms' outputs are kept in bfloat16 instead of ln1 / ln2
  /// (which stay empty): only the qkv and fc products read them, and those round them to bf16
  /// anyway. With sequence parallelism the gathered ones too (ln1_full16, ln2_full16 instead of
  /// ln1_full, ln2_full): the all-gathers move bf16, half the bytes.
  Tensor<BFloat16> ln1_16, ln2_16;          ///< [n, C]
  Tensor<BFloat16> ln1_full16, ln2_full16;  ///< sequence parallel: [N, C]
  /// Under bf16 products (an fp32 model) the attention's input and output are kept in bfloat16
  /// instead of qkv and atty (which stay empty): qkv's product writes qkv16 rounded once (its
  /// bias added before the rounding), cuDNN reads it and writes atty16 so, proj's two products
  /// read atty16 as stored (the other attention kernels widen both first).
  Tensor<BFloat16> atty16;  ///< [N, H hd]
  Tensor<BFloat16> qkv16;   ///< [N, (H + 2KV) hd]

  /// Every tensor, in a fixed order (index with the k* constants below).
  std::array<Tensor<T>*, 15> tensors() {
    return {&ln1,  &ln1_mean, &ln1_rstd, &ln1_full, &ln2_full, &qkv,      &lse, &atty,
            &res1, &ln2,      &ln2_mean, &ln2_rstd, &mlp.pre,  &mlp.hidden, &out};
  }
  std::array<const Tensor<T>*, 15> tensors() const {
    return {&ln1,  &ln1_mean, &ln1_rstd, &ln1_full, &ln2_full, &qkv,      &lse, &atty,
            &res1, &ln2,      &ln2_mean, &ln2_rstd, &mlp.pre,  &mlp.hidden, &out};
  }
  static constexpr std::size_t kLn1Full = 3, kLn2Full = 4, kLse = 6, kAtty = 7, kOut = 14;
  /// The tensors stored in bfloat16 come after those of tensors() (indices kHidden16...).
  static constexpr std::size_t kHidden16 = 15, kLn1_16 = 16, kLn2_16 = 17, kAtty16 = 18, kQkv16 = 19,
                               kLn1Full16 = 20, kLn2Full16 = 21, kPre16 = 22;
  /// f(i, tensor) for every tensor, those of tensors() then the bfloat16 ones (Tensor<T>& or
  /// Tensor<BFloat16>&: f is generic).
  template <typename F>
  void each(F&& f) {
    zip(f, *this);
  }
  template <typename F>
  void each(F&& f) const {
    zip(f, *this);
  }
  /// f(i, mine, theirs) for the same tensor of this and `other`.
  template <typename F>
  void each_with(BlockActivations& other, F&& f) {
    zip(f, *this, other);
  }
  /// Bytes of the tensors allocated here.
  std::int64_t bytes() const {
    std::int64_t n = 0;
    each([&](std::size_t, const auto& t) { n += t.numel() * static_cast<std::int64_t>(sizeof(*t.data())); });
    return n;
  }

 private:
  // f(i, the tensor i of each of `acts`...) for every index: the one list of the tensors.
  template <typename F, typename... A>
  static void zip(F& f, A&... acts) {
    const auto lists = std::make_tuple(acts.tensors()...);
    for (std::size_t i = 0; i < std::get<0>(lists).size(); ++i)
      std::apply([&](const auto&... l) { f(i, *l[i]...); }, lists);
    f(kHidden16, acts.mlp.hidden16...);
    f(kLn1_16, acts.ln1_16...);
    f(kLn2_16, acts.ln2_16...);
    f(kAtty16, acts.atty16...);
    f(kQkv16, acts.qkv16...);
    f(kLn1Full16, acts.ln1_full16...);
    f(kLn2Full16, acts.ln2_full16...);
    f(kPre16, acts.mlp.pre16...);
  }
};

/// Gradient work space for Block::backward, shared by all blocks of a model.
template <typename T>
struct BlockScratch {
  Tensor<T> dres1, dln, dqkv, datty, dmlp;
  Tensor<T> dln_full, dout_full;  ///< sequence parallel: [N, C]
  /// With the attention in bfloat16 (BlockActivations::qkv16), its gradients instead of dqkv
  /// and datty: proj's backward writes datty16, cuDNN's reads it and writes dqkv16, and qkv's
  /// backward reads that as stored. Under bf16 products the MLP's backward scratch is dmlp16
  /// instead of dmlp (FeedForward::backward's scratch, scratch_width() per row).
  Tensor<BFloat16> dqkv16, datty16, dmlp16;
};

/// A block's closing add left to whoever reads its output next: x += bias, then += residual
/// (what Block::forward's last pass would do), done by the next norm in the same pass over the
/// rows (LayerNorm::forward_residual: the next block's ln1, the model's final norm), in place.
template <typename T>
struct PendingAdd {
  T* x = nullptr;                ///< the block's output, not yet added to
  const T* bias = nullptr;       ///< its MLP projection's bias (nullptr: none)
  const T* residual = nullptr;   ///< its first residual (acts.res1)
};

/// A pre-norm transformer block.
template <typename T>
class Block {
 public:
  Block(ParamStore<T>& store, BlockOptions options, TpContext<T> tp = {});

  /// Sizes the activations for batch x seq tokens (every tensor; a model that recomputes
  /// or gathers some of them again frees those, see DecoderT).
  void resize(BlockActivations<T>& acts, std::int64_t batch, std::int64_t seq) const;
  /// Sequence parallelism: acts.ln1_full and acts.ln2_full (ln1_full16, ln2_full16 under bf16
  /// products) = ln1 and ln2 all-gathered over tp again (what forward() gathered; a caller that does not keep them calls this before
  /// backward()). Nothing without sequence parallelism.
  void gather_norms(BlockActivations<T>& acts, std::int64_t batch, std::int64_t seq) const;
  /// Selective recompute: acts.atty (or atty16) and acts.lse = the attention core forward of
  /// acts.qkv (or qkv16: what forward() computed from it, bit for bit).
  void recompute_attention(BlockActivations<T>& acts, std::int64_t batch, std::int64_t seq,
                           const AttentionCore<T>* core = nullptr,
                           const std::int64_t* positions = nullptr) const;
  /// Sizes the scratch for batch x seq tokens.
  void resize(BlockScratch<T>& scratch, std::int64_t batch, std::int64_t seq) const;

  /// acts.out = block(inp[batch, seq, C]) (the local rows under sequence parallelism).
  /// `core` runs the attention core (nullptr: the local kernel) on rows at global
  /// `positions` ([seq]; nullptr: 0..seq-1). With `pending` (pending->x is inp) the previous
  /// block's closing add is done first, in its norm's pass (inp becomes its full output, in
  /// place); without `finish`, acts.out is left without its own closing add, which the caller
  /// gives the next reader (closing_add()).
  void forward(const T* inp, BlockActivations<T>& acts, std::int64_t batch, std::int64_t seq,
               const AttentionCore<T>* core = nullptr, const std::int64_t* positions = nullptr,
               const PendingAdd<T>* pending = nullptr, bool finish = true) const;
  /// The closing add forward(..., finish = false) left to do on acts.out.
  PendingAdd<T> closing_add(BlockActivations<T>& acts) const {
    return {acts.out.data(), mlp_->proj().bias(), acts.res1.data()};
  }
  /// Writes dinp and accumulates the parameter gradients given dout = d loss / d acts.out.
  /// `progress`, when given, is called between the sub-layers (the caller drives
  /// communication in flight there, e.g. gradient buckets of later blocks).
  void backward(const T* dout, const T* inp, const BlockActivations<T>& acts, BlockScratch<T>& scratch,
                T* dinp, std::int64_t batch, std::int64_t seq,
                const std::function<void()>* progress = nullptr, const AttentionCore<T>* core = nullptr,
                const std::int64_t* positions = nullptr) const;

  /// The options it was built with.
  const BlockOptions& options() const { return options_; }
  // The sub-layers, in forward order (tests reach into them).
  const Norm<T>& ln1() const { return *ln1_; }
  const Linear<T>& qkv() const { return qkv_; }
  const Attention<T>& attention() const { return attn_; }
  const Linear<T>& proj() const { return proj_; }
  const Norm<T>& ln2() const { return *ln2_; }
  const FeedForward<T>& mlp() const { return *mlp_; }
  const TpContext<T>& tp() const { return tp_; }
  /// Where its parameters and activations live (its store's device); on CUDA the pointers
  /// passed (inputs, positions) are device memory too.
  Device device() const { return ln1_->device(); }

 private:
  // Whether its activations keep the norms' outputs in bfloat16 (BlockActivations::ln1_16,
  // ln2_16, and with sequence parallelism ln1_full16, ln2_full16): under bf16 products.
  bool norms_in_bf16() const;
  // Whether they keep the attention's input, output and gradients in bfloat16
  // (BlockActivations::qkv16, atty16; BlockScratch::dqkv16, datty16): under bf16 products, in
  // an fp32 model (a double one keeps T).
  bool attention_in_bf16() const;

  // The attention core where the block runs: the CUDA kernel, the ring (`core`) or the
  // local kernel; acts.atty and acts.lse from acts.qkv (atty16 from qkv16), and its backward
  // written into scratch.dqkv (dqkv16). In bfloat16 cuDNN reads and writes them as they are;
  // every other kernel runs in fp32 on transient widened copies, its outputs rounded once.
  void attention_forward(BlockActivations<T>& acts, std::int64_t batch, std::int64_t seq,
                         const AttentionCore<T>* core, const std::int64_t* positions) const;
  void attention_backward(const BlockActivations<T>& acts, BlockScratch<T>& scratch, std::int64_t batch,
                          std::int64_t seq, const AttentionCore<T>* core, const std::int64_t* positions) const;
  // Rotary positions on the queries and keys of qkv (rows [n, qkv width]) in place, or the
  // inverse rotation of their gradients; nothing without rotary positions.
  template <typename S>
  void rotate(S* qkv, std::int64_t batch, std::int64_t seq, const std::int64_t* positions, bool inverse) const;
  // The CUDA kernel of the attention core: kFlash for a ring (`core`) or explicit positions,
  // else what attention_kernel picks for the products' precision (cuDNN under bf16).
  AttentionKernel cuda_kernel(const AttentionCore<T>* core, const std::int64_t* positions) const;
  // cuDNN's attention where the settings pick it for the local core (not a ring, nor explicit
  // positions), on elements S (T, or bfloat16 as cuDNN computes): out and lse from qkv, or d qkv
  // written from d out; false where it does not run (the caller runs the other kernels).
  template <typename S>
  bool cudnn_forward(const S* qkv, S* out, T* lse, std::int64_t batch, std::int64_t seq,
                     const AttentionCore<T>* core, const std::int64_t* positions) const;
  template <typename S>
  bool cudnn_backward(S* dqkv, const S* dout, const S* qkv, const S* out, const T* lse, std::int64_t batch,
                      std::int64_t seq, const AttentionCore<T>* core, const std::int64_t* positions) const;
  // The other kernels (the ring, the CUDA flash kernel, the CPU's) in T: out and lse written,
  // then the backward zeroes dqkv and adds into it.
  void fp32_attention_forward(const T* qkv, T* out, T* lse, std::int64_t batch, std::int64_t seq,
                              const AttentionCore<T>* core, const std::int64_t* positions) const;
  void fp32_attention_backward(T* dqkv, const T* dout, const T* qkv, const T* out, const T* lse,
                               std::int64_t batch, std::int64_t seq, const AttentionCore<T>* core,
                               const std::int64_t* positions) const;
  BlockOptions options_;
  TpContext<T> tp_;
  mutable Tensor<T> partial_;  // sequence parallel: a row-parallel output before its reduce-scatter
  std::unique_ptr<Norm<T>> ln1_;
  Attention<T> attn_;
  Linear<T> qkv_;
  Linear<T> proj_;
  std::unique_ptr<Norm<T>> ln2_;
  std::unique_ptr<FeedForward<T>> mlp_;
  std::optional<Rope<T>> rope_;
};

}  // namespace ndmesh::nn
