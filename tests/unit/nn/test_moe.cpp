// The mixture-of-experts MLP (nn/moe.hpp): the router's choice and tie-breaking, the capacity
// drop rule, the auxiliary loss against a value computed here from the router's weights, and
// every gradient (parameters, input, through the auxiliary loss) against finite differences
// in double, for both routers, both expert kinds, shared experts and a capacity.
#include <algorithm>
#include <cmath>
#include <ostream>
#include <vector>

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace ndmesh::nn
