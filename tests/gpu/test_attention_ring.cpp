// The ring attention's batch functions (nn/attention.hpp: attention_partial_forward,
// attention_merge, attention_row_dot, attention_partial_backward over an AttentionBatch, and
// ops::copy_rows: what parallel/cp/ring_attention runs) on CUDA against the same calls on the
// CPU, on the blocks of a cp 2 zigzag ring: rank 0 holds positions [0, c) and [3c, 4c), rank 1
// [c, 3c) of a 4c-token sequence. Queries read from packed qkv rows (ld = qkv width),
// key/value blocks both from qkv rows and standalone (ld = 2 KV hd, as the ring sends them);
// rank 0's first chunk sees no key of rank 1's block (out 0, lse -inf), so the merge meets
// -inf on either side.
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "gpu_test.hpp"
#include "ndmesh/nn/attention.hpp"
#include "ndmesh/tensor/ops.hpp"

namespace ndmesh {
namespace {

using namespace testing;  // gpu_test.hpp

struct Case {
  std::int64_t batch, chunk, heads, kv_heads, head_dim;
};

std::string describe(const Case& c) {
  return "batch=" + std::to_string(c.batch) + " chunk=" + std::to_string(c.chunk) +
         " heads=" + std::to_string(c.heads) + "/" + std::to_string(c.kv_heads) +
         " head_dim=" + std::to_string(c.head_dim);
}

// Positions of rank r of a zigzag cp 2 ring over 4 chunks of c tokens.
std::vector<std::int64_t> zigzag(std::int64_t r, std::int64_t c) {
  std::vector<std::int64_t> pos;
  for (std::int64_t chunk : {r, 3 - r})
    for (std::int64_t i = 0; i < c; ++i) pos.push_back(chunk * c + i);
  return pos;
}

// all_close, with -inf (a query that sees no key) required at the same places on both sides.
::testing::AssertionResult close_or_both_neg_inf(std::vector<float> got, std::vector<float> ref, double atol,
                                                 double rtol) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  std::size_t infs = 0;
  for (std::size_t i = 0; i < got.size() && i < ref.size(); ++i) {
    if ((got[i] == neg_inf) != (ref[i] == neg_inf))
      return ::testing::AssertionFailure()
             << "-inf at [" << i << "] on one side only: got " << got[i] << ", ref " << ref[i];
    if (ref[i] == neg_inf) got[i] = ref[i] = 0, ++infs;
  }
  return all_close(got, ref, atol, rtol);
}

// One rank's data: qkv rows [batch, 2c, R] and the key/value rows alone [batch, 2c, W].
struct Rank {
  std::vector<std::int64_t> pos;
  std::vector<float> qkv, kv;
};

Rank make_rank(const Case& c, const nn::Attention<float>& attn, std::int64_t r, std::uint64_t seed) {
  Rank k{zigzag(r, c.chunk),
         normal(static_cast<std::size_t>(c.batch * 2 * c.chunk * attn.qkv_width()), seed),
         {}};
  const std::int64_t R = attn.qkv_width(), W = 2 * c.kv_heads * c.head_dim, q_width = attn.out_width();
  for (std::int64_t i = 0; i < c.batch * 2 * c.chunk; ++i)
    for (std::int64_t j = 0; j < W; ++j) k.kv.push_back(k.qkv[static_cast<std::size_t>(i * R + q_width + j)]);
  return k;
}

const Case kCases[] = {{2, 9, 4, 2, 16}, {1, 40, 3, 1, 24}, {1, 33, 2, 2, 64}};

TEST(CudaRingAttention, PartialForwardAndMergeMatchTheCpu) {
  NDMESH_GPU_OR_SKIP();
  std::uint64_t seed = 1;
  for (const Case& c : kCases) {
    const nn::AttentionOptions o{.heads = c.heads, .kv_heads = c.kv_heads, .head_dim = c.head_dim};
    const nn::Attention<float> attn(o);
    const std::int64_t seq = 2 * c.chunk, R = attn.qkv_width(), O = attn.out_width(),
                       W = 2 * c.kv_heads * c.head_dim, H = c.heads;
    const Rank me = make_rank(c, attn, 0, seed++), other = make_rank(c, attn, 1, seed++);
    const auto out_n = static_cast<std::size_t>(c.batch * seq * O),
               lse_n = static_cast<std::size_t>(c.batch * H * seq);

    // Own block (keys inside the qkv rows), then the other rank's block (standalone), each on
    // both devices.
    auto own_block = [&](const float* qkv, const std::int64_t* pos) {
      return nn::AttentionBatch<float>{.q = qkv, .q_ld = R, .q_pos = pos, .kv = qkv + H * c.head_dim, .kv_ld = R,
                                       .kv_pos = pos, .batch = c.batch, .seq = seq};
    };
    auto other_block = [&](const float* qkv, const std::int64_t* qpos, const float* kv, const std::int64_t* kpos) {
      return nn::AttentionBatch<float>{
          .q = qkv, .q_ld = R, .q_pos = qpos, .kv = kv, .kv_ld = W, .kv_pos = kpos, .batch = c.batch, .seq = seq};
    };
    std::vector<float> out(out_n), lse(lse_n), part_out(out_n), part_lse(lse_n);
    nn::attention_partial_forward<float>(o, own_block(me.qkv.data(), me.pos.data()), out.data(), lse.data(),
                                         Device::kCpu);
    nn::attention_partial_forward<float>(
        o, other_block(me.qkv.data(), me.pos.data(), other.kv.data(), other.pos.data()), part_out.data(),
        part_lse.data(), Device::kCpu);

    DeviceBuffer qkv = to_device(me.qkv), kv = to_device(other.kv), qpos = to_device(me.pos),
                 kpos = to_device(other.pos);
    DeviceBuffer g_out = to_device(nans(out_n)), g_lse = to_device(nans(lse_n)),
                 g_part_out = to_device(nans(out_n)), g_part_lse = to_device(nans(lse_n));
    nn::attention_partial_forward<float>(o, own_block(ptr<float>(qkv), ptr<std::int64_t>(qpos)), ptr<float>(g_out),
                                         ptr<float>(g_lse), Device::kCuda);
    nn::attention_partial_forward<float>(
        o, other_block(ptr<float>(qkv), ptr<std::int64_t>(qpos), ptr<float>(kv), ptr<std::int64_t>(kpos)),
        ptr<float>(g_part_out), ptr<float>(g_part_lse), Device::kCuda);
    // The bounds of test_attention.cpp (sums over at most 80 keys in another order, expf).
    EXPECT_TRUE(all_close(to_host<float>(g_out, out_n), out, 2e-5, 1e-4)) << "own block out, " << describe(c);
    EXPECT_TRUE(close_or_both_neg_inf(to_host<float>(g_lse, lse_n), lse, 2e-5, 1e-5))
        << "own lse, " << describe(c);
    EXPECT_TRUE(all_close(to_host<float>(g_part_out, out_n), part_out, 2e-5, 1e-4))
        << "block out, " << describe(c);
    EXPECT_TRUE(close_or_both_neg_inf(to_host<float>(g_part_lse, lse_n), part_lse, 2e-5, 1e-5))
        << "block lse, " << describe(c);

    // The merge from the CPU's parts (compared alone), both orders: -inf on either side.
    for (int order = 0; order < 2; ++order) {
      std::vector<float> acc_out = order == 0 ? out : part_out, acc_lse = order == 0 ? lse : part_lse;
      const std::vector<float>& add_out = order == 0 ? part_out : out;
      const std::vector<float>& add_lse = order == 0 ? part_lse : lse;
      DeviceBuffer m_out = to_device(acc_out), m_lse = to_device(acc_lse), a_out = to_device(add_out),
                   a_lse = to_device(add_lse);
      nn::attention_merge<float>(o, c.batch, seq, acc_out.data(), acc_lse.data(), add_out.data(), add_lse.data(),
                                 Device::kCpu);
      nn::attention_merge<float>(o, c.batch, seq, ptr<float>(m_out), ptr<float>(m_lse), ptr<float>(a_out),
                                 ptr<float>(a_lse), Device::kCuda);
      // Two exp, a log and a weighted average of two rows: a few float ulps.
      EXPECT_TRUE(all_close(to_host<float>(m_out, out_n), acc_out, 1e-6, 1e-5))
          << "merged out, " << describe(c);
      EXPECT_TRUE(close_or_both_neg_inf(to_host<float>(m_lse, lse_n), acc_lse, 1e-6, 1e-6))
          << "merged lse, " << describe(c);
    }
  }
}

TEST(CudaRingAttention, RowDotAndPartialBackwardMatchTheCpu) {
  NDMESH_GPU_OR_SKIP();
  std::uint64_t seed = 11;
  for (const Case& c : kCases) {
    const nn::AttentionOptions o{.heads = c.heads, .kv_heads = c.kv_heads, .head_dim = c.head_dim};
    const nn::Attention<float> attn(o);
    const std::int64_t seq = 2 * c.chunk, R = attn.qkv_width(), O = attn.out_width(),
                       W = 2 * c.kv_heads * c.head_dim, H = c.heads;
    const Rank me = make_rank(c, attn, 1, seed++), other = make_rank(c, attn, 0, seed++);
    const auto out_n = static_cast<std::size_t>(c.batch * seq * O),
               lse_n = static_cast<std::size_t>(c.batch * H * seq);

    // The FINAL out and lse of rank 1's queries (both blocks merged), and D.
    const nn::AttentionBatch<float> own{.q = me.qkv.data(), .q_ld = R, .q_pos = me.pos.data(),
                                        .kv = me.qkv.data() + H * c.head_dim, .kv_ld = R, .kv_pos = me.pos.data(),
                                        .batch = c.batch, .seq = seq};
    nn::AttentionBatch<float> block{.q = me.qkv.data(), .q_ld = R, .q_pos = me.pos.data(), .kv = other.kv.data(),
                                    .kv_ld = W, .kv_pos = other.pos.data(), .batch = c.batch, .seq = seq};
    std::vector<float> out(out_n), lse(lse_n), part_out(out_n), part_lse(lse_n), delta(lse_n);
    const auto dout = normal(out_n, seed++);
    nn::attention_partial_forward<float>(o, own, out.data(), lse.data(), Device::kCpu);
    nn::attention_partial_forward<float>(o, block, part_out.data(), part_lse.data(), Device::kCpu);
    nn::attention_merge<float>(o, c.batch, seq, out.data(), lse.data(), part_out.data(), part_lse.data(),
                               Device::kCpu);
    nn::attention_row_dot<float>(o, c.batch, seq, out.data(), dout.data(), delta.data(), Device::kCpu);
    DeviceBuffer g_out = to_device(out), g_dout = to_device(dout), g_delta = to_device(nans(lse_n));
    nn::attention_row_dot<float>(o, c.batch, seq, ptr<float>(g_out), ptr<float>(g_dout), ptr<float>(g_delta),
                                 Device::kCuda);
    // hd products summed in another order (warp tree): a few ulps of hd terms of ~1.
    EXPECT_TRUE(all_close(to_host<float>(g_delta, lse_n), delta, 1e-5, 1e-5)) << "delta, " << describe(c);

    // The partial backward against the other rank's standalone block: dq accumulated into
    // pre-filled qkv-shaped rows (ld R), dK/dV into a pre-filled standalone buffer (ld W).
    const auto dqkv0 = normal(me.qkv.size(), seed++), dkv0 = normal(other.kv.size(), seed++);
    std::vector<float> dqkv = dqkv0, dkv = dkv0;
    nn::attention_partial_backward<float>(o, block, dout.data(), lse.data(), delta.data(), dqkv.data(), R, dkv.data(),
                                          W, Device::kCpu);
    DeviceBuffer qkv = to_device(me.qkv), kv = to_device(other.kv), qpos = to_device(me.pos),
                 kpos = to_device(other.pos), g_lse = to_device(lse), g_delta_cpu = to_device(delta),
                 g_dqkv = to_device(dqkv0), g_dkv = to_device(dkv0);
    block.q = ptr<float>(qkv), block.q_pos = ptr<std::int64_t>(qpos);
    block.kv = ptr<float>(kv), block.kv_pos = ptr<std::int64_t>(kpos);
    nn::attention_partial_backward<float>(o, block, ptr<float>(g_dout), ptr<float>(g_lse), ptr<float>(g_delta_cpu),
                                          ptr<float>(g_dqkv), R, ptr<float>(g_dkv), W, Device::kCuda);
    // The bound of test_attention.cpp's backward.
    EXPECT_TRUE(all_close(to_host<float>(g_dqkv, dqkv.size()), dqkv, 2e-5, 1e-4)) << "dq, " << describe(c);
    EXPECT_TRUE(all_close(to_host<float>(g_dkv, dkv.size()), dkv, 2e-5, 1e-4)) << "dkv, " << describe(c);
  }
}

TEST(CudaRingAttention, CopyRowsGathersAndAddsColumns) {
  NDMESH_GPU_OR_SKIP();
  const std::int64_t rows = 37, ld_src = 50, cols = 19, offset = 23, ld_dst = cols;
  const auto src = normal(static_cast<std::size_t>(rows * ld_src), 3),
             dst0 = normal(static_cast<std::size_t>(rows * ld_dst), 4);
  std::vector<float> gathered(dst0.size()), added = dst0;
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t j = 0; j < cols; ++j) {
      gathered[static_cast<std::size_t>(r * ld_dst + j)] =
          src[static_cast<std::size_t>(r * ld_src + offset + j)];
      added[static_cast<std::size_t>(r * ld_dst + j)] +=
          src[static_cast<std::size_t>(r * ld_src + offset + j)];
    }
  DeviceBuffer s = to_device(src), g = to_device(nans(dst0.size())), a = to_device(dst0);
  ops::copy_rows(ptr<float>(g), ld_dst, ptr<float>(s) + offset, ld_src, rows, cols, false, Device::kCuda);
  ops::copy_rows(ptr<float>(a), ld_dst, ptr<float>(s) + offset, ld_src, rows, cols, true, Device::kCuda);
  EXPECT_TRUE(same_bits(to_host<float>(g, dst0.size()), gathered));
  EXPECT_TRUE(same_bits(to_host<float>(a, dst0.size()), added));  // one float add each
  std::vector<float> cpu_gathered = nans(dst0.size()), cpu_added = dst0;  // the CPU twin
  ops::copy_rows(cpu_gathered.data(), ld_dst, src.data() + offset, ld_src, rows, cols, false, Device::kCpu);
  ops::copy_rows(cpu_added.data(), ld_dst, src.data() + offset, ld_src, rows, cols, true, Device::kCpu);
  EXPECT_TRUE(same_bits(cpu_gathered, gathered));
  EXPECT_TRUE(same_bits(cpu_added, added));
}

}  // namespace
}  // namespace ndmesh
