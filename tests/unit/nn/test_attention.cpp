// Blockwise attention against a plain reference (full score matrix, masked softmax) in
// double precision, the ring-ready partial/merge building blocks against the whole-sequence
// call, the tile skipping count, the float path against the double path, and which kernel a
// Block runs on CUDA (attention_kernel).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <numeric>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "ndmesh/core/error.hpp"
#include "ndmesh/nn/attention.hpp"
#include "unit/nn/fd_check.hpp"

namespace ndmesh::nn {
namespace {

using testing::dot;
using testing::expect_gradient;
using testing::fill_normal;
using testing::random_vector;
using V = std::vector<double>;
using Pos = std::vector<std::int64_t>;

constexpr double kTol = 1e-10;
const double kNegInf = -std::numeric_limits<double>::infinity();

std::size_t at(std::int64_t i) { return static_cast<std::size_t>(i); }

/// The textbook computation: for each (b, h) the full S, a masked softmax, out = P V, and
/// the backward with dS = P ∘ (dP - rowsum(P ∘ dP)) / sqrt(hd).
struct Reference {
  V out, lse, dqkv;
};

Reference reference(const AttentionOptions& o, const V& qkv, const V& dout, std::int64_t batch,
                    std::int64_t seq) {
  const std::int64_t H = o.heads, KV = o.kv_heads, hd = o.head_dim, R = (H + 2 * KV) * hd, O = H * hd;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  Reference r{V(at(batch * seq * O), 0.0), V(at(batch * H * seq), 0.0), V(qkv.size(), 0.0)};
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t h = 0; h < H; ++h) {
      const std::int64_t g = h / (H / KV);
      auto q = [&](std::int64_t i, std::int64_t d) { return qkv[at((b * seq + i) * R + h * hd + d)]; };
      auto k = [&](std::int64_t j, std::int64_t d) { return qkv[at((b * seq + j) * R + (H + g) * hd + d)]; };
      auto v = [&](std::int64_t j, std::int64_t d) {
        return qkv[at((b * seq + j) * R + (H + KV + g) * hd + d)];
      };
      auto dy = [&](std::int64_t i, std::int64_t d) { return dout[at((b * seq + i) * O + h * hd + d)]; };
      V p(at(seq * seq), 0.0);
      for (std::int64_t i = 0; i < seq; ++i) {
        double mx = kNegInf;
        for (std::int64_t j = 0; j <= i; ++j) {
          double s = 0;
          for (std::int64_t d = 0; d < hd; ++d) s += q(i, d) * k(j, d);
          p[at(i * seq + j)] = s * scale;
          mx = std::max(mx, s * scale);
        }
        double sum = 0;
        for (std::int64_t j = 0; j <= i; ++j) sum += std::exp(p[at(i * seq + j)] - mx);
        for (std::int64_t j = 0; j <= i; ++j) p[at(i * seq + j)] = std::exp(p[at(i * seq + j)] - mx) / sum;
        r.lse[at((b * H + h) * seq + i)] = mx + std::log(sum);
        for (std::int64_t d = 0; d < hd; ++d) {
          double acc = 0;
          for (std::int64_t j = 0; j <= i; ++j) acc += p[at(i * seq + j)] * v(j, d);
          r.out[at((b * seq + i) * O + h * hd + d)] = acc;
        }
      }
      for (std::int64_t i = 0; i < seq; ++i) {
        V dp(at(i + 1));
        double rowdot = 0;
        for (std::int64_t j = 0; j <= i; ++j) {
          double s = 0;
          for (std::int64_t d = 0; d < hd; ++d) s += dy(i, d) * v(j, d);
          dp[at(j)] = s;
          rowdot += p[at(i * seq + j)] * s;
        }
        for (std::int64_t j = 0; j <= i; ++j) {
          const double pij = p[at(i * seq + j)];
          const double ds = pij * (dp[at(j)] - rowdot) * scale;
          for (std::int64_t d = 0; d < hd; ++d) {
            r.dqkv[at((b * seq + i) * R + h * hd + d)] += ds * k(j, d);
            r.dqkv[at((b * seq + j) * R + (H + g) * hd + d)] += ds * q(i, d);
            r.dqkv[at((b * seq + j) * R + (H + KV + g) * hd + d)] += pij * dy(i, d);
          }
        }
      }
    }
  return r;
}

void expect_near_all(const char* what, const V& got, const V& want, double tol = kTol) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int reported = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (!(std::abs(got[i] - want[i]) <= tol) && reported++ < 5)
      ADD_FAILURE() << what << "[" << i << "]: " << got[i] << " vs " << want[i];
}

// seq, kv_heads, head_dim; batch 2 and heads 4 throughout.
class AttentionReference : public ::testing::TestWithParam<std::tuple<int, int, int>> {};

TEST_P(AttentionReference, ForwardLseAndGradientsMatchTheFullMatrix) {
  const auto [seq, kv_heads, head_dim] = GetParam();
  const std::int64_t batch = 2, heads = 4;
  const AttentionOptions o{.heads = heads, .kv_heads = kv_heads, .head_dim = head_dim};
  Attention<double> attn(o);
  Rng rng(static_cast<std::uint64_t>(seq * 100 + kv_heads * 10 + head_dim));
  const V qkv = random_vector(batch * seq * attn.qkv_width(), rng);
  const V dout = random_vector(batch * seq * attn.out_width(), rng);
  V out(at(batch * seq * attn.out_width())), lse(at(batch * heads * seq)), dqkv(qkv.size(), 0.0);
  attn.forward(qkv.data(), out.data(), lse.data(), batch, seq);
  attn.backward(dout.data(), qkv.data(), out.data(), lse.data(), dqkv.data(), batch, seq);
  const Reference want = reference(o, qkv, dout, batch, seq);
  expect_near_all("out", out, want.out);
  expect_near_all("lse", lse, want.lse);
  expect_near_all("dqkv", dqkv, want.dqkv);
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionReference,
                         ::testing::Combine(::testing::Values(1, 5, 63, 64, 65, 130),
                                            ::testing::Values(4, 2, 1), ::testing::Values(8, 16)));

TEST(Attention, GradientAcrossTilesMatchesFiniteDifferences) {
  // seq 67 crosses a tile edge: a masked diagonal tile, a fully visible one and a skipped one.
  Rng rng(11);
  Attention<double> attn({.heads = 2, .kv_heads = 1, .head_dim = 3});
  const std::int64_t batch = 1, seq = kAttentionTile + 3, r = attn.qkv_width(), o = attn.out_width();
  V qkv = random_vector(batch * seq * r, rng), w = random_vector(batch * seq * o, rng);
  V out(at(batch * seq * o)), lse(at(batch * 2 * seq)), dqkv(qkv.size(), 0.0);
  auto loss = [&] {
    attn.forward(qkv.data(), out.data(), lse.data(), batch, seq);
    return dot(out.data(), w.data(), batch * seq * o);
  };
  loss();
  attn.backward(w.data(), qkv.data(), out.data(), lse.data(), dqkv.data(), batch, seq);
  EXPECT_GT(expect_gradient("dqkv", qkv.data(), dqkv.data(), static_cast<std::int64_t>(qkv.size()), loss),
            1e-3);
}

TEST(Attention, CausalSquareComputesTheLowerTriangleOfTiles) {
  for (std::int64_t n = 1; n <= 5; ++n) {
    Pos pos(at(n * kAttentionTile));
    std::iota(pos.begin(), pos.end(), 0);
    const AttentionTiles t = attention_tiles(pos.data(), n * kAttentionTile, pos.data(), n * kAttentionTile);
    EXPECT_EQ(t.computed, n * (n + 1) / 2) << n;
    EXPECT_EQ(t.masked, n) << n;
    EXPECT_EQ(t.skipped, n * (n - 1) / 2) << n;
    EXPECT_EQ(t.elements, n * (n + 1) / 2 * kAttentionTile * kAttentionTile) << n;
  }
  // The calls report the tiling they run (per head), and seq need not fill the last tile.
  const std::int64_t seq = 2 * kAttentionTile + 2;
  Pos pos(at(seq));
  std::iota(pos.begin(), pos.end(), 0);
  const AttentionOptions o{.heads = 3, .kv_heads = 1, .head_dim = 4};
  Rng rng(3);
  const V qkv = random_vector(seq * 6 * 4, rng), dout = random_vector(seq * 12, rng);
  V out(at(seq * 12)), lse(at(3 * seq)), delta(at(3 * seq)), dqkv(qkv.size(), 0.0);
  const AttentionRows<const double> q{.data = qkv.data(), .ld = 24, .pos = pos.data(), .rows = seq};
  const AttentionRows<const double> kv{.data = qkv.data() + 12, .ld = 24, .pos = pos.data(), .rows = seq};
  const AttentionTiles f =
      attention_partial_forward<double>(o, q, kv, {.out = out.data(), .ld = 12, .lse = lse.data()});
  EXPECT_EQ(f.computed, 6);
  EXPECT_EQ(f.masked, 3);
  EXPECT_EQ(f.skipped, 3);
  EXPECT_EQ(f.elements, (3 * 64 * 64) + (2 * 64 * 2) + 2 * 2);
  attention_row_dot<double>(o, seq, out.data(), 12, dout.data(), 12, delta.data());
  const AttentionTiles b = attention_partial_backward<double>(o, q, kv,
                                                              {.dout = dout.data(),
                                                               .ld_dout = 12,
                                                               .lse = lse.data(),
                                                               .delta = delta.data(),
                                                               .dq = dqkv.data(),
                                                               .ld_dq = 24,
                                                               .dkv = dqkv.data() + 12,
                                                               .ld_dkv = 24});
  EXPECT_EQ(b.computed, f.computed);
  EXPECT_EQ(b.masked, f.masked);
}

TEST(Attention, QueriesBeforeEveryKeyGetZeroOutAndMinusInfinityLse) {
  const AttentionOptions o{.heads = 2, .kv_heads = 2, .head_dim = 3};
  Rng rng(5);
  const std::int64_t nq = 4, nk = 70;
  const V qrows = random_vector(nq * 6, rng), kvrows = random_vector(nk * 12, rng);
  Pos qpos = {0, 3, 1, 2}, kpos(at(nk));
  std::iota(kpos.begin(), kpos.end(), 10);
  V out(at(nq * 6), 7.0), lse(at(2 * nq), 7.0);
  const AttentionTiles t =
      attention_partial_forward<double>(o, {.data = qrows.data(), .ld = 6, .pos = qpos.data(), .rows = nq},
                                        {.data = kvrows.data(), .ld = 12, .pos = kpos.data(), .rows = nk},
                                        {.out = out.data(), .ld = 6, .lse = lse.data()});
  EXPECT_EQ(t.computed, 0);
  EXPECT_EQ(t.skipped, 2);
  for (double x : out) EXPECT_EQ(x, 0.0);
  for (double x : lse) EXPECT_EQ(x, kNegInf);
  // Merging such a part changes nothing; merging into it copies the other part.
  V out2 = random_vector(nq * 6, rng), lse2 = random_vector(2 * nq, rng);
  const V out2_before = out2, lse2_before = lse2;
  attention_merge<double>(o, nq, out2.data(), 6, lse2.data(), out.data(), 6, lse.data());
  EXPECT_EQ(out2, out2_before);
  EXPECT_EQ(lse2, lse2_before);
  attention_merge<double>(o, nq, out.data(), 6, lse.data(), out2.data(), 6, lse2.data());
  EXPECT_EQ(out, out2);
  EXPECT_EQ(lse, lse2);
}

TEST(Attention, PartialCallsRejectStridesShorterThanTheirRows) {
  const AttentionOptions o{.heads = 2, .kv_heads = 1, .head_dim = 3};
  V q(6 * 2), kv(6 * 2), out(6 * 2), lse(2 * 2);
  Pos pos = {0, 1};
  auto forward = [&](std::int64_t ld_q, std::int64_t ld_kv, std::int64_t ld_out) {
    attention_partial_forward<double>(o, {.data = q.data(), .ld = ld_q, .pos = pos.data(), .rows = 2},
                                      {.data = kv.data(), .ld = ld_kv, .pos = pos.data(), .rows = 2},
                                      {.out = out.data(), .ld = ld_out, .lse = lse.data()});
  };
  EXPECT_NO_THROW(forward(6, 6, 6));
  EXPECT_THROW(forward(5, 6, 6), Error);
  EXPECT_THROW(forward(6, 5, 6), Error);
  EXPECT_THROW(forward(6, 6, 5), Error);
}

/// A context-parallel split of one sequence: chunk c holds the tokens at positions pos[c]
/// (in that row order), its q rows packed [n, H hd] and its k/v rows packed [n, 2 KV hd].
struct Chunk {
  Pos pos;
  V q, kv;
};

// shuffled: rows inside each chunk in random order (positions not sorted).
class AttentionRing : public ::testing::TestWithParam<bool> {};

TEST_P(AttentionRing, PartialsOverZigzagChunksEqualTheWholeSequence) {
  const bool shuffled = GetParam();
  const AttentionOptions o{.heads = 4, .kv_heads = 2, .head_dim = 8};
  const std::int64_t H = 4, KV = 2, hd = 8, seq = 130, R = (H + 2 * KV) * hd, O = H * hd, W = 2 * KV * hd;
  Attention<double> attn(o);
  Rng rng(21);
  const V qkv = random_vector(seq * R, rng), dout = random_vector(seq * O, rng);
  V out(at(seq * O)), lse(at(H * seq)), dqkv(qkv.size(), 0.0);
  attn.forward(qkv.data(), out.data(), lse.data(), 1, seq);
  attn.backward(dout.data(), qkv.data(), out.data(), lse.data(), dqkv.data(), 1, seq);

  // Zigzag-like uneven chunks: {0..16, 113..129}, {17..79}, {80..112}.
  std::vector<Chunk> chunks(3);
  for (std::int64_t t = 0; t < seq; ++t) chunks[t < 17 || t >= 113 ? 0 : (t < 80 ? 1 : 2)].pos.push_back(t);
  for (auto& c : chunks) {
    if (shuffled)
      for (std::size_t i = c.pos.size(); i > 1; --i) std::swap(c.pos[i - 1], c.pos[rng.below(i)]);
    for (std::int64_t t : c.pos) {
      const double* row = qkv.data() + t * R;
      c.q.insert(c.q.end(), row, row + O);
      c.kv.insert(c.kv.end(), row + O, row + R);
    }
  }
  auto rows_of = [](const Chunk& c, const V& data, std::int64_t ld) {
    return AttentionRows<const double>{
        .data = data.data(), .ld = ld, .pos = c.pos.data(), .rows = static_cast<std::int64_t>(c.pos.size())};
  };

  std::vector<V> dkv(3);
  for (std::size_t c = 0; c < 3; ++c) dkv[c].assign(chunks[c].kv.size(), 0.0);
  for (std::size_t a = 0; a < 3; ++a) {
    const Chunk& qc = chunks[a];
    const std::int64_t n = static_cast<std::int64_t>(qc.pos.size());
    V cout(at(n * O)), clse(at(H * n)), part(at(n * O)), part_lse(at(H * n));
    // Ring order: own block first, then the others as they would arrive.
    for (std::size_t step = 0; step < 3; ++step) {
      const std::size_t b = (a + 3 - step) % 3;
      const bool first = step == 0;
      attention_partial_forward<double>(
          o, rows_of(qc, qc.q, O), rows_of(chunks[b], chunks[b].kv, W),
          {.out = first ? cout.data() : part.data(), .ld = O, .lse = first ? clse.data() : part_lse.data()});
      if (!first) attention_merge<double>(o, n, cout.data(), O, clse.data(), part.data(), O, part_lse.data());
    }
    V cdout, want_out, want_lse(at(H * n));
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t t = qc.pos[at(i)];
      cdout.insert(cdout.end(), dout.begin() + t * O, dout.begin() + (t + 1) * O);
      want_out.insert(want_out.end(), out.begin() + t * O, out.begin() + (t + 1) * O);
      for (std::int64_t h = 0; h < H; ++h) want_lse[at(h * n + i)] = lse[at(h * seq + t)];
    }
    expect_near_all("chunk out", cout, want_out);
    expect_near_all("chunk lse", clse, want_lse);

    V delta(at(H * n)), dq(at(n * O), 0.0);
    attention_row_dot<double>(o, n, cout.data(), O, cdout.data(), O, delta.data());
    for (std::size_t step = 0; step < 3; ++step) {
      const std::size_t b = (a + 3 - step) % 3;
      attention_partial_backward<double>(o, rows_of(qc, qc.q, O), rows_of(chunks[b], chunks[b].kv, W),
                                         {.dout = cdout.data(),
                                          .ld_dout = O,
                                          .lse = clse.data(),
                                          .delta = delta.data(),
                                          .dq = dq.data(),
                                          .ld_dq = O,
                                          .dkv = dkv[b].data(),
                                          .ld_dkv = W});
    }
    V want_dq;
    for (std::int64_t t : qc.pos)
      want_dq.insert(want_dq.end(), dqkv.begin() + t * R, dqkv.begin() + t * R + O);
    expect_near_all("chunk dq", dq, want_dq);
  }
  for (std::size_t c = 0; c < 3; ++c) {
    V want_dkv;
    for (std::int64_t t : chunks[c].pos)
      want_dkv.insert(want_dkv.end(), dqkv.begin() + t * R + O, dqkv.begin() + (t + 1) * R);
    expect_near_all("chunk dkv", dkv[c], want_dkv);
  }
}

INSTANTIATE_TEST_SUITE_P(RowOrder, AttentionRing, ::testing::Values(false, true));

// The batch calls a ring makes (one signature for the CPU and CUDA, Device::kCpu here) equal
// the per-sequence calls: queries of a 300-token block in pieces of 256 rows (a poll after
// each), against another block's keys and values standalone (ld 2 KV hd), lse and delta
// [batch, H, seq], dQ into qkv-shaped rows.
TEST(Attention, BatchCallsEqualPerSequenceCallsAndPollBetweenPieces) {
  const AttentionOptions o{.heads = 4, .kv_heads = 2, .head_dim = 8};
  const std::int64_t H = 4, hd = 8, batch = 2, seq = 300, R = (H + 4) * hd, O = H * hd, W = 4 * hd;
  Rng rng(5);
  const V qkv = random_vector(batch * seq * R, rng), kv = random_vector(batch * seq * W, rng),
          dout = random_vector(batch * seq * O, rng);
  Pos qpos(at(seq)), kpos(at(seq));
  std::iota(qpos.begin(), qpos.end(), std::int64_t{200});  // sees all of kpos and masks a part
  std::iota(kpos.begin(), kpos.end(), std::int64_t{100});
  const AttentionBatch<double> x{
      .q = qkv.data(), .q_ld = R, .q_pos = qpos.data(), .kv = kv.data(), .kv_ld = W, .kv_pos = kpos.data(),
      .batch = batch, .seq = seq};
  int polls = 0;
  const auto poll = [&] { ++polls; };
  V out(at(batch * seq * O)), lse(at(batch * H * seq)), delta(lse.size()), dq(qkv.size(), 0.0),
      dkv(kv.size(), 0.0);
  attention_partial_forward<double>(o, x, out.data(), lse.data(), Device::kCpu, poll);
  EXPECT_EQ(polls, 4);  // 2 pieces of each of 2 sequences
  attention_row_dot<double>(o, batch, seq, out.data(), dout.data(), delta.data(), Device::kCpu);
  attention_partial_backward<double>(o, x, dout.data(), lse.data(), delta.data(), dq.data(), R, dkv.data(), W,
                                     Device::kCpu, poll);
  EXPECT_EQ(polls, 8);
  // Merged with itself: the same out, lse + log 2.
  V merged = out, merged_lse = lse;
  attention_merge<double>(o, batch, seq, merged.data(), merged_lse.data(), out.data(), lse.data(), Device::kCpu);

  V want_out(out.size()), want_lse(lse.size()), want_delta(lse.size()), want_dq(qkv.size(), 0.0),
      want_dkv(kv.size(), 0.0);
  for (std::int64_t b = 0; b < batch; ++b) {
    const AttentionRows<const double> q{qkv.data() + b * seq * R, R, qpos.data(), seq},
        k{kv.data() + b * seq * W, W, kpos.data(), seq};
    attention_partial_forward<double>(o, q, k, {want_out.data() + b * seq * O, O, want_lse.data() + b * H * seq});
    attention_row_dot<double>(o, seq, want_out.data() + b * seq * O, O, dout.data() + b * seq * O, O,
                              want_delta.data() + b * H * seq);
    attention_partial_backward<double>(o, q, k,
                                       {.dout = dout.data() + b * seq * O,
                                        .ld_dout = O,
                                        .lse = want_lse.data() + b * H * seq,
                                        .delta = want_delta.data() + b * H * seq,
                                        .dq = want_dq.data() + b * seq * R,
                                        .ld_dq = R,
                                        .dkv = want_dkv.data() + b * seq * W,
                                        .ld_dkv = W});
  }
  EXPECT_EQ(out, want_out);  // the same tiles in the same order: the same bits
  EXPECT_EQ(lse, want_lse);
  EXPECT_EQ(delta, want_delta);
  EXPECT_EQ(dq, want_dq);
  expect_near_all("dkv", dkv, want_dkv);  // two heads per key/value head: sums in another order
  expect_near_all("merged out", merged, out);
  for (double& l : want_lse) l += std::log(2.0);
  expect_near_all("merged lse", merged_lse, want_lse);
}

TEST(Attention, FloatPathMatchesDoublePath) {
  const AttentionOptions o{.heads = 4, .kv_heads = 2, .head_dim = 16};
  Attention<double> ad(o);
  Attention<float> af(o);
  const std::int64_t batch = 2, seq = 130, R = ad.qkv_width(), O = ad.out_width();
  Rng rng(8);
  const V qkv = random_vector(batch * seq * R, rng), dout = random_vector(batch * seq * O, rng);
  V out(at(batch * seq * O)), lse(at(batch * 4 * seq)), dqkv(qkv.size(), 0.0);
  ad.forward(qkv.data(), out.data(), lse.data(), batch, seq);
  ad.backward(dout.data(), qkv.data(), out.data(), lse.data(), dqkv.data(), batch, seq);
  std::vector<float> qkvf(qkv.begin(), qkv.end()), doutf(dout.begin(), dout.end());
  std::vector<float> outf(out.size()), lsef(lse.size()), dqkvf(qkv.size(), 0.0f);
  af.forward(qkvf.data(), outf.data(), lsef.data(), batch, seq);
  af.backward(doutf.data(), qkvf.data(), outf.data(), lsef.data(), dqkvf.data(), batch, seq);
  expect_near_all("float out", V(outf.begin(), outf.end()), out, 1e-5);
  expect_near_all("float lse", V(lsef.begin(), lsef.end()), lse, 1e-5);
  expect_near_all("float dqkv", V(dqkvf.begin(), dqkvf.end()), dqkv, 1e-4);
}

// cuDNN's SDPA under bf16 products unless NDMESH_ATTENTION=flash; never under fp32 or for
// positioned rows (the ring); NDMESH_ATTENTION=cudnn makes it required.
TEST(Attention, KernelIsCudnnUnderBf16UnlessFlashIsAskedFor) {
  const auto bf16 = MatmulPrecision::kBf16, fp32 = MatmulPrecision::kFp32;
  for (const char* value : {"", "auto"}) {
    setenv("NDMESH_ATTENTION", value, 1);
    EXPECT_EQ(attention_kernel(bf16, false), AttentionKernel::kCudnn) << value;
    EXPECT_EQ(attention_kernel(fp32, false), AttentionKernel::kFlash) << value;
    EXPECT_EQ(attention_kernel(bf16, true), AttentionKernel::kFlash) << value;
  }
  setenv("NDMESH_ATTENTION", "flash", 1);
  EXPECT_EQ(attention_kernel(bf16, false), AttentionKernel::kFlash);
  setenv("NDMESH_ATTENTION", "cudnn", 1);
  EXPECT_EQ(attention_kernel(bf16, false), AttentionKernel::kCudnnRequired);
  EXPECT_EQ(attention_kernel(fp32, false), AttentionKernel::kFlash);
  EXPECT_EQ(attention_kernel(bf16, true), AttentionKernel::kFlash);
  unsetenv("NDMESH_ATTENTION");
  EXPECT_EQ(attention_kernel(bf16, false), AttentionKernel::kCudnn);
}

}  // namespace
}  // namespace ndmesh::nn
