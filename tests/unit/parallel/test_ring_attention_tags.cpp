// Ring attention's messages cannot collide (comm/tags.hpp): on a cp group that is also
// another group kind's communicator (ProcessGroups shares it between kinds with the same
// members), foreign messages of the ring's own tags and sizes in flight during a forward
// and backward are neither taken by the ring nor disturbed: the results still equal the
// local attention kernel's, in-process on 2 and 3 ranks.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

#include "ndmesh/comm/inproc.hpp"
#include "ndmesh/comm/tags.hpp"
#include "ndmesh/parallel/cp/ring_attention.hpp"
#include "ndmesh/tensor/rng.hpp"

namespace ndmesh::parallel {
namespace {

using comm::Communicator;

std::vector<double> random_vector(std::size_t n, std::uint64_t seed) {
  Rng rng(seed);
  std::vector<double> v(n);
  for (double& x : v) x = rng.normal();
  return v;
}

TEST(RingAttentionTags, ForeignMessagesOfItsTagsOnTheSharedGroupAreNotTaken) {
  for (int ranks : {2, 3}) {
    comm::inproc::run(
        ranks,
        [](const Communicator& world) {
          const int P = world.size(), r = world.rank();
          const nn::Attention<double> attn({.heads = 2, .kv_heads = 1, .head_dim = 4});
          const std::int64_t S = 12 * P, B = 2, R = attn.qkv_width(), O = attn.out_width(), H = 2, W = 2 * 4;
          const auto qkv = random_vector(static_cast<std::size_t>(B * S * R), 3);
          const auto dout = random_vector(static_cast<std::size_t>(B * S * O), 4);
          std::vector<double> out(static_cast<std::size_t>(B * S * O)),
              lse(static_cast<std::size_t>(B * H * S)), dqkv(qkv.size(), 0.0);
          attn.forward(qkv.data(), out.data(), lse.data(), B, S);
          attn.backward(dout.data(), qkv.data(), out.data(), lse.data(), dqkv.data(), B, S);
          const auto pos = cp_positions(S, P, r, CpLayout::kZigzag);
          const auto L = static_cast<std::int64_t>(pos.size());
          std::vector<double> lqkv(static_cast<std::size_t>(B * L * R)),
              ldout(static_cast<std::size_t>(B * L * O));
          for (std::int64_t b = 0; b < B; ++b)
            for (std::int64_t t = 0; t < L; ++t) {
              std::copy_n(qkv.data() + (b * S + pos[t]) * R, R, lqkv.data() + (b * L + t) * R);
              std::copy_n(dout.data() + (b * S + pos[t]) * O, O, ldout.data() + (b * L + t) * O);
            }
          // The cp group and the world are one communicator, as for a mesh of cp alone. Foreign
          // messages shaped like the ring's (a [k | v] block, its positions, a dK/dV block) go to
          // the next rank with the ring's tags before it starts; they are received after it ends.
          const Communicator cp = world.named("cp");
          const int next = (r + 1) % P, prev = (r + P - 1) % P;
          std::vector<double> kv(static_cast<std::size_t>(B * L * W), 100.0 + r), dkv(kv.size(), 200.0 + r);
          std::vector<std::int64_t> kpos(static_cast<std::size_t>(L), 300 + r);
          std::vector<comm::Work> sent;
          sent.push_back(cp.send_async(std::span<const double>(kv), next, {.tag = comm::tags::kRingKv}));
          sent.push_back(
              cp.send_async(std::span<const std::int64_t>(kpos), next, {.tag = comm::tags::kRingPositions}));
          sent.push_back(cp.send_async(std::span<const double>(dkv), next, {.tag = comm::tags::kRingDkv}));
          RingAttention<double> ring(cp);
          std::vector<double> lout(static_cast<std::size_t>(B * L * O)),
              llse(static_cast<std::size_t>(B * H * L)), ldqkv(lqkv.size(), 0.0);
          ring.forward(attn, lqkv.data(), lout.data(), llse.data(), B, L, pos.data());
          ring.backward(attn, ldout.data(), lqkv.data(), lout.data(), llse.data(), ldqkv.data(), B, L,
                        pos.data());
          std::vector<double> got_kv(kv.size()), got_dkv(kv.size());
          std::vector<std::int64_t> got_pos(kpos.size());
          cp.recv(std::span<double>(got_kv), prev, {.tag = comm::tags::kRingKv});
          cp.recv(std::span<std::int64_t>(got_pos), prev, {.tag = comm::tags::kRingPositions});
          cp.recv(std::span<double>(got_dkv), prev, {.tag = comm::tags::kRingDkv});
          comm::wait_all(sent);
          EXPECT_EQ(got_kv, std::vector<double>(kv.size(), 100.0 + prev));
          EXPECT_EQ(got_pos, std::vector<std::int64_t>(kpos.size(), 300 + prev));
          EXPECT_EQ(got_dkv, std::vector<double>(kv.size(), 200.0 + prev));
          double err = 0;
          for (std::int64_t b = 0; b < B; ++b)
            for (std::int64_t t = 0; t < L; ++t) {
              for (std::int64_t j = 0; j < O; ++j)
                err = std::max(err, std::abs(lout[(b * L + t) * O + j] - out[(b * S + pos[t]) * O + j]));
              for (std::int64_t j = 0; j < R; ++j)
                err = std::max(err, std::abs(ldqkv[(b * L + t) * R + j] - dqkv[(b * S + pos[t]) * R + j]));
            }
          EXPECT_LT(err, 1e-10) << "cp " << P << " rank " << r;
        },
        {.timeout_s = 10});
  }
}

}  // namespace
}  // namespace ndmesh::parallel
