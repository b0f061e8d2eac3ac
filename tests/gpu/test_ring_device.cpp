// parallel::RingAttention on device buffers (--cp with --device cuda): the ring's device path
// (kernels of attention.cu, [k | v] blocks and the travelling dK/dV in device memory, the
// positions on the host) on in-process cp groups of 2 and 3 ranks, directly and through the
// staged communicator (NDMESH_BACKEND=gloo|mpi on GPUs: every buffer copied to a host
// buffer before it is sent and back once received), each rank's output,
// log-sum-exp and q/k/v gradients against nn::Attention<float> over the whole sequence at
// that rank's positions, for zigzag and contiguous layouts. The in-process communicator
// copies with memcpy, so this runs in the emulator only (gpu_emulated.*, where device memory
// is host memory); on a GPU, scripts/gpu_nccl.sh's cp 2 case runs the ring over NCCL.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "emulated_staging.hpp"
#include "gpu_test.hpp"
#include "ndmesh/comm/inproc.hpp"
#include "ndmesh/comm/staged.hpp"
#include "ndmesh/nn/attention.hpp"
#include "ndmesh/parallel/cp/ring_attention.hpp"

namespace ndmesh {
namespace {

using namespace testing;  // gpu_test.hpp
using parallel::CpLayout;

struct Case {
  std::int64_t heads, kv_heads, head_dim, batch, seq;
  CpLayout layout;
};

void check_case(const comm::Communicator& cp, const Case& c) {
  const std::int64_t P = cp.size(), r = cp.rank();
  const nn::Attention<float> attn({.heads = c.heads, .kv_heads = c.kv_heads, .head_dim = c.head_dim});
  const std::int64_t R = attn.qkv_width(), O = attn.out_width(), H = c.heads, B = c.batch, S = c.seq;
  // The same inputs on every rank; the reference over the whole sequence on the CPU.
  const auto qkv = normal(static_cast<std::size_t>(B * S * R), 11),
             dout = normal(static_cast<std::size_t>(B * S * O), 12);
  std::vector<float> out(static_cast<std::size_t>(B * S * O)), lse(static_cast<std::size_t>(B * H * S));
  std::vector<float> dqkv(qkv.size(), 0.0f);
  attn.forward(qkv.data(), out.data(), lse.data(), B, S);
  attn.backward(dout.data(), qkv.data(), out.data(), lse.data(), dqkv.data(), B, S);

  const auto pos = parallel::cp_positions(S, P, r, c.layout);
  const auto L = static_cast<std::int64_t>(pos.size());
  std::vector<float> lqkv(static_cast<std::size_t>(B * L * R)), ldout(static_cast<std::size_t>(B * L * O));
  std::vector<float> ref_out(static_cast<std::size_t>(B * L * O)),
      ref_lse(static_cast<std::size_t>(B * H * L)), ref_dqkv(lqkv.size());
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t t = 0; t < L; ++t) {
      const std::int64_t g = b * S + pos[static_cast<std::size_t>(t)], l = b * L + t;
      std::copy_n(qkv.data() + g * R, R, lqkv.data() + l * R);
      std::copy_n(dqkv.data() + g * R, R, ref_dqkv.data() + l * R);
      std::copy_n(dout.data() + g * O, O, ldout.data() + l * O);
      std::copy_n(out.data() + g * O, O, ref_out.data() + l * O);
      for (std::int64_t h = 0; h < H; ++h)
        ref_lse[static_cast<std::size_t>((b * H + h) * L + t)] =
            lse[static_cast<std::size_t>((b * H + h) * S + pos[static_cast<std::size_t>(t)])];
    }

  // The ring given the positions on the host (what the model's ring is) and not (it copies
  // the device's back): the same results.
  for (const bool given : {true, false}) {
    const std::string how = given ? " (positions given on the host)" : " (positions copied back)";
    parallel::RingAttention<float> ring(cp, Device::kCuda, given ? pos : std::vector<std::int64_t>{});
    DeviceBuffer d_qkv = to_device(lqkv), d_dout = to_device(ldout), d_pos = to_device(pos),
                 d_out = to_device(nans(ref_out.size())), d_lse = to_device(nans(ref_lse.size())),
                 d_dqkv = to_device(std::vector<float>(lqkv.size(), 0.0f));
    ring.forward(attn, ptr<float>(d_qkv), ptr<float>(d_out), ptr<float>(d_lse), B, L, ptr<std::int64_t>(d_pos));
    ring.backward(attn, ptr<float>(d_dout), ptr<float>(d_qkv), ptr<float>(d_out), ptr<float>(d_lse),
                  ptr<float>(d_dqkv), B, L, ptr<std::int64_t>(d_pos));
    // Merges of partial softmaxes and sums over P blocks in another order than the CPU's one
    // pass: the bounds of test_attention.cpp (a wrong block, mask or accumulator is off by 1e-2+).
    EXPECT_TRUE(all_close(to_host<float>(d_out, ref_out.size()), ref_out, 2e-5, 1e-4)) << "out, rank " << r << how;
    EXPECT_TRUE(all_close(to_host<float>(d_lse, ref_lse.size()), ref_lse, 2e-5, 1e-5)) << "lse, rank " << r << how;
    EXPECT_TRUE(all_close(to_host<float>(d_dqkv, ref_dqkv.size()), ref_dqkv, 2e-5, 1e-4))
        << "dqkv, rank " << r << how;
    if (P > 1 && c.layout == CpLayout::kContiguous && r == 0) {
      EXPECT_EQ(ring.stats().blocks_skipped, P - 1) << how;
    }
  }
}

TEST(CudaRingAttentionDevice, EqualsTheWholeAttention) {
  NDMESH_GPU_OR_SKIP();
#ifndef NDMESH_CUDA_EMULATED
  GTEST_SKIP() << "in-process ranks exchange host memory: emulator only (gpu_nccl.sh runs cp 2 on a GPU)";
#endif
  const Case cases[] = {{4, 2, 16, 2, 24, CpLayout::kZigzag},
                        {3, 1, 8, 1, 36, CpLayout::kContiguous},
                        {2, 2, 24, 1, 84, CpLayout::kZigzag}};
  for (bool staged : {false, true}) {
    const DirectDeviceExchange direct(!staged);
    for (int n : {2, 3})
      for (const Case& c : cases) {
        if (c.seq % (c.layout == CpLayout::kZigzag ? 2 * n : n) != 0) continue;
        comm::inproc::run(n, [&](const comm::Communicator& world) {
          if (!staged) return check_case(world, c);
          check_case(comm::staged(world, std::make_shared<EmulatedStaging>()), c);
        });
      }
  }
}

// Under bf16 products the block keeps q, k and v in bf16 and the ring is given them widened:
// its key/value blocks then travel in bf16 (bf16_blocks), which rounds none of them. The same
// ring on the same bf16-valued inputs with fp32 blocks gives the same bits; its blocks move
// half the bytes, its dK/dV accumulators (fp32 sums) as many.
TEST(CudaRingAttentionDevice, Bf16BlocksChangeNoBitAndMoveHalfTheBytes) {
  NDMESH_GPU_OR_SKIP();
#ifndef NDMESH_CUDA_EMULATED
  GTEST_SKIP() << "in-process ranks exchange host memory: emulator only (gpu_nccl.sh runs cp 2 on a GPU)";
#endif
  const std::int64_t B = 2, L = 8;
  const nn::Attention<float> attn({.heads = 4, .kv_heads = 2, .head_dim = 8});
  const std::int64_t R = attn.qkv_width(), O = attn.out_width(), H = 4;
  for (const bool staged : {false, true}) {
    const DirectDeviceExchange direct(!staged);
    comm::inproc::run(3, [&](const comm::Communicator& world) {
      const comm::Communicator cp = staged ? comm::staged(world, std::make_shared<EmulatedStaging>()) : world;
      const auto pos = parallel::cp_positions(3 * L, 3, cp.rank(), CpLayout::kZigzag);
      auto qkv = normal(static_cast<std::size_t>(B * L * R), 21 + static_cast<std::uint64_t>(cp.rank()));
      for (float& v : qkv) v = static_cast<float>(BFloat16(v));  // bf16 values, as the block's qkv16 widened
      const auto dout = normal(static_cast<std::size_t>(B * L * O), 31 + static_cast<std::uint64_t>(cp.rank()));
      std::vector<std::vector<float>> results[2];
      parallel::RingAttentionStats stats[2];
      for (const bool bf16 : {false, true}) {
        parallel::RingAttention<float> ring(cp, Device::kCuda, pos, bf16);
        DeviceBuffer d_qkv = to_device(qkv), d_dout = to_device(dout), d_pos = to_device(pos),
                     d_out = to_device(nans(static_cast<std::size_t>(B * L * O))),
                     d_lse = to_device(nans(static_cast<std::size_t>(B * H * L))),
                     d_dqkv = to_device(std::vector<float>(qkv.size(), 0.0f));
        ring.forward(attn, ptr<float>(d_qkv), ptr<float>(d_out), ptr<float>(d_lse), B, L, ptr<std::int64_t>(d_pos));
        ring.backward(attn, ptr<float>(d_dout), ptr<float>(d_qkv), ptr<float>(d_out), ptr<float>(d_lse),
                      ptr<float>(d_dqkv), B, L, ptr<std::int64_t>(d_pos));
        results[bf16] = {to_host<float>(d_out, static_cast<std::size_t>(B * L * O)),
                         to_host<float>(d_lse, static_cast<std::size_t>(B * H * L)),
                         to_host<float>(d_dqkv, qkv.size())};
        stats[bf16] = ring.stats();
      }
      const char* names[] = {"out", "lse", "dqkv"};
      for (std::size_t i = 0; i < 3; ++i)
        EXPECT_EQ(std::memcmp(results[0][i].data(), results[1][i].data(), results[0][i].size() * sizeof(float)), 0)
            << names[i] << ", rank " << cp.rank() << (staged ? " (staged)" : "");
      // 2 blocks forward and 2 backward (cp - 1 each), 3 accumulators (cp) of B L x 2 kv_heads hd.
      const std::int64_t block = B * L * 2 * 2 * 8;
      EXPECT_EQ(stats[0].kv.calls, 4);
      EXPECT_EQ(stats[0].kv.bytes, 4 * block * 4);
      EXPECT_EQ(stats[1].kv.calls, 4);
      EXPECT_EQ(stats[1].kv.bytes, 4 * block * 2);
      EXPECT_EQ(stats[1].dkv.calls, 3);
      EXPECT_EQ(stats[1].dkv.bytes, 3 * block * 4);
      EXPECT_EQ(stats[0].dkv.bytes, stats[1].dkv.bytes);
    });
  }
}

}  // namespace
}  // namespace ndmesh
