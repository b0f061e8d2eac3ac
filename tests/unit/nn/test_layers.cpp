// Every layer's backward against finite differences in double precision, plus the
// closed-form values that do not need a derivative (softmax, norms, AdamW's first step).
#include <cmath>
#include <vector>

#include <gtest/gtest.h>

#include "ndmesh/nn/adamw.hpp"
#include "ndmesh/nn/attention.hpp"
#include "ndmesh/nn/block.hpp"
#include "ndmesh/nn/cross_entropy.hpp"
#include "ndmesh/nn/embedding.hpp"
#include "ndmesh/nn/gelu.hpp"
#include "ndmesh/nn/layernorm.hpp"
#include "ndmesh/nn/linear.hpp"
#include "ndmesh/nn/lm_head.hpp"
#include "ndmesh/nn/mlp.hpp"
#include "unit/nn/fd_check.hpp"

namespace ndmesh::nn {
namespace {

using testing::dot;
using testing::expect_gradient;
using testing::expect_param_gradients;
using testing::fill_normal;
using testing::random_vector;
using V = std::vector<double>;

void randomize(ParamStore<double>& store, Rng& rng, double scale = 0.5) {
  for (const auto& view : store.views())
    fill_normal(store.mutable_param(store.find(view.name)), view.numel, rng, scale);
}

TEST(Linear, GradientsMatchFiniteDifferences) {
  for (bool bias : {true, false}) {
    Rng rng(1);
    ParamStore<double> store;
    Linear<double> lin(store, {.in = 5, .out = 3, .bias = bias});
    store.allocate();
    randomize(store, rng);
    const std::int64_t rows = 4;
    V x = random_vector(rows * 5, rng), w = random_vector(rows * 3, rng), out(rows * 3), dx(rows * 5, 0.0);
    auto loss = [&] {
      lin.forward(x.data(), out.data(), rows);
      return dot(out.data(), w.data(), rows * 3);
    };
    lin.backward(w.data(), x.data(), dx.data(), rows);
    EXPECT_GT(expect_gradient("dx", x.data(), dx.data(), rows * 5, loss), 1e-3);
    expect_param_gradients(store, loss);
  }
}

TEST(Linear, ForwardIsInputTimesWeightTransposedPlusBias) {
  ParamStore<double> store;
  Linear<double> lin(store, {.in = 2, .out = 2});
  store.allocate();
  // W = [[1, 2], [3, 4]], b = [10, 20]; x = [1, 1] -> [1+2+10, 3+4+20].
  double* wt = store.mutable_param(lin.weight_id());
  wt[0] = 1, wt[1] = 2, wt[2] = 3, wt[3] = 4;
  store.mutable_param(lin.bias_id())[0] = 10;
  store.mutable_param(lin.bias_id())[1] = 20;
  V x = {1, 1}, out(2);
  lin.forward(x.data(), out.data(), 1);
  EXPECT_DOUBLE_EQ(out[0], 13);
  EXPECT_DOUBLE_EQ(out[1], 27);
}

TEST(Linear, BackwardAccumulatesIntoDinp) {
  Rng rng(2);
  ParamStore<double> store;
  Linear<double> lin(store, {.in = 3, .out = 2});
  store.allocate();
  randomize(store, rng);
  V x = random_vector(3, rng), dout = random_vector(2, rng), fresh(3, 0.0), acc(3, 7.0);
  lin.backward(dout.data(), x.data(), fresh.data(), 1);
  lin.backward(dout.data(), x.data(), acc.data(), 1);
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(acc[i], fresh[i] + 7.0, 1e-12);
}

TEST(LayerNorm, GradientsMatchFiniteDifferences) {
  Rng rng(3);
  ParamStore<double> store;
  LayerNorm<double> ln(store, {.channels = 6});
  store.allocate();
  randomize(store, rng);
  const std::int64_t rows = 3;
  V x = random_vector(rows * 6, rng, 2.0), w = random_vector(rows * 6, rng), out(rows * 6), mean(rows),
    rstd(rows), dx(rows * 6, 0.0);
  auto loss = [&] {
    ln.forward(x.data(), out.data(), mean.data(), rstd.data(), rows);
    return dot(out.data(), w.data(), rows * 6);
  };
  loss();
  ln.backward(w.data(), x.data(), mean.data(), rstd.data(), dx.data(), rows);
  EXPECT_GT(expect_gradient("dx", x.data(), dx.data(), rows * 6, loss), 1e-3);
  expect_param_gradients(store, loss);
}

// The block's backward hands the residual path's gradient to the norm's backward, which
// writes dinp = it + the norm's input gradient in one pass, and sums its columns (the deferred
// bias gradient of the projection before the norm): the same bits as copying it into dinp and
// accumulating, and the residual's gradient is only read.
TEST(LayerNorm, ResidualGradientGivenApartIsTheAccumulateBitForBit) {
  Rng rng(5);
  ParamStore<double> store;
  LayerNorm<double> ln(store, {.channels = 7});
  store.allocate();
  randomize(store, rng);
  const std::int64_t rows = 4;
  const V x = random_vector(rows * 7, rng, 2.0), dout = random_vector(rows * 7, rng),
          dres = random_vector(rows * 7, rng);
  V out(rows * 7), mean(rows), rstd(rows), accumulated = dres, written(rows * 7, 99.0), dres_after = dres;
  ln.forward(x.data(), out.data(), mean.data(), rstd.data(), rows);
  store.zero_grad();
  ln.backward(dout.data(), x.data(), mean.data(), rstd.data(), accumulated.data(), rows);
  const V grads_once(store.grads().begin(), store.grads().end());
  V sums(7, 0.5), sums_ref(7, 0.5);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t i = 0; i < 7; ++i)
      sums_ref[static_cast<std::size_t>(i)] += dres[static_cast<std::size_t>(r * 7 + i)];
  ln.backward(dout.data(), x.data(), mean.data(), rstd.data(), written.data(), rows, dres_after.data(),
              sums.data());
  EXPECT_EQ(written, accumulated);
  EXPECT_EQ(dres_after, dres);
  EXPECT_EQ(sums, sums_ref) << "the residual's column sums, added in row order";
  // In place (the residual's gradient is dinp itself): the sums read it before it is written.
  V in_place = dres, sums_in_place(7, 0.5);
  ln.backward(dout.data(), x.data(), mean.data(), rstd.data(), in_place.data(), rows, in_place.data(),
              sums_in_place.data());
  EXPECT_EQ(in_place, accumulated);
  EXPECT_EQ(sums_in_place, sums_ref);
  for (std::size_t i = 0; i < grads_once.size(); ++i)  // the parameter gradients added twice more
    EXPECT_NEAR(store.grads()[i], 3 * grads_once[i], 1e-12 * (1 + std::fabs(grads_once[i])));
}

TEST(LayerNorm, UnitScaleGivesZeroMeanUnitVariance) {
  ParamStore<double> store;
  LayerNorm<double> ln(store, {.channels = 4, .eps = 0});
  store.allocate();
  ln.init();
  V x = {1, 2, 3, 4}, out(4), mean(1), rstd(1);
  ln.forward(x.data(), out.data(), mean.data(), rstd.data(), 1);
  // mean 2.5, variance 1.25: (x - 2.5) / sqrt(1.25).
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(out[i], (x[i] - 2.5) / std::sqrt(1.25), 1e-12);
}

TEST(Gelu, GradientsMatchFiniteDifferencesAndLimits) {
  Rng rng(4);
  const std::int64_t n = 20;
  V x = random_vector(n, rng, 2.0), w = random_vector(n, rng), out(n), dx(n, 0.0);
  auto loss = [&] {
    Gelu<double>::forward(x.data(), out.data(), n);
    return dot(out.data(), w.data(), n);
  };
  Gelu<double>::backward(w.data(), x.data(), dx.data(), n);
  expect_gradient("dx", x.data(), dx.data(), n, loss);
  V edge = {0.0, 10.0, -10.0}, y(3);
  Gelu<double>::forward(edge.data(), y.data(), 3);
  EXPECT_EQ(y[0], 0.0);
  EXPECT_NEAR(y[1], 10.0, 1e-12);
  EXPECT_NEAR(y[2], 0.0, 1e-12);
}

TEST(Gelu, FloatPathMatchesDoublePath) {
  // The float path computes tanh through exp (faster); it must agree with std::tanh.
  std::vector<float> xf, yf(2001), df(2001, 0.0f), ones(2001, 1.0f);
  V xd, yd(2001), dd(2001, 0.0), onesd(2001, 1.0);
  for (int i = -1000; i <= 1000; ++i) {
    xf.push_back(static_cast<float>(i) / 100.0f);
    xd.push_back(static_cast<double>(xf.back()));
  }
  Gelu<float>::forward(xf.data(), yf.data(), 2001);
  Gelu<double>::forward(xd.data(), yd.data(), 2001);
  Gelu<float>::backward(ones.data(), xf.data(), df.data(), 2001);
  Gelu<double>::backward(onesd.data(), xd.data(), dd.data(), 2001);
  for (std::size_t i = 0; i < xf.size(); ++i) {
    EXPECT_NEAR(yf[i], yd[i], 2e-6 * (1 + std::abs(yd[i]))) << "x=" << xd[i];
    EXPECT_NEAR(df[i], dd[i], 2e-6 * (1 + std::abs(dd[i]))) << "x=" << xd[i];
  }
}

TEST(Embedding, GradientsMatchFiniteDifferences) {
  Rng rng(5);
  ParamStore<double> store;
  Embedding<double> emb(store, {.vocab = 5, .channels = 3, .max_seq = 6});
  store.allocate();
  randomize(store, rng);
  const std::int64_t batch = 2, seq = 4;
  // Every token appears at least once so that every row of the table gets a gradient.
  std::vector<std::int32_t> tokens = {0, 1, 2, 3, 4, 1, 1, 0};
  V w = random_vector(batch * seq * 3, rng), out(batch * seq * 3);
  for (std::int64_t offset : {0, 2}) {
    auto loss = [&] {
      emb.forward(tokens.data(), out.data(), batch, seq, offset);
      return dot(out.data(), w.data(), batch * seq * 3);
    };
    store.zero_grad();
    emb.backward(w.data(), tokens.data(), batch, seq, offset);
    expect_param_gradients(store, loss);
  }
}

TEST(Embedding, RejectsOutOfRangeTokensAndPositions) {
  ParamStore<double> store;
  Embedding<double> emb(store, {.vocab = 5, .channels = 3, .max_seq = 4});
  store.allocate();
  V out(3 * 5);
  std::vector<std::int32_t> bad = {5};
  EXPECT_THROW(emb.forward(bad.data(), out.data(), 1, 1), Error);
  std::vector<std::int32_t> ok = {0, 1, 2, 3, 4};
  EXPECT_THROW(emb.forward(ok.data(), out.data(), 1, 5), Error);
}

class AttentionGrad : public ::testing::TestWithParam<std::pair<int, int>> {};

TEST_P(AttentionGrad, GradientsMatchFiniteDifferences) {
  const auto [heads, kv_heads] = GetParam();
  Rng rng(6);
  Attention<double> attn({.heads = heads, .kv_heads = kv_heads, .head_dim = 3});
  const std::int64_t batch = 2, seq = 5, r = attn.qkv_width(), o = attn.out_width();
  V qkv = random_vector(batch * seq * r, rng), w = random_vector(batch * seq * o, rng), out(batch * seq * o),
    lse(batch * heads * seq), dqkv(qkv.size(), 0.0);
  auto loss = [&] {
    attn.forward(qkv.data(), out.data(), lse.data(), batch, seq);
    return dot(out.data(), w.data(), batch * seq * o);
  };
  loss();
  attn.backward(w.data(), qkv.data(), out.data(), lse.data(), dqkv.data(), batch, seq);
  EXPECT_GT(expect_gradient("dqkv", qkv.data(), dqkv.data(), static_cast<std::int64_t>(qkv.size()), loss),
            1e-3);
}

INSTANTIATE_TEST_SUITE_P(HeadsAndKvHeads, AttentionGrad,
                         ::testing::Values(std::pair{1, 1}, std::pair{4, 4}, std::pair{4, 2}, std::pair{4, 1},
                                           std::pair{6, 3}));

TEST(Attention, IsCausalAndFirstRowSeesOnlyItself) {
  Rng rng(7);
  Attention<double> attn({.heads = 2, .kv_heads = 1, .head_dim = 2});
  const std::int64_t seq = 4, r = attn.qkv_width(), o = attn.out_width();
  V qkv = random_vector(seq * r, rng), out(seq * o), lse(2 * seq);
  attn.forward(qkv.data(), out.data(), lse.data(), 1, seq);
  // Changing the last token changes no earlier output.
  V qkv2 = qkv, out2(out.size()), lse2(lse.size());
  for (std::int64_t c = 0; c < r; ++c) qkv2[static_cast<std::size_t>((seq - 1) * r + c)] += 1.0;
  attn.forward(qkv2.data(), out2.data(), lse2.data(), 1, seq);
  for (std::int64_t i = 0; i < (seq - 1) * o; ++i)
    EXPECT_EQ(out[static_cast<std::size_t>(i)], out2[static_cast<std::size_t>(i)]) << i;
  // The first position attends only to itself: its output is its own value vector and its
  // lse its one score. Value head 0 (shared by both query heads) sits after 2 query heads
  // and 1 key head.
  for (int h = 0; h < 2; ++h) {
    for (int d = 0; d < 2; ++d) EXPECT_NEAR(out[static_cast<std::size_t>(h * 2 + d)], qkv[3 * 2 + d], 1e-12);
    const double score = (qkv[h * 2] * qkv[2 * 2] + qkv[h * 2 + 1] * qkv[2 * 2 + 1]) / std::sqrt(2.0);
    EXPECT_NEAR(lse[static_cast<std::size_t>(h * seq)], score, 1e-12);
  }
}

TEST(Attention, KvHeadsMustDivideHeads) {
  EXPECT_THROW(Attention<double>({.heads = 4, .kv_heads = 3, .head_dim = 2}), Error);
}

TEST(CrossEntropy, ClosedFormLossAndGradients) {
  // logits [0, ln 2, 0] -> probabilities [1/4, 1/2, 1/4]; target 1 -> loss ln 2.
  V logits = {0, std::log(2.0), 0}, probs(3), losses(1);
  std::vector<std::int32_t> target = {1};
  double loss =
      CrossEntropy<double>::forward(logits.data(), target.data(), probs.data(), losses.data(), 1, 3);
  EXPECT_NEAR(loss, std::log(2.0), 1e-15);
  EXPECT_NEAR(probs[0], 0.25, 1e-15);
  EXPECT_NEAR(probs[1], 0.5, 1e-15);

  Rng rng(8);
  const std::int64_t rows = 4, vocab = 6;
  V z = random_vector(rows * vocab, rng, 3.0), p(z.size()), l(rows), dz(z.size(), 0.0);
  std::vector<std::int32_t> targets = {0, 5, 2, 2};
  auto mean_loss = [&] {
    return CrossEntropy<double>::forward(z.data(), targets.data(), p.data(), l.data(), rows, vocab);
  };
  mean_loss();
  CrossEntropy<double>::backward(p.data(), targets.data(), dz.data(), rows, vocab, 1.0 / rows);
  expect_gradient("dlogits", z.data(), dz.data(), rows * vocab, mean_loss);
}

TEST(CrossEntropy, HugeLogitsStayFinite) {
  V logits = {1000, -1000}, probs(2), losses(1);
  std::vector<std::int32_t> target = {1};
  double loss =
      CrossEntropy<double>::forward(logits.data(), target.data(), probs.data(), losses.data(), 1, 2);
  EXPECT_NEAR(loss, 2000.0, 1e-9);
}

TEST(Mlp, GradientsMatchFiniteDifferences) {
  Rng rng(9);
  ParamStore<double> store;
  Mlp<double> mlp(store, {.channels = 4, .ffn = 7});
  store.allocate();
  randomize(store, rng);
  const std::int64_t rows = 3;
  MlpActivations<double> acts;
  acts.resize(rows, 7, 7);
  V x = random_vector(rows * 4, rng), w = random_vector(rows * 4, rng), out(rows * 4), dx(rows * 4, 0.0),
    scratch(rows * 7);
  auto loss = [&] {
    mlp.forward(x.data(), out.data(), acts, rows);
    mlp.proj().add_bias(out.data(), rows);  // deferred (the row-parallel half)
    return dot(out.data(), w.data(), rows * 4);
  };
  loss();
  mlp.backward(w.data(), x.data(), acts, dx.data(), scratch.data(), rows);
  mlp.proj().backward_bias(w.data(), rows);
  EXPECT_GT(expect_gradient("dx", x.data(), dx.data(), rows * 4, loss), 1e-3);
  expect_param_gradients(store, loss);
}

class BlockGrad : public ::testing::TestWithParam<int> {};

TEST_P(BlockGrad, GradientsMatchFiniteDifferences) {
  const int kv_heads = GetParam();
  Rng rng(10);
  ParamStore<double> store;
  Block<double> block(store, {.channels = 8, .heads = 4, .kv_heads = kv_heads, .ffn = 12});
  store.allocate();
  randomize(store, rng);
  const std::int64_t batch = 2, seq = 4, n = batch * seq * 8;
  BlockActivations<double> acts;
  BlockScratch<double> scratch;
  block.resize(acts, batch, seq);
  block.resize(scratch, batch, seq);
  V x = random_vector(n, rng), w = random_vector(n, rng), dx(n, 0.0);
  auto loss = [&] {
    block.forward(x.data(), acts, batch, seq);
    return dot(acts.out.data(), w.data(), n);
  };
  loss();
  block.backward(w.data(), x.data(), acts, scratch, dx.data(), batch, seq);
  EXPECT_GT(expect_gradient("dx", x.data(), dx.data(), n, loss), 1e-3);
  expect_param_gradients(store, loss);
}

INSTANTIATE_TEST_SUITE_P(KvHeads, BlockGrad, ::testing::Values(4, 2, 1));

TEST(LmHead, TiedHeadSharesTheEmbeddingTableAndItsGradient) {
  for (bool tied : {true, false}) {
    Rng rng(11);
    ParamStore<double> store;
    Embedding<double> emb(store, {.vocab = 5, .channels = 3, .max_seq = 4});
    LmHead<double> head(store, {.vocab = 5, .channels = 3, .tied_weight = tied ? emb.token_weight_id() : -1});
    store.allocate();
    randomize(store, rng);
    EXPECT_EQ(head.tied(), tied);
    EXPECT_EQ(head.weight_id() == emb.token_weight_id(), tied);
    EXPECT_EQ(store.views().size(), tied ? 2u : 3u);
    std::vector<std::int32_t> tokens = {0, 1, 2, 3, 4, 2, 1, 0};
    const std::int64_t batch = 2, seq = 4, rows = batch * seq;
    V h(rows * 3), logits(rows * 5), w = random_vector(rows * 5, rng), dh(rows * 3);
    auto loss = [&] {
      emb.forward(tokens.data(), h.data(), batch, seq);
      head.forward(h.data(), logits.data(), rows);
      return dot(logits.data(), w.data(), rows * 5);
    };
    loss();
    std::fill(dh.begin(), dh.end(), 0.0);
    head.backward(w.data(), h.data(), dh.data(), rows);
    emb.backward(dh.data(), tokens.data(), batch, seq);
    expect_param_gradients(store, loss);
  }
}

TEST(AdamW, FirstStepMatchesClosedForm) {
  ParamStore<double> store;
  int matrix = store.add("w", {2}, true);
  int bias = store.add("b", {1}, false);
  store.allocate();
  store.mutable_param(matrix)[0] = 1.0, store.mutable_param(matrix)[1] = -2.0,
  store.mutable_param(bias)[0] = 1.0;
  store.grad(matrix)[0] = 0.5, store.grad(matrix)[1] = -0.25, store.grad(bias)[0] = -2.0;
  AdamW<double> adam(store, {.beta1 = 0.9, .beta2 = 0.95, .eps = 0, .weight_decay = 0.1, .clip_norm = 0});
  adam.step(store, 0.1);
  // Step 1: m_hat = g, v_hat = g^2, so the step is lr * (sign(g) + decay * w).
  EXPECT_NEAR(store.param(matrix)[0], 1.0 - 0.1 * (1.0 + 0.1 * 1.0), 1e-12);
  EXPECT_NEAR(store.param(matrix)[1], -2.0 - 0.1 * (-1.0 + 0.1 * -2.0), 1e-12);
  EXPECT_NEAR(store.param(bias)[0], 1.0 + 0.1, 1e-12);  // no decay on biases
  EXPECT_EQ(adam.steps(), 1);
  // Step 2 with the same gradient: m = g (0.19 / 0.19), v = g^2 likewise: again sign(g).
  adam.step(store, 0.1);
  EXPECT_NEAR(store.param(bias)[0], 1.2, 1e-12);
}

TEST(AdamW, ClipsToTheGlobalNorm) {
  ParamStore<double> store;
  int a = store.add("a", {1}, false);
  int b = store.add("b", {1}, false);
  store.allocate();
  store.grad(a)[0] = 3.0, store.grad(b)[0] = 4.0;
  AdamW<double> adam(store, {.beta1 = 0.9, .clip_norm = 1.0});
  EXPECT_DOUBLE_EQ(AdamW<double>::grad_square_sum(store), 25.0);
  double norm = adam.step(store, 0.01);
  EXPECT_DOUBLE_EQ(norm, 5.0);
  // m = (1 - beta1) * g * (1 / 5).
  EXPECT_NEAR(adam.m()[static_cast<std::size_t>(store.view(a).offset)], 0.1 * 0.6, 1e-15);
  EXPECT_NEAR(adam.m()[static_cast<std::size_t>(store.view(b).offset)], 0.1 * 0.8, 1e-15);
}

}  // namespace
}  // namespace ndmesh::nn
