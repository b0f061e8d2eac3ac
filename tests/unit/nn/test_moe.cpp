// The mixture-of-experts MLP (nn/moe.hpp): the router's choice and tie-breaking, the capacity
// drop rule, the auxiliary loss against a value computed here from the router's weights, and
// every gradient (parameters, input, through the auxiliary loss) against finite differences
// in double, for both routers, both expert kinds, shared experts and a capacity; under bf16
// products, the router's choice against the fp32 layer's and each expert against the dense
// MLP of its kind under bf16 products.
#include <algorithm>
#include <cmath>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "ndmesh/core/dtype.hpp"
#include "ndmesh/nn/moe.hpp"
#include "unit/nn/fd_check.hpp"

namespace ndmesh::nn {
namespace {

using testing::dot;
using testing::expect_gradient;
using testing::fill_normal;
using testing::random_vector;
using V = std::vector<double>;

TEST(MoeRouter, TopKBreaksTiesByTheLowerExpertIndex) {
  const V even = {0.25, 0.25, 0.25, 0.25};
  Route r = route_token(even.data(), nullptr, 4, 2);
  EXPECT_EQ(r.experts, (std::vector<std::int64_t>{0, 1}));
  EXPECT_EQ(r.weights, (V{0.5, 0.5}));
  const V p = {0.1, 0.3, 0.3, 0.3};
  r = route_token(p.data(), nullptr, 4, 2);
  EXPECT_EQ(r.experts, (std::vector<std::int64_t>{1, 2}));
  const V q = {0.1, 0.2, 0.4, 0.3};
  r = route_token(q.data(), nullptr, 4, 3);
  EXPECT_EQ(r.experts, (std::vector<std::int64_t>{2, 3, 1}));
  EXPECT_NEAR(r.weights[0], 0.4 / 0.9, 1e-15);
  EXPECT_NEAR(r.weights[2], 0.2 / 0.9, 1e-15);
}

TEST(MoeRouter, SigmoidBiasPicksButDoesNotWeigh) {
  const V s = {0.5, 0.5, 0.5, 0.6};
  const V bias = {0.0, 0.2, 0.0, -0.3};
  // Scores with the bias: 0.5, 0.7, 0.5, 0.3: experts 1 then 0 (the lower of the tie).
  const Route r = route_token(s.data(), bias.data(), 4, 2);
  EXPECT_EQ(r.experts, (std::vector<std::int64_t>{1, 0}));
  EXPECT_EQ(r.weights, (V{0.5, 0.5}));  // the scores without the bias, normalised
}

TEST(MoeCapacity, ChoiceByChoiceThenTokenOrder) {
  EXPECT_EQ(expert_capacity(0, 8, 2, 4), -1);
  EXPECT_EQ(expert_capacity(1.0, 8, 2, 4), 4);
  EXPECT_EQ(expert_capacity(0.5, 3, 2, 2), 2);   // ceil(1.5)
  EXPECT_EQ(expert_capacity(1.25, 8, 2, 4), 5);  // exactly 5
  // Two tokens choosing (0, 1) and (1, 0), one place each: every first choice is kept before
  // any second choice (token order alone would keep token 0's both).
  EXPECT_EQ(capacity_keep({0, 1, 1, 0}, 2, 2, 2, 1), (std::vector<bool>{true, false, true, false}));
  // Three tokens all choosing (0, 1), two places each: the third token's both are dropped.
  EXPECT_EQ(capacity_keep({0, 1, 0, 1, 0, 1}, 3, 2, 2, 2),
            (std::vector<bool>{true, true, true, true, false, false}));
  EXPECT_EQ(capacity_keep({0, 1, 0, 1}, 2, 2, 2, -1), (std::vector<bool>(4, true)));
}

struct MoeCase {
  MlpKind kind;
  RouterKind router;
  std::int64_t shared;
  double capacity;
};
void PrintTo(const MoeCase& c, std::ostream* os) {
  *os << mlp_name(c.kind) << " " << router_name(c.router) << " shared " << c.shared << " capacity "
      << c.capacity;
}

class MoeGrad : public ::testing::TestWithParam<MoeCase> {};

constexpr std::int64_t kC = 4, kRows = 7, kExperts = 3, kTopK = 2;

TEST_P(MoeGrad, GradientsMatchFiniteDifferences) {
  const MoeCase c = GetParam();
  Rng rng(11);
  ParamStore<double> store;
  Moe<double> moe(store, {.channels = kC, .name = "moe", .bias = false},
                  {.experts = kExperts,
                   .top_k = kTopK,
                   .shared_experts = c.shared,
                   .expert_ffn = 5,
                   .kind = c.kind,
                   .router = c.router,
                   .aux_loss = 0.3,
                   .capacity_factor = c.capacity});
  store.allocate();
  for (const auto& view : store.views())  // a small balancing bias: it changes choices, not starves an expert
    fill_normal(store.mutable_param(store.find(view.name)), view.numel, rng,
                view.name == "moe.router.bias" ? 0.1 : 0.7);
  MlpActivations<double> acts;
  acts.resize(kRows, moe.pre_width(), moe.hidden_width());
  V x = random_vector(kRows * kC, rng), w = random_vector(kRows * kC, rng), out(kRows * kC), dx(kRows * kC);
  const double aux_weight = 0.7;
  moe.set_aux_weight(aux_weight);
  auto loss = [&] {
    moe.forward(x.data(), out.data(), acts, kRows);
    return dot(out.data(), w.data(), kRows * kC) + aux_weight * moe.aux_loss();
  };
  loss();
  if (c.capacity > 0) {
    EXPECT_GT(moe.dropped(), 0) << "the capacity case drops nothing: it proves nothing";
  }
  store.zero_grad();
  V scratch;
  moe.backward(w.data(), x.data(), acts, dx.data(), scratch.data(), kRows);
  EXPECT_GT(expect_gradient("dx", x.data(), dx.data(), kRows * kC, loss), 1e-3);
  for (const auto& view : store.views()) {
    if (view.name == "moe.router.bias") continue;  // used for the choice only: no gradient
    const double largest = expect_gradient(view.name, store.params().data() + view.offset,
                                           store.grads().data() + view.offset, view.numel, loss);
    EXPECT_GT(largest, 1e-6) << view.name;
  }
}

INSTANTIATE_TEST_SUITE_P(Kinds, MoeGrad,
                         ::testing::Values(MoeCase{MlpKind::kGelu, RouterKind::kSoftmax, 0, 0},
                                           MoeCase{MlpKind::kSwiglu, RouterKind::kSoftmax, 1, 0},
                                           MoeCase{MlpKind::kSwiglu, RouterKind::kSigmoid, 1, 0},
                                           MoeCase{MlpKind::kGelu, RouterKind::kSigmoid, 0, 0},
                                           MoeCase{MlpKind::kSwiglu, RouterKind::kSoftmax, 0, 0.5}));

// The auxiliary loss and the load from the router's weights, computed here: softmax of x · Wᵀ,
// the top-2 by hand, coeff * E * sum_e (count_e / (N k)) * mean_t p[t, e].
TEST(MoeAux, MatchesTheSwitchFormula) {
  Rng rng(3);
  ParamStore<double> store;
  const double coeff = 0.05;
  Moe<double> moe(store, {.channels = kC, .name = "moe", .bias = false},
                  {.experts = 4, .top_k = 2, .expert_ffn = 3, .kind = MlpKind::kGelu, .aux_loss = coeff});
  store.allocate();
  for (const auto& view : store.views())
    fill_normal(store.mutable_param(store.find(view.name)), view.numel, rng, 0.7);
  const std::int64_t n = 9;
  MlpActivations<double> acts;
  acts.resize(n, moe.pre_width(), moe.hidden_width());
  V x = random_vector(n * kC, rng), out(n * kC);
  moe.forward(x.data(), out.data(), acts, n);
  const double* wr = store.param(moe.router().weight_id());  // [E, C]
  V count(4, 0.0), mean_p(4, 0.0);
  for (std::int64_t t = 0; t < n; ++t) {
    V p(4);
    double z = 0;
    for (int e = 0; e < 4; ++e) {
      double l = 0;
      for (std::int64_t ch = 0; ch < kC; ++ch) l += x[t * kC + ch] * wr[e * kC + ch];
      z += p[e] = std::exp(l);
    }
    for (int e = 0; e < 4; ++e) mean_p[e] += p[e] / z / n;
    std::vector<int> order = {0, 1, 2, 3};
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[a] > p[b]; });
    count[order[0]] += 1;
    count[order[1]] += 1;
  }
  double aux = 0;
  for (int e = 0; e < 4; ++e) aux += count[e] / (2.0 * n) * mean_p[e];
  EXPECT_NEAR(moe.aux_loss(), coeff * 4 * aux, 1e-12);
  EXPECT_EQ(moe.expert_load(), count);
  EXPECT_EQ(moe.dropped(), 0);
}

// With room for one assignment per expert, the tokens whose every choice was dropped get
// nothing from the routed experts (no shared ones here): their output is zero.
TEST(MoeCapacity, DroppedTokensGetNoExpertOutput) {
  Rng rng(4);
  ParamStore<double> store;
  Moe<double> moe(
      store, {.channels = kC, .name = "moe", .bias = false},
      {.experts = 2, .top_k = 1, .expert_ffn = 3, .kind = MlpKind::kSwiglu, .capacity_factor = 0.25});
  store.allocate();
  for (const auto& view : store.views())
    fill_normal(store.mutable_param(store.find(view.name)), view.numel, rng, 0.7);
  const std::int64_t n = 8;  // capacity ceil(0.25 * 8 / 2) = 1: at most 2 of 8 tokens kept
  MlpActivations<double> acts;
  acts.resize(n, moe.pre_width(), moe.hidden_width());
  V x = random_vector(n * kC, rng), out(n * kC);
  moe.forward(x.data(), out.data(), acts, n);
  EXPECT_EQ(moe.dropped(), n - 2);
  int zero_rows = 0;
  for (std::int64_t t = 0; t < n; ++t) {
    bool zero = true;
    for (std::int64_t ch = 0; ch < kC; ++ch) zero = zero && out[t * kC + ch] == 0.0;
    zero_rows += zero ? 1 : 0;
  }
  EXPECT_EQ(zero_rows, n - 2);
}

// DeepSeek-V3's rule: an overloaded expert's bias goes down by the rate, an underloaded one's up.
TEST(MoeRouter, BiasMovesTowardAnEvenLoad) {
  ParamStore<double> store;
  Moe<double> moe(
      store, {.channels = kC, .name = "moe", .bias = false},
      {.experts = 3, .top_k = 1, .expert_ffn = 3, .router = RouterKind::kSigmoid, .router_bias_rate = 0.01});
  store.allocate();
  const V load = {6, 2, 4};  // mean 4
  moe.update_router_bias(load.data());
  const double* b = store.param(store.find("moe.router.bias"));
  EXPECT_DOUBLE_EQ(b[0], -0.01);
  EXPECT_DOUBLE_EQ(b[1], 0.01);
  EXPECT_DOUBLE_EQ(b[2], 0.0);
}

// Under bf16 products: the layer takes its rows in bfloat16 (the norm's output), routes them
// with the fp32 router (the routing, the auxiliary loss, the load and the drops bit for bit
// those of the fp32 layer on the same rows), and runs each expert and the shared MLP as the
// dense MLP of its kind under bf16 products on the rows routed to it: the outputs and every
// expert's and shared parameter's gradient against those dense MLPs run here one by one. The
// fp32 layer misses those by far more than the tolerance (the bf16 roundings happened); the
// input's and the router's gradients, which go through the router's fp32 backward, stay within
// bf16 roundings of the fp32 layer's.
struct Bf16Case {
  MlpKind kind;
  RouterKind router;
  std::int64_t shared;
  double capacity;
};
void PrintTo(const Bf16Case& c, std::ostream* os) {
  *os << mlp_name(c.kind) << " " << router_name(c.router) << " shared " << c.shared << " capacity "
      << c.capacity;
}

// max |a - b| / max |b| over n elements.
double relative_gap(const float* a, const float* b, std::int64_t n) {
  double gap = 0, scale = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    gap = std::max(gap, std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
    scale = std::max(scale, std::fabs(static_cast<double>(b[i])));
  }
  return gap / scale;
}

class MoeBf16 : public ::testing::TestWithParam<Bf16Case> {};

TEST_P(MoeBf16, ExpertsAreTheDenseBf16MlpsAndTheRouterStaysFp32) {
  const Bf16Case c = GetParam();
  constexpr std::int64_t kCh = 16, kN = 24, kE = 4, kK = 2, kF = 12;
  constexpr double kTol = 1e-5;  // the dense reference: the same products, up to summation order
  const MoeOptions mo{.experts = kE,
                      .top_k = kK,
                      .shared_experts = c.shared,
                      .expert_ffn = kF,
                      .kind = c.kind,
                      .router = c.router,
                      .aux_loss = 0.05,
                      .capacity_factor = c.capacity};
  const MlpOptions opts{.channels = kCh, .name = "moe", .bias = false};
  ParamStore<float> s16, s32, ref_store;
  s16.set_matmul_precision(MatmulPrecision::kBf16);
  ref_store.set_matmul_precision(MatmulPrecision::kBf16);
  Moe<float> m16(s16, opts, mo), m32(s32, opts, mo);
  // The dense MLPs of the same names, for the reference.
  std::vector<std::unique_ptr<FeedForward<float>>> dense;
  for (std::int64_t e = 0; e < kE; ++e)
    dense.push_back(make_feed_forward<float>(
        c.kind, ref_store, {.channels = kCh, .ffn = kF, .name = fmt::format("moe.experts.{}", e), .bias = false}));
  std::unique_ptr<FeedForward<float>> shared;
  if (c.shared > 0)
    shared = make_feed_forward<float>(c.kind, ref_store,
                                      {.channels = kCh, .ffn = c.shared * kF, .name = "moe.shared", .bias = false});
  s16.allocate();
  s32.allocate();
  ref_store.allocate();
  Rng rng(21);
  for (const auto& v : s16.views()) {
    float* p = s16.mutable_param(s16.find(v.name));
    for (std::int64_t i = 0; i < v.numel; ++i)
      p[i] = static_cast<float>((v.name == "moe.router.bias" ? 0.1 : 0.5) * rng.normal());
    std::copy_n(p, v.numel, s32.mutable_param(s32.find(v.name)));
    if (const int id = ref_store.find(v.name); id >= 0) std::copy_n(p, v.numel, ref_store.mutable_param(id));
  }
  std::vector<BFloat16> x16(kN * kCh);
  std::vector<float> x(kN * kCh), dout(kN * kCh);
  for (std::int64_t i = 0; i < kN * kCh; ++i) {
    x16[i] = BFloat16(static_cast<float>(rng.normal()));
    x[i] = static_cast<float>(x16[i]);
    dout[i] = static_cast<float>(rng.normal());
  }

  // Forward: the routing is the fp32 layer's on the same rows.
  MlpActivations<float> a16, a32, a_wide;
  m16.resize_activations(a16, kN);
  m32.resize_activations(a32, kN);
  std::vector<float> out16(kN * kCh), out32(kN * kCh), out_wide(kN * kCh);
  m16.forward(x16.data(), out16.data(), a16, kN);
  m32.forward(x.data(), out32.data(), a32, kN);
  const std::int64_t pw = m16.pre_width();
  ASSERT_EQ(a16.pre.numel(), kN * pw);
  EXPECT_EQ(std::vector<float>(a16.pre.data(), a16.pre.data() + kN * pw),
            std::vector<float>(a32.pre.data(), a32.pre.data() + kN * pw));
  EXPECT_EQ(m16.aux_loss(), m32.aux_loss());
  EXPECT_GT(m16.aux_loss(), 0);
  EXPECT_EQ(m16.expert_load(), m32.expert_load());
  EXPECT_EQ(m16.dropped(), m32.dropped());
  if (c.capacity > 0) {
    EXPECT_GT(m16.dropped(), 0) << "the capacity case drops nothing: it proves nothing";
  }
  // The same rows given in fp32: the same bits (the experts round them as they read them).
  m16.resize_activations(a_wide, kN);
  m16.forward(x.data(), out_wide.data(), a_wide, kN);
  EXPECT_EQ(out_wide, out16);

  // The reference: each expert's dense MLP on its kept rows (token order), weighed; the shared
  // MLP on every row; their backward from the weighed output gradient.
  std::vector<float> out_ref(kN * kCh, 0.0f);
  auto route = [&](std::int64_t t, std::int64_t part, std::int64_t j) {
    return a16.pre.data()[t * pw + part + j];
  };
  for (std::int64_t e = 0; e < kE; ++e) {
    std::vector<std::int64_t> tokens;
    std::vector<float> weight;
    for (std::int64_t t = 0; t < kN; ++t)
      for (std::int64_t j = 0; j < kK; ++j)
        if (static_cast<std::int64_t>(route(t, kE, j)) == e && route(t, kE + 2 * kK, j) != 0.0f) {
          tokens.push_back(t);
          weight.push_back(route(t, kE + kK, j));
        }
    const auto ne = static_cast<std::int64_t>(tokens.size());
    ASSERT_GT(ne, 0) << "expert " << e << " gets no rows: it proves nothing";
    std::vector<BFloat16> xe(ne * kCh);
    std::vector<float> ye(ne * kCh), dye(ne * kCh), dxe(ne * kCh);
    for (std::int64_t i = 0; i < ne; ++i) {
      std::copy_n(x16.data() + tokens[i] * kCh, kCh, xe.data() + i * kCh);
      for (std::int64_t ch = 0; ch < kCh; ++ch) dye[i * kCh + ch] = weight[i] * dout[tokens[i] * kCh + ch];
    }
    MlpActivations<float> a;
    dense[e]->resize_activations(a, ne);
    dense[e]->forward(xe.data(), ye.data(), a, ne);
    for (std::int64_t i = 0; i < ne; ++i)
      for (std::int64_t ch = 0; ch < kCh; ++ch) out_ref[tokens[i] * kCh + ch] += weight[i] * ye[i * kCh + ch];
    std::vector<BFloat16> scratch(ne * dense[e]->scratch_width());
    dense[e]->backward(dye.data(), xe.data(), a, dxe.data(), scratch.data(), ne);
  }
  if (shared) {
    MlpActivations<float> a;
    shared->resize_activations(a, kN);
    std::vector<float> ys(kN * kCh), dxs(kN * kCh);
    shared->forward(x16.data(), ys.data(), a, kN);
    for (std::int64_t i = 0; i < kN * kCh; ++i) out_ref[i] += ys[i];
    std::vector<BFloat16> scratch(kN * shared->scratch_width());
    shared->backward(dout.data(), x16.data(), a, dxs.data(), scratch.data(), kN);
  }
  EXPECT_LE(relative_gap(out16.data(), out_ref.data(), kN * kCh), kTol);
  EXPECT_GT(relative_gap(out32.data(), out_ref.data(), kN * kCh), 10 * kTol);

  // Backward.
  s16.zero_grad();
  s32.zero_grad();
  m16.set_aux_weight(0.7);
  m32.set_aux_weight(0.7);
  std::vector<float> dx16(kN * kCh), dx32(kN * kCh);
  BFloat16* no_scratch16 = nullptr;
  float* no_scratch = nullptr;
  m16.backward(dout.data(), x16.data(), a16, dx16.data(), no_scratch16, kN);
  m32.backward(dout.data(), x.data(), a32, dx32.data(), no_scratch, kN);
  int checked = 0;
  for (const auto& v : ref_store.views()) {
    const float* want = ref_store.grad(ref_store.find(v.name));
    EXPECT_LE(relative_gap(s16.grad(s16.find(v.name)), want, v.numel), kTol) << v.name;
    EXPECT_GT(relative_gap(s32.grad(s32.find(v.name)), want, v.numel), 10 * kTol) << v.name;
    ++checked;
  }
  EXPECT_EQ(checked, 2 * (kE + (c.shared > 0 ? 1 : 0)));
  const int router = s16.find("moe.router.weight");
  EXPECT_LE(relative_gap(s16.grad(router), s32.grad(router), kE * kCh), 3e-2);
  EXPECT_LE(relative_gap(dx16.data(), dx32.data(), kN * kCh), 3e-2);
}

INSTANTIATE_TEST_SUITE_P(Routers, MoeBf16,
                         ::testing::Values(Bf16Case{MlpKind::kGelu, RouterKind::kSoftmax, 0, 0},
                                           Bf16Case{MlpKind::kSwiglu, RouterKind::kSoftmax, 1, 0.5},
                                           Bf16Case{MlpKind::kSwiglu, RouterKind::kSigmoid, 1, 0},
                                           Bf16Case{MlpKind::kGelu, RouterKind::kSigmoid, 0, 0.5}));

}  // namespace
}  // namespace ndmesh::nn
