#include "ndmesh/nn/block.hpp"

#include <algorithm>

#include "ndmesh/core/error.hpp"

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
  return o;
}
}  // namespace

template <typename T>
Block<T>::Block(ParamStore<T>& store, BlockOptions options)
    : options_(resolved(std::move(options))),
      ln1_(store, {.channels = options_.channels, .name = options_.name + ".ln1"}),
      attn_({.heads = options_.heads, .kv_heads = options_.kv_heads, .head_dim = options_.head_dim}),
      qkv_(store, {.in = options_.channels, .out = attn_.qkv_width(), .name = options_.name + ".attn.qkv"}),
      proj_(store, {.in = attn_.out_width(), .out = options_.channels, .name = options_.name + ".attn.proj"}),
      ln2_(store, {.channels = options_.channels, .name = options_.name + ".ln2"}),
      mlp_(store, {.channels = options_.channels, .ffn = options_.ffn, .name = options_.name + ".mlp"}) {}

template <typename T>
void Block<T>::init_norms() const {
  ln1_.init();
  ln2_.init();
}

template <typename T>
void Block<T>::resize(BlockActivations<T>& a, std::int64_t batch, std::int64_t seq) const {
  const std::int64_t n = batch * seq, c = options_.channels;
  a.ln1.resize({n, c});
  a.ln1_mean.resize({n});
  a.ln1_rstd.resize({n});
  a.qkv.resize({n, attn_.qkv_width()});
  a.lse.resize({batch, options_.heads, seq});
  a.atty.resize({n, attn_.out_width()});
  a.res1.resize({n, c});
  a.ln2.resize({n, c});
  a.ln2_mean.resize({n});
  a.ln2_rstd.resize({n});
  a.mlp.resize(n, options_.ffn);
  a.out.resize({n, c});
}

template <typename T>
void Block<T>::resize(BlockScratch<T>& s, std::int64_t batch, std::int64_t seq) const {
  const std::int64_t n = batch * seq, c = options_.channels;
  s.dres1.resize({n, c});
  s.dln.resize({n, c});
  s.dqkv.resize({n, attn_.qkv_width()});
  s.datty.resize({n, attn_.out_width()});
  s.dmlp.resize({2 * n, options_.ffn});
}

template <typename T>
void Block<T>::forward(const T* inp, BlockActivations<T>& a, std::int64_t batch, std::int64_t seq,
                       const AttentionCore<T>* core, const std::int64_t* positions) const {
  const std::int64_t n = batch * seq, c = options_.channels;
  ln1_.forward(inp, a.ln1.data(), a.ln1_mean.data(), a.ln1_rstd.data(), n);
  qkv_.forward(a.ln1.data(), a.qkv.data(), n);
  if (core)
    core->forward(attn_, a.qkv.data(), a.atty.data(), a.lse.data(), batch, seq, positions);
  else
    attn_.forward(a.qkv.data(), a.atty.data(), a.lse.data(), batch, seq, positions);
  proj_.forward(a.atty.data(), a.res1.data(), n);
  for (std::int64_t i = 0; i < n * c; ++i) a.res1[i] += inp[i];
  ln2_.forward(a.res1.data(), a.ln2.data(), a.ln2_mean.data(), a.ln2_rstd.data(), n);
  mlp_.forward(a.ln2.data(), a.out.data(), a.mlp, n);
  for (std::int64_t i = 0; i < n * c; ++i) a.out[i] += a.res1[i];
}

template <typename T>
void Block<T>::backward(const T* dout, const T* inp, const BlockActivations<T>& a, BlockScratch<T>& s,
                        T* dinp, std::int64_t batch, std::int64_t seq, const std::function<void()>* progress,
                        const AttentionCore<T>* core, const std::int64_t* positions) const {
  const std::int64_t n = batch * seq, c = options_.channels;
  auto poll = [progress] {
    if (progress) (*progress)();
  };
  // Second residual: d res1 = dout (identity path) + the MLP branch through ln2.
  std::copy(dout, dout + n * c, s.dres1.data());
  s.dln.zero();
  mlp_.backward(dout, a.ln2.data(), a.mlp, s.dln.data(), s.dmlp.data(), n);
  poll();
  ln2_.backward(s.dln.data(), a.res1.data(), a.ln2_mean.data(), a.ln2_rstd.data(), s.dres1.data(), n);
  // First residual: d inp = d res1 (identity path) + the attention branch through ln1.
  s.datty.zero();
  proj_.backward(s.dres1.data(), a.atty.data(), s.datty.data(), n);
  poll();
  s.dqkv.zero();
  if (core)
    core->backward(attn_, s.datty.data(), a.qkv.data(), a.atty.data(), a.lse.data(), s.dqkv.data(), batch, seq,
                   positions);
  else
    attn_.backward(s.datty.data(), a.qkv.data(), a.atty.data(), a.lse.data(), s.dqkv.data(), batch, seq,
                   positions);
  poll();
  s.dln.zero();
  qkv_.backward(s.dqkv.data(), a.ln1.data(), s.dln.data(), n);
  ln1_.backward(s.dln.data(), inp, a.ln1_mean.data(), a.ln1_rstd.data(), dinp, n);
  for (std::int64_t i = 0; i < n * c; ++i) dinp[i] += s.dres1[i];
}

template class Block<float>;
template class Block<double>;

}  // namespace ndmesh::nn
