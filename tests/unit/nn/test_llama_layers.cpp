// The layers of the Llama family against finite differences in double precision (RMSNorm,
// SwiGLU, the gated MLP, rotary positions, a whole Llama block), and the closed-form values
// that need no derivative: RMSNorm's output, SwiGLU's, a rotation by a known angle, the
// inverse frequencies with and without Llama 3's scaling.
#include <cmath>
#include <numbers>
#include <vector>

#include <gtest/gtest.h>

#include "ndmesh/core/error.hpp"
#include "ndmesh/nn/block.hpp"
#include "ndmesh/nn/gated_mlp.hpp"
#include "ndmesh/nn/rmsnorm.hpp"
#include "ndmesh/nn/rope.hpp"
#include "ndmesh/nn/swiglu.hpp"
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

TEST(RmsNorm, ForwardIsXOverRootMeanSquareTimesWeight) {
  ParamStore<double> store;
  RmsNorm<double> ln(store, {.channels = 3, .eps = 1e-6});
  store.allocate();
  ln.init();
  const V x = {1.0, -2.0, 2.0};
  V y(3), rstd(1);
  ln.forward(x.data(), y.data(), nullptr, rstd.data(), 1);
  const double rms = std::sqrt((1.0 + 4.0 + 4.0) / 3.0 + 1e-6);
  EXPECT_NEAR(rstd[0], 1.0 / rms, 1e-15);
  for (int i = 0; i < 3; ++i)
    EXPECT_NEAR(y[static_cast<std::size_t>(i)], x[static_cast<std::size_t>(i)] / rms, 1e-15);
  EXPECT_EQ(store.views().size(), 1u);  // a scale, no shift
  EXPECT_FALSE(ln.keeps_mean());
}

TEST(RmsNorm, GradientsMatchFiniteDifferences) {
  Rng rng(3);
  ParamStore<double> store;
  RmsNorm<double> ln(store, {.channels = 7});
  store.allocate();
  randomize(store, rng);
  const std::int64_t rows = 4;
  V x = random_vector(rows * 7, rng), w = random_vector(rows * 7, rng), y(rows * 7), rstd(rows),
    dx(rows * 7, 0.0);
  auto loss = [&] {
    ln.forward(x.data(), y.data(), nullptr, rstd.data(), rows);
    return dot(y.data(), w.data(), rows * 7);
  };
  loss();
  ln.backward(w.data(), x.data(), nullptr, rstd.data(), dx.data(), rows);
  EXPECT_GT(expect_gradient("dx", x.data(), dx.data(), rows * 7, loss), 1e-3);
  expect_param_gradients(store, loss);
}

// The fused residual pass and the residual gradient (with its column sums) equal the plain
// passes: residual = (x + bias) + add, then the norm; dinp = dres + the norm's gradient.
TEST(RmsNorm, ResidualPassesEqualThePlainOnes) {
  Rng rng(4);
  ParamStore<double> store;
  RmsNorm<double> ln(store, {.channels = 5});
  store.allocate();
  randomize(store, rng);
  const std::int64_t rows = 3, n = rows * 5;
  const V x = random_vector(n, rng), add = random_vector(n, rng), bias = random_vector(5, rng);
  V res(n), y(n), rstd(rows), res2(n), y2(n), rstd2(rows);
  ln.forward_residual(x.data(), add.data(), res.data(), y.data(), nullptr, rstd.data(), rows, bias.data());
  for (std::int64_t i = 0; i < n; ++i) res2[i] = (x[i] + bias[i % 5]) + add[i];
  ln.forward(res2.data(), y2.data(), nullptr, rstd2.data(), rows);
  for (std::int64_t i = 0; i < n; ++i) {
    EXPECT_EQ(res[i], res2[i]);
    EXPECT_EQ(y[i], y2[i]);
  }
  const V dy = random_vector(n, rng), dres = random_vector(n, rng);
  V dx(n), plain(dres), sums(5, 0.0);
  ln.backward(dy.data(), res.data(), nullptr, rstd.data(), dx.data(), rows, dres.data(), sums.data());
  ln.backward(dy.data(), res.data(), nullptr, rstd.data(), plain.data(), rows);
  for (std::int64_t i = 0; i < n; ++i) EXPECT_NEAR(dx[i], plain[i], 1e-14);
  for (std::int64_t j = 0; j < 5; ++j) {
    double s = 0;
    for (std::int64_t r = 0; r < rows; ++r) s += dres[r * 5 + j];
    EXPECT_NEAR(sums[j], s, 1e-14);
  }
}

TEST(Swiglu, ForwardIsSiluOfGateTimesUp) {
  const V pre = {1.0, -2.0, 3.0, 0.5};  // one row: gate (1, -2), up (3, 0.5)
  V hidden(2);
  Swiglu<double>::forward(pre.data(), hidden.data(), 1, 2);
  const auto silu = [](double g) { return g / (1.0 + std::exp(-g)); };
  EXPECT_NEAR(hidden[0], silu(1.0) * 3.0, 1e-15);
  EXPECT_NEAR(hidden[1], silu(-2.0) * 0.5, 1e-15);
}

TEST(Swiglu, GradientMatchesFiniteDifferences) {
  Rng rng(5);
  const std::int64_t rows = 3, f = 4;
  V pre = random_vector(rows * 2 * f, rng, 2.0), w = random_vector(rows * f, rng), hidden(rows * f),
    dpre(rows * 2 * f);
  auto loss = [&] {
    Swiglu<double>::forward(pre.data(), hidden.data(), rows, f);
    return dot(hidden.data(), w.data(), rows * f);
  };
  Swiglu<double>::backward(w.data(), pre.data(), dpre.data(), rows, f);
  EXPECT_GT(expect_gradient("dpre", pre.data(), dpre.data(), rows * 2 * f, loss), 1e-3);
}

class GatedMlpGrad : public ::testing::TestWithParam<bool> {};

TEST_P(GatedMlpGrad, GradientsMatchFiniteDifferences) {
  const bool bias = GetParam();
  Rng rng(6);
  ParamStore<double> store;
  GatedMlp<double> mlp(store, {.channels = 4, .ffn = 6, .bias = bias});
  store.allocate();
  randomize(store, rng);
  EXPECT_EQ(store.views().size(), bias ? 4u : 2u);
  EXPECT_EQ(store.view(mlp.fc().weight_id()).shape, (std::vector<std::int64_t>{12, 4}));  // [gate | up]
  const std::int64_t rows = 3;
  MlpActivations<double> acts;
  acts.resize(rows, mlp.pre_width(), mlp.local_ffn());
  V x = random_vector(rows * 4, rng), w = random_vector(rows * 4, rng), out(rows * 4), dx(rows * 4, 0.0),
    scratch(static_cast<std::size_t>(rows * mlp.scratch_width()));
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

INSTANTIATE_TEST_SUITE_P(Bias, GatedMlpGrad, ::testing::Values(false, true));

TEST(Rope, InverseFrequenciesFollowHuggingFace) {
  const std::vector<float> f = rope_inv_freq({.head_dim = 8, .theta = 10000});
  ASSERT_EQ(f.size(), 4u);
  for (int i = 0; i < 4; ++i)
    EXPECT_NEAR(f[static_cast<std::size_t>(i)], 1.0 / std::pow(10000.0, 2.0 * i / 8.0), 1e-7);
  // Llama 3's scaling (transformers' _compute_llama3_parameters) on a wide range of
  // wavelengths: short ones kept, long ones divided by the factor, those between blended.
  const RopeScaling s{.factor = 8, .low_freq_factor = 1, .high_freq_factor = 4, .original_positions = 8192};
  const std::vector<float> base = rope_inv_freq({.head_dim = 128, .theta = 500000});
  const std::vector<float> scaled = rope_inv_freq({.head_dim = 128, .theta = 500000, .scaling = s});
  int kept = 0, divided = 0, blended = 0;
  for (std::size_t i = 0; i < base.size(); ++i) {
    const double wavelen = 2 * std::numbers::pi / base[i];
    if (wavelen < 8192.0 / 4) {
      EXPECT_EQ(scaled[i], base[i]) << i;
      ++kept;
    } else if (wavelen > 8192.0 / 1) {
      EXPECT_NEAR(scaled[i], base[i] / 8, 1e-6 * base[i]) << i;
      ++divided;
    } else {
      const double smooth = (8192.0 / wavelen - 1) / (4 - 1);
      EXPECT_NEAR(scaled[i], (1 - smooth) * base[i] / 8 + smooth * base[i], 1e-6 * base[i]) << i;
      ++blended;
    }
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(divided, 0);
  EXPECT_GT(blended, 0);
}

// transformers' _compute_llama3_parameters, written out here in double from its published
// form (base frequencies included, none of ndmesh's code): wavelengths above
// original / low_freq_factor divided by the factor, below original / high_freq_factor kept,
// between blended with smooth = (original / wavelen - low) / (high - low); the boundaries as
// torch.where and ~(a < b) * ~(a > c) draw them.
std::vector<double> llama3_inv_freq(std::int64_t d, double theta, const RopeScaling& s) {
  std::vector<double> out;
  const double low_wavelen = static_cast<double>(s.original_positions) / s.low_freq_factor;
  const double high_wavelen = static_cast<double>(s.original_positions) / s.high_freq_factor;
  for (std::int64_t i = 0; i < d; i += 2) {
    const double inv = 1.0 / std::pow(theta, static_cast<double>(i) / static_cast<double>(d));
    const double wavelen = 2 * std::numbers::pi / inv;
    const double llama = wavelen > low_wavelen ? inv / s.factor : inv;
    const double smooth = (static_cast<double>(s.original_positions) / wavelen - s.low_freq_factor) /
                          (s.high_freq_factor - s.low_freq_factor);
    const double smoothed = (1 - smooth) * llama / s.factor + smooth * llama;
    const bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
    out.push_back(medium ? smoothed : llama);
  }
  return out;
}

TEST(Rope, Llama3ScalingEqualsTransformersFormula) {
  struct Case {
    std::int64_t d;
    double theta;
    RopeScaling s;
  };
  // Llama 3.1 8B/70B, Llama 3.2 1B/3B, and a small made-up one with low_freq_factor != 1.
  const Case cases[] = {
      {128, 500000, {.factor = 8, .low_freq_factor = 1, .high_freq_factor = 4, .original_positions = 8192}},
      {64, 500000, {.factor = 32, .low_freq_factor = 1, .high_freq_factor = 4, .original_positions = 8192}},
      {32, 10000, {.factor = 4, .low_freq_factor = 2, .high_freq_factor = 8, .original_positions = 256}},
  };
  for (const Case& c : cases) {
    const std::vector<double> want = llama3_inv_freq(c.d, c.theta, c.s);
    const std::vector<float> got = rope_inv_freq({.head_dim = c.d, .theta = c.theta, .scaling = c.s});
    ASSERT_EQ(got.size(), want.size());
    int kept = 0, divided = 0, blended = 0;
    for (std::size_t i = 0; i < want.size(); ++i) {
      EXPECT_NEAR(got[i], want[i], 2e-6 * want[i]) << "d " << c.d << " factor " << c.s.factor << " i " << i;
      const double inv = 1.0 / std::pow(c.theta, 2.0 * static_cast<double>(i) / static_cast<double>(c.d));
      const double ratio = want[i] / inv;  // 1: kept, 1/factor: divided, between: blended
      kept += ratio == 1;
      divided += std::abs(ratio - 1 / c.s.factor) < 1e-12;
      blended += ratio < 1 && ratio > 1 / c.s.factor + 1e-12;
    }
    // every case reaches all three regions, so each branch of the formula is compared
    EXPECT_GT(kept, 0) << c.d;
    EXPECT_GT(divided, 0) << c.d;
    EXPECT_GT(blended, 0) << c.d;
  }
}

TEST(Rope, RotatesPairsByPositionTimesFrequency) {
  const Rope<double> rope({.head_dim = 4, .theta = 100});
  // One row at position 3, one head: pairs (0, 2) and (1, 3), frequencies 1 and 1/10.
  V x = {1.0, 2.0, 3.0, 4.0};
  const std::int64_t pos = 3;
  rope.forward(x.data(), 1, 1, 4, 1, &pos, Device::kCpu);
  const double a0 = 3.0, a1 = 0.3;
  EXPECT_NEAR(x[0], 1.0 * std::cos(a0) - 3.0 * std::sin(a0), 1e-15);
  EXPECT_NEAR(x[2], 3.0 * std::cos(a0) + 1.0 * std::sin(a0), 1e-15);
  EXPECT_NEAR(x[1], 2.0 * std::cos(a1) - 4.0 * std::sin(a1), 1e-15);
  EXPECT_NEAR(x[3], 4.0 * std::cos(a1) + 2.0 * std::sin(a1), 1e-15);
  rope.backward(x.data(), 1, 1, 4, 1, &pos, Device::kCpu);  // the inverse rotation
  EXPECT_NEAR(x[0], 1.0, 1e-14);
  EXPECT_NEAR(x[3], 4.0, 1e-14);
}

TEST(Rope, GradientMatchesFiniteDifferencesAtGivenPositions) {
  Rng rng(7);
  const Rope<double> rope({.head_dim = 6, .theta = 50});
  // Rows of width 3 heads (2 rotated, one left alone), seq 3 at non-contiguous positions.
  const std::int64_t rows = 6, seq = 3, width = 18;
  const std::vector<std::int64_t> pos = {0, 5, 2};
  V x = random_vector(rows * width, rng), w = random_vector(rows * width, rng), y(x.size());
  auto loss = [&] {
    y = x;
    rope.forward(y.data(), rows, seq, width, 2, pos.data(), Device::kCpu);
    return dot(y.data(), w.data(), rows * width);
  };
  V dx = w;
  rope.backward(dx.data(), rows, seq, width, 2, pos.data(), Device::kCpu);
  EXPECT_GT(expect_gradient("dx", x.data(), dx.data(), rows * width, loss), 1e-3);
}

TEST(Rope, BadSettingsAreConfigErrors) {
  EXPECT_THROW(Rope<double>({.head_dim = 5}), ConfigError);
  EXPECT_THROW(Rope<double>({.head_dim = 4, .theta = 0}), ConfigError);
  EXPECT_THROW(
      Rope<double>({.head_dim = 4, .scaling = {.factor = 8, .low_freq_factor = 4, .high_freq_factor = 1}}),
      ConfigError);
}

// A whole Llama block: RMSNorm, rotary positions (at non-contiguous positions, as a context-
// parallel rank's), grouped-query attention, no biases, SwiGLU.
class LlamaBlockGrad : public ::testing::TestWithParam<int> {};

TEST_P(LlamaBlockGrad, GradientsMatchFiniteDifferences) {
  const int kv_heads = GetParam();
  Rng rng(10);
  ParamStore<double> store;
  Block<double> block(store, {.channels = 8,
                              .heads = 4,
                              .kv_heads = kv_heads,
                              .ffn = 12,
                              .norm = NormKind::kRmsNorm,
                              .mlp = MlpKind::kSwiglu,
                              .bias = false,
                              .rope = RopeOptions{.theta = 10}});
  store.allocate();
  randomize(store, rng);
  for (const auto& v : store.views()) EXPECT_TRUE(v.name.ends_with(".weight")) << v.name << ": no biases";
  const std::int64_t batch = 2, seq = 4, n = batch * seq * 8;
  const std::vector<std::int64_t> pos = {0, 1, 6, 7};
  BlockActivations<double> acts;
  BlockScratch<double> scratch;
  block.resize(acts, batch, seq);
  block.resize(scratch, batch, seq);
  V x = random_vector(n, rng), w = random_vector(n, rng), dx(n, 0.0);
  auto loss = [&] {
    block.forward(x.data(), acts, batch, seq, nullptr, pos.data());
    return dot(acts.out.data(), w.data(), n);
  };
  loss();
  block.backward(w.data(), x.data(), acts, scratch, dx.data(), batch, seq, nullptr, nullptr, pos.data());
  EXPECT_GT(expect_gradient("dx", x.data(), dx.data(), n, loss), 1e-3);
  expect_param_gradients(store, loss);
}

INSTANTIATE_TEST_SUITE_P(KvHeads, LlamaBlockGrad, ::testing::Values(4, 2, 1));

}  // namespace
}  // namespace ndmesh::nn
