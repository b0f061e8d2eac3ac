#include "ndmesh/nn/block.hpp"

#include <algorithm>
#include <type_traits>

#include "ndmesh/core/error.hpp"
#include "ndmesh/tensor/ops.hpp"
#include "tensor/cuda_twin.hpp"

namespace ndmesh::nn {

namespace {
BlockOptions resolved(BlockOptions o) {
  NDMESH_CHECK(o.heads > 0 && o.channels > 0, "nn", "block '{}' has heads={} channels={}", o.name, o.heads,
               o.channels);
  if (o.head_dim == 0) {
    NDMESH_CHECK(o.channels % o.heads == 0, "nn", "block '{}': heads={} does not divide channels={}", o.name,
                 o.heads, o.channels);
    o.head_dim = o.channels / o.heads;
  }
  if (o.rope) o.rope->head_dim = o.head_dim;
  return o;
}

// Heads are split over tp whole: a query head and the key/value head it reads stay on
// one rank (no replication of key/value heads).
template <typename T>
TpContext<T> checked(const BlockOptions& o, TpContext<T> tp) {
  const int t = tp.size();
  NDMESH_CHECK(o.heads % t == 0 && o.kv_heads % t == 0 && o.ffn % t == 0, "nn",
               "block '{}': tp={} must divide heads={}, kv_heads={} and ffn={}", o.name, t, o.heads,
               o.kv_heads, o.ffn);
  return tp;
}
}  // namespace

template <typename T>
Block<T>::Block(ParamStore<T>& store, BlockOptions options, TpContext<T> tp)
    : options_(resolved(std::move(options))),
      tp_(checked(options_, std::move(tp))),
      ln1_(make_norm<T>(options_.norm, store,
                        {.channels = options_.channels,
                         .eps = options_.norm_eps,
                         .name = options_.name + ".ln1",
                         .shard = tp_.shape().replicated()})),
      attn_({.heads = options_.heads / tp_.size(),
             .kv_heads = options_.kv_heads / tp_.size(),
             .head_dim = options_.head_dim}),
      // q|k|v rows of the fused weight: this rank's q heads, then its k and v heads.
      qkv_(store, {.in = options_.channels,
                   .out = attn_.qkv_width(),
                   .bias = options_.bias,
                   .name = options_.name + ".attn.qkv",
                   .weight_shard = tp_.shape().rows(
                       {(options_.heads + 2 * options_.kv_heads) * options_.head_dim, options_.channels},
                       {{0, options_.heads * options_.head_dim},
                        {options_.heads * options_.head_dim, options_.kv_heads * options_.head_dim},
                        {(options_.heads + options_.kv_heads) * options_.head_dim,
                         options_.kv_heads * options_.head_dim}}),
                   .bias_shard = tp_.shape().rows(
                       {(options_.heads + 2 * options_.kv_heads) * options_.head_dim},
                       {{0, options_.heads * options_.head_dim},
                        {options_.heads * options_.head_dim, options_.kv_heads * options_.head_dim},
                        {(options_.heads + options_.kv_heads) * options_.head_dim,
                         options_.kv_heads * options_.head_dim}})}),
      proj_(store,
            {.in = attn_.out_width(),
             .out = options_.channels,
             .bias = options_.bias,
             .name = options_.name + ".attn.proj",
             .weight_shard = tp_.shape().columns({options_.channels, options_.heads * options_.head_dim}),
             .bias_shard = tp_.shape().replicated(),
             .deferred_bias = true}),
      ln2_(make_norm<T>(options_.norm, store,
                        {.channels = options_.channels,
                         .eps = options_.norm_eps,
                         .name = options_.name + ".ln2",
                         .shard = tp_.shape().replicated()})),
      mlp_([&]() -> std::unique_ptr<FeedForward<T>> {
        MlpOptions o{.channels = options_.channels,
                     .ffn = options_.ffn,
                     .name = options_.name + ".mlp",
                     .tp = tp_.shape(),
                     .bias = options_.bias};
        if (options_.moe) {
          MoeOptions m = *options_.moe;
          m.kind = options_.mlp;
          return std::make_unique<Moe<T>>(store, std::move(o), m);
        }
        return make_feed_forward<T>(options_.mlp, store, std::move(o));
      }()) {
  if (options_.rope) rope_.emplace(*options_.rope);
}

template <typename T>
bool Block<T>::norms_in_bf16() const {
  return mlp_->hidden_in_bf16();
}

template <typename T>
bool Block<T>::attention_in_bf16() const {
  return std::is_same_v<T, float> && mlp_->hidden_in_bf16();  // the fp32 model's (a double one keeps T)
}

template <typename T>
template <typename S>
void Block<T>::rotate(S* qkv, std::int64_t batch, std::int64_t seq, const std::int64_t* positions,
                      bool inverse) const {
  if (!rope_) return;
  const AttentionOptions& o = attn_.options();
  // This rank's query heads, then its key heads (the value heads after them stay).
  if (inverse)
    rope_->backward(qkv, batch * seq, seq, attn_.qkv_width(), o.heads + o.kv_heads, positions, device());
  else
    rope_->forward(qkv, batch * seq, seq, attn_.qkv_width(), o.heads + o.kv_heads, positions, device());
}

template <typename T>
void Block<T>::resize(BlockActivations<T>& a, std::int64_t batch, std::int64_t seq) const {
  const std::int64_t n = batch * seq, c = options_.channels, nl = tp_.local_rows(n);
  a.each([&](std::size_t, auto& t) { t.set_device(device()); });
  if (norms_in_bf16()) {  // the norms' outputs: in bf16, or T
    a.ln1_16.resize({nl, c});
    a.ln2_16.resize({nl, c});
  } else {
    a.ln1.resize({nl, c});
    a.ln2.resize({nl, c});
  }
  if (ln1_->keeps_mean()) a.ln1_mean.resize({nl});
  a.ln1_rstd.resize({nl});
  a.lse.resize({batch, attn_.options().heads, seq});
  if (attention_in_bf16()) {
    a.qkv16.resize({n, attn_.qkv_width()});
    a.atty16.resize({n, attn_.out_width()});
  } else {
    a.qkv.resize({n, attn_.qkv_width()});
    a.atty.resize({n, attn_.out_width()});
  }
  a.res1.resize({nl, c});
  if (ln2_->keeps_mean()) a.ln2_mean.resize({nl});
  a.ln2_rstd.resize({nl});
  mlp_->resize_activations(a.mlp, n);
  a.out.resize({nl, c});
  if (tp_.sequence_parallel && norms_in_bf16()) {
    a.ln1_full16.resize({n, c});
    a.ln2_full16.resize({n, c});
  } else if (tp_.sequence_parallel) {
    a.ln1_full.resize({n, c});
    a.ln2_full.resize({n, c});
  }
}

template <typename T>
void Block<T>::gather_norms(BlockActivations<T>& a, std::int64_t batch, std::int64_t seq) const {
  if (!tp_.sequence_parallel) return;
  const std::int64_t n = batch * seq, c = options_.channels;
  if (norms_in_bf16()) {
    tp_.f_forward(a.ln1_16.data(), a.ln1_full16.data(), n, c);
    tp_.f_forward(a.ln2_16.data(), a.ln2_full16.data(), n, c);
    return;
  }
  tp_.f_forward(a.ln1.data(), a.ln1_full.data(), n, c);
  tp_.f_forward(a.ln2.data(), a.ln2_full.data(), n, c);
}

template <typename T>
void Block<T>::recompute_attention(BlockActivations<T>& a, std::int64_t batch, std::int64_t seq,
                                   const AttentionCore<T>* core, const std::int64_t* positions) const {
  // The same call as in forward(): the same kernel on the same qkv.
  attention_forward(a, batch, seq, core, positions);
}

template <typename T>
void Block<T>::attention_forward(BlockActivations<T>& a, std::int64_t batch, std::int64_t seq,
                                 const AttentionCore<T>* core, const std::int64_t* positions) const {
  if (!attention_in_bf16()) {
    if (!cudnn_forward(a.qkv.data(), a.atty.data(), a.lse.data(), batch, seq, core, positions))
      fp32_attention_forward(a.qkv.data(), a.atty.data(), a.lse.data(), batch, seq, core, positions);
    return;
  }
  if constexpr (std::is_same_v<T, float>) {
    if (cudnn_forward(a.qkv16.data(), a.atty16.data(), a.lse.data(), batch, seq, core, positions)) return;
    // qkv widened (exact) into a transient (the caching allocator's on a GPU), the fp32 rows
    // into another, rounded once.
    const Device dev = device();
    const std::int64_t nq = a.qkv16.numel(), no = a.atty16.numel();
    ops::Scratch<T> qkv(nq, dev), out(no, dev);
    ops::cast(qkv.data(), a.qkv16.data(), nq, dev);
    fp32_attention_forward(qkv.data(), out.data(), a.lse.data(), batch, seq, core, positions);
    ops::cast(a.atty16.data(), out.data(), no, dev);
  }
}

template <typename T>
void Block<T>::attention_backward(const BlockActivations<T>& a, BlockScratch<T>& s, std::int64_t batch,
                                  std::int64_t seq, const AttentionCore<T>* core,
                                  const std::int64_t* positions) const {
  if (!attention_in_bf16()) {
    if (!cudnn_backward(s.dqkv.data(), s.datty.data(), a.qkv.data(), a.atty.data(), a.lse.data(), batch, seq, core,
                        positions))
      fp32_attention_backward(s.dqkv.data(), s.datty.data(), a.qkv.data(), a.atty.data(), a.lse.data(), batch, seq,
                              core, positions);
    return;
  }
  if constexpr (std::is_same_v<T, float>) {
    if (cudnn_backward(s.dqkv16.data(), s.datty16.data(), a.qkv16.data(), a.atty16.data(), a.lse.data(), batch, seq,
                       core, positions))
      return;
    // The fp32 kernels read the stored bf16 tensors widened (exact): what cuDNN's backward
    // reads; their d qkv is rounded once.
    const Device dev = device();
    const std::int64_t nq = a.qkv16.numel(), no = a.atty16.numel();
    ops::Scratch<T> qkv(nq, dev), out(no, dev), dout(no, dev), dqkv(nq, dev);
    ops::cast(qkv.data(), a.qkv16.data(), nq, dev);
    ops::cast(out.data(), a.atty16.data(), no, dev);
    ops::cast(dout.data(), s.datty16.data(), no, dev);
    fp32_attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), a.lse.data(), batch, seq, core,
                            positions);
    ops::cast(s.dqkv16.data(), dqkv.data(), nq, dev);
  }
}

template <typename T>
AttentionKernel Block<T>::cuda_kernel(const AttentionCore<T>* core, const std::int64_t* positions) const {
  // A ring runs its own kernels; cuDNN's causal mask is by index (0..seq-1) only.
  return core ? AttentionKernel::kFlash : attention_kernel(qkv_.matmul_precision(), positions != nullptr);
}

template <typename T>
template <typename S>
bool Block<T>::cudnn_forward([[maybe_unused]] const S* qkv, [[maybe_unused]] S* out, [[maybe_unused]] T* lse,
                             [[maybe_unused]] std::int64_t batch, [[maybe_unused]] std::int64_t seq,
                             [[maybe_unused]] const AttentionCore<T>* core,
                             [[maybe_unused]] const std::int64_t* positions) const {
  NDMESH_CUDA_TWIN(device(), {
    const AttentionKernel k = cuda_kernel(core, positions);
    const AttentionOptions& o = attn_.options();
    return k != AttentionKernel::kFlash && cuda::attention_forward_cudnn(out, lse, qkv, batch, seq, o.heads, o.kv_heads,
                                                                         o.head_dim, k == AttentionKernel::kCudnnRequired);
  })
  return false;
}

template <typename T>
template <typename S>
bool Block<T>::cudnn_backward([[maybe_unused]] S* dqkv, [[maybe_unused]] const S* dout, [[maybe_unused]] const S* qkv,
                              [[maybe_unused]] const S* out, [[maybe_unused]] const T* lse,
                              [[maybe_unused]] std::int64_t batch, [[maybe_unused]] std::int64_t seq,
                              [[maybe_unused]] const AttentionCore<T>* core,
                              [[maybe_unused]] const std::int64_t* positions) const {
  NDMESH_CUDA_TWIN(device(), {
    const AttentionKernel k = cuda_kernel(core, positions);
    const AttentionOptions& o = attn_.options();
    // cuDNN writes d qkv (every element): nothing zeroes it first.
    return k != AttentionKernel::kFlash &&
           cuda::attention_backward_cudnn(dqkv, dout, qkv, out, lse, batch, seq, o.heads, o.kv_heads, o.head_dim,
                                          k == AttentionKernel::kCudnnRequired);
  })
  return false;
}

template <typename T>
void Block<T>::fp32_attention_forward(const T* qkv, T* out, T* lse, std::int64_t batch, std::int64_t seq,
                                      const AttentionCore<T>* core, const std::int64_t* positions) const {
  ops::check_device<T>(device());
  // A ring (context parallelism) runs on the device too: the core gets device pointers.
  if (core)
    core->forward(attn_, qkv, out, lse, batch, seq, positions);
  else
    attn_.forward(qkv, out, lse, batch, seq, positions, device());
}

template <typename T>
void Block<T>::fp32_attention_backward(T* dqkv, const T* dout, const T* qkv, const T* out, const T* lse,
                                       std::int64_t batch, std::int64_t seq, const AttentionCore<T>* core,
                                       const std::int64_t* positions) const {
  ops::zero(dqkv, batch * seq * attn_.qkv_width(), device());  // these kernels add into it
  if (core)
    core->backward(attn_, dout, qkv, out, lse, dqkv, batch, seq, positions);
  else
    attn_.backward(dout, qkv, out, lse, dqkv, batch, seq, positions, device());
}

template <typename T>
void Block<T>::resize(BlockScratch<T>& s, std::int64_t batch, std::int64_t seq) const {
  const std::int64_t n = batch * seq, c = options_.channels, nl = tp_.local_rows(n);
  for (Tensor<T>* t : {&s.dres1, &s.dln, &s.dqkv, &s.datty, &s.dmlp, &s.dln_full, &s.dout_full})
    t->set_device(device());
  for (Tensor<BFloat16>* t : {&s.dqkv16, &s.datty16, &s.dmlp16}) t->set_device(device());
  s.dres1.resize({nl, c});
  s.dln.resize({n, c});
  if (attention_in_bf16()) {
    s.dqkv16.resize({n, attn_.qkv_width()});
    s.datty16.resize({n, attn_.out_width()});
  } else {
    s.dqkv.resize({n, attn_.qkv_width()});
    s.datty.resize({n, attn_.out_width()});
  }
  if (mlp_->hidden_in_bf16())
    s.dmlp16.resize({n, mlp_->scratch_width()});
  else
    s.dmlp.resize({n, mlp_->scratch_width()});
  if (tp_.sequence_parallel) {
    s.dln_full.resize({n, c});
    s.dout_full.resize({n, c});
  }
}

template <typename T>
void Block<T>::forward(const T* inp, BlockActivations<T>& a, std::int64_t batch, std::int64_t seq,
                       const AttentionCore<T>* core, const std::int64_t* positions, const PendingAdd<T>* pending,
                       bool finish) const {
  const std::int64_t n = batch * seq, c = options_.channels, nl = tp_.local_rows(n);
  const bool sp = tp_.sequence_parallel;
  const Device dev = device();
  if (sp && partial_.numel() != n * c) {
    partial_.set_device(dev);
    partial_.resize({n, c});
  }
  const bool bf16 = norms_in_bf16();  // the norms' outputs kept (and gathered) in bf16
  const bool attn16 = attention_in_bf16();
  NDMESH_CHECK(pending == nullptr || pending->x == inp, "nn", "block '{}': a pending add is on the block's input",
               options_.name);
  if (bf16) {
    if (pending)  // the previous block's closing add and this norm in one pass
      ln1_->forward_residual(pending->x, pending->residual, pending->x, a.ln1_16.data(), a.ln1_mean.data(),
                            a.ln1_rstd.data(), nl, pending->bias);
    else
      ln1_->forward(inp, a.ln1_16.data(), a.ln1_mean.data(), a.ln1_rstd.data(), nl);
    const BFloat16* x1 = tp_.f_forward(a.ln1_16.data(), a.ln1_full16.data(), n, c);
    if (attn16)
      qkv_.forward(x1, a.qkv16.data(), n);
    else
      qkv_.forward(x1, a.qkv.data(), n);
  } else {
    if (pending)
      ln1_->forward_residual(pending->x, pending->residual, pending->x, a.ln1.data(), a.ln1_mean.data(),
                            a.ln1_rstd.data(), nl, pending->bias);
    else
      ln1_->forward(inp, a.ln1.data(), a.ln1_mean.data(), a.ln1_rstd.data(), nl);
    const T* x1 = tp_.f_forward(a.ln1.data(), a.ln1_full.data(), n, c);
    if (attn16)
      qkv_.forward(x1, a.qkv16.data(), n);
    else
      qkv_.forward(x1, a.qkv.data(), n);
  }
  // Rotary positions at the rows' global positions: what is kept (and recomputed from) is
  // the rotated qkv.
  if (attn16)
    rotate(a.qkv16.data(), batch, seq, positions, false);
  else
    rotate(a.qkv.data(), batch, seq, positions, false);
  attention_forward(a, batch, seq, core, positions);
  T* part = sp ? partial_.data() : a.res1.data();
  if (attn16)
    proj_.forward(a.atty16.data(), part, n);
  else
    proj_.forward(a.atty.data(), part, n);
  tp_.g_forward(part, a.res1.data(), n, c);
  // res1 = (proj's output + its deferred bias) + inp, and ln2 of it: one pass.
  part = sp ? partial_.data() : a.out.data();
  if (bf16) {
    ln2_->forward_residual(a.res1.data(), inp, a.res1.data(), a.ln2_16.data(), a.ln2_mean.data(),
                           a.ln2_rstd.data(), nl, proj_.bias());
    mlp_->forward(tp_.f_forward(a.ln2_16.data(), a.ln2_full16.data(), n, c), part, a.mlp, n);
  } else {
    ln2_->forward_residual(a.res1.data(), inp, a.res1.data(), a.ln2.data(), a.ln2_mean.data(), a.ln2_rstd.data(),
                           nl, proj_.bias());
    mlp_->forward(tp_.f_forward(a.ln2.data(), a.ln2_full.data(), n, c), part, a.mlp, n);
  }
  tp_.g_forward(part, a.out.data(), n, c);
  // The MLP's bias and the residual in one pass, or left to the next norm (closing_add()).
  if (finish) mlp_->proj().add_bias(a.out.data(), nl, a.res1.data());
}

template <typename T>
void Block<T>::backward(const T* dout, const T* inp, const BlockActivations<T>& a, BlockScratch<T>& s,
                        T* dinp, std::int64_t batch, std::int64_t seq, const std::function<void()>* progress,
                        const AttentionCore<T>* core, const std::int64_t* positions) const {
  const std::int64_t n = batch * seq, c = options_.channels, nl = tp_.local_rows(n);
  const bool sp = tp_.sequence_parallel;
  auto poll = [progress] {
    if (progress) (*progress)();
  };
  // d input of a column-parallel linear, before f's reduction: [n, C] partial sums.
  T* dfull = sp ? s.dln_full.data() : s.dln.data();
  const bool bf16 = norms_in_bf16();  // the norms' outputs kept (and gathered) in bf16
  const T* x1 = sp ? a.ln1_full.data() : a.ln1.data();
  const T* x2 = sp ? a.ln2_full.data() : a.ln2.data();
  const BFloat16* x1_16 = sp ? a.ln1_full16.data() : a.ln1_16.data();
  const BFloat16* x2_16 = sp ? a.ln2_full16.data() : a.ln2_16.data();
  // Second residual: d res1 = dout (identity path) + the MLP branch through ln2, written by
  // ln2's backward (below) in one pass.
  const T* dout_full = tp_.g_backward(dout, s.dout_full.data(), n, c);
  if (bf16)  // writes dfull
    mlp_->backward(dout_full, x2_16, a.mlp, dfull, s.dmlp16.data(), n);
  else
    mlp_->backward(dout_full, x2, a.mlp, dfull, s.dmlp.data(), n);
  poll();
  tp_.f_backward(dfull, s.dln.data(), n, c);
  // The MLP's deferred bias gradient is the column sums of dout: ln2's backward reads it anyway.
  ln2_->backward(s.dln.data(), a.res1.data(), a.ln2_mean.data(), a.ln2_rstd.data(), s.dres1.data(), nl, dout,
                 mlp_->proj().bias_grad());
  // First residual: d inp = d res1 (identity path) + the attention branch through ln1.
  const T* dres1_full = tp_.g_backward(s.dres1.data(), s.dout_full.data(), n, c);
  const bool attn16 = attention_in_bf16();
  if (attn16)  // d atty written in bf16, rounded once
    proj_.backward(dres1_full, a.atty16.data(), s.datty16.data(), n);
  else
    proj_.backward(dres1_full, a.atty.data(), s.datty.data(), n, GradInto::kSet);
  poll();
  attention_backward(a, s, batch, seq, core, positions);  // writes d qkv (of the rotated q and k)
  if (attn16)
    rotate(s.dqkv16.data(), batch, seq, positions, true);
  else
    rotate(s.dqkv.data(), batch, seq, positions, true);
  poll();
  if (attn16 && bf16)
    qkv_.backward(s.dqkv16.data(), x1_16, dfull, n, GradInto::kSet);
  else if (attn16)
    qkv_.backward(s.dqkv16.data(), qkv_.options().out, x1, dfull, n, GradInto::kSet);
  else if (bf16)
    qkv_.backward(s.dqkv.data(), x1_16, dfull, n, GradInto::kSet);
  else
    qkv_.backward(s.dqkv.data(), x1, dfull, n, GradInto::kSet);
  tp_.f_backward(dfull, s.dln.data(), n, c);
  // d inp = the identity path's d res1 + the norm's gradient, in one pass; proj's deferred bias
  // gradient, the column sums of d res1, in the same read.
  ln1_->backward(s.dln.data(), inp, a.ln1_mean.data(), a.ln1_rstd.data(), dinp, nl, s.dres1.data(),
                 proj_.bias_grad());
}

template class Block<float>;
template class Block<double>;

}  // namespace ndmesh::nn
