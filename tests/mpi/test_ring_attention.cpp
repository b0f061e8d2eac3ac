// Ring attention under mpirun (the cp group is the world): for random q, k, v and output
// gradients in double precision, each rank's output, log-sum-exp and q/k/v gradients equal
// the single-rank attention over the whole sequence at that rank's positions within 1e-10,
// for the zigzag and contiguous layouts, multi-head and grouped-query. Also prints the
// attention work of each rank (score elements) for both layouts: zigzag balances it.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include "ndmesh/comm/communicator.hpp"
#include "ndmesh/nn/attention.hpp"
#include "ndmesh/parallel/cp/ring_attention.hpp"

namespace ndmesh {
namespace {

using comm::Communicator;
using parallel::CpLayout;

struct Case {
  std::int64_t heads, kv_heads, head_dim, batch, seq;
  CpLayout layout;
};

std::vector<double> random_vector(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> dist(0.0, 1.0);
  std::vector<double> v(n);
  for (double& x : v) x = dist(gen);
  return v;
}

// Returns this rank's forward score elements (for the balance report).
std::int64_t check_case(const Case& c) {
  const Communicator world = Communicator::world();
  const std::int64_t P = world.size(), r = world.rank();
  const nn::Attention<double> attn({.heads = c.heads, .kv_heads = c.kv_heads, .head_dim = c.head_dim});
  const std::int64_t R = attn.qkv_width(), O = attn.out_width(), H = c.heads, B = c.batch, S = c.seq;
  // The same inputs on every rank (same seeds).
  const auto qkv = random_vector(static_cast<std::size_t>(B * S * R), 11);
  const auto dout = random_vector(static_cast<std::size_t>(B * S * O), 12);
  std::vector<double> out(static_cast<std::size_t>(B * S * O)), lse(static_cast<std::size_t>(B * H * S));
  std::vector<double> dqkv(qkv.size(), 0.0);
  attn.forward(qkv.data(), out.data(), lse.data(), B, S);
  attn.backward(dout.data(), qkv.data(), out.data(), lse.data(), dqkv.data(), B, S);

  const auto pos = parallel::cp_positions(S, P, r, c.layout);
  const auto L = static_cast<std::int64_t>(pos.size());
  EXPECT_EQ(L * P, S);
  std::vector<double> lqkv(static_cast<std::size_t>(B * L * R)), ldout(static_cast<std::size_t>(B * L * O));
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t t = 0; t < L; ++t) {
      std::copy_n(qkv.data() + (b * S + pos[t]) * R, R, lqkv.data() + (b * L + t) * R);
      std::copy_n(dout.data() + (b * S + pos[t]) * O, O, ldout.data() + (b * L + t) * O);
    }
  parallel::RingAttention<double> ring(world);
  std::vector<double> lout(static_cast<std::size_t>(B * L * O)), llse(static_cast<std::size_t>(B * H * L));
  std::vector<double> ldqkv(lqkv.size(), 0.0);
  ring.forward(attn, lqkv.data(), lout.data(), llse.data(), B, L, pos.data());
  ring.backward(attn, ldout.data(), lqkv.data(), lout.data(), llse.data(), ldqkv.data(), B, L, pos.data());

  double err_out = 0, err_lse = 0, err_grad = 0;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t t = 0; t < L; ++t) {
      for (std::int64_t j = 0; j < O; ++j)
        err_out = std::max(err_out, std::abs(lout[(b * L + t) * O + j] - out[(b * S + pos[t]) * O + j]));
      for (std::int64_t h = 0; h < H; ++h)
        err_lse = std::max(err_lse, std::abs(llse[(b * H + h) * L + t] - lse[(b * H + h) * S + pos[t]]));
      for (std::int64_t j = 0; j < R; ++j)
        err_grad = std::max(err_grad, std::abs(ldqkv[(b * L + t) * R + j] - dqkv[(b * S + pos[t]) * R + j]));
    }
  EXPECT_LT(err_out, 1e-10) << "output";
  EXPECT_LT(err_lse, 1e-10) << "lse";
  EXPECT_LT(err_grad, 1e-10) << "dq, dk, dv";
  return ring.stats().score_elements;
}

class RingAttentionTest : public testing::TestWithParam<Case> {};

TEST_P(RingAttentionTest, EqualsSingleRankAttention) { check_case(GetParam()); }

INSTANTIATE_TEST_SUITE_P(
    Layouts, RingAttentionTest,
    testing::Values(Case{4, 4, 8, 2, 256, CpLayout::kZigzag}, Case{4, 4, 8, 2, 256, CpLayout::kContiguous},
                    Case{4, 2, 8, 2, 256, CpLayout::kZigzag}, Case{4, 1, 8, 1, 256, CpLayout::kContiguous},
                    Case{2, 1, 16, 3, 16, CpLayout::kZigzag}, Case{6, 3, 4, 1, 48, CpLayout::kContiguous}));

// Attention work per rank (forward score elements): zigzag is balanced, contiguous is not.
TEST(RingAttentionBalance, ZigzagBalancesCausalWork) {
  const Communicator world = Communicator::world();
  const std::int64_t seq = 2048;
  for (CpLayout layout : {CpLayout::kZigzag, CpLayout::kContiguous}) {
    const std::int64_t mine = check_case({2, 2, 8, 1, seq, layout});
    std::vector<std::int64_t> all(static_cast<std::size_t>(world.size()));
    world.all_gather(std::span<const std::int64_t>(&mine, 1), std::span<std::int64_t>(all));
    const double max = static_cast<double>(*std::max_element(all.begin(), all.end()));
    double mean = 0;
    for (std::int64_t e : all) mean += static_cast<double>(e) / static_cast<double>(all.size());
    if (world.rank() == 0)
      fmt::print("cp {} seq {} {}: attention score elements per rank [{}], max/mean {:.3f}\n", world.size(), seq,
                 parallel::to_string(layout), fmt::join(all, ", "), max / mean);
    if (layout == CpLayout::kZigzag && world.size() > 1) {
      EXPECT_LT(max / mean, 1.1);
    }
  }
}

}  // namespace
}  // namespace ndmesh
