// The element-wise helpers and reductions (src/tensor/cuda/elementwise.cu) against their
// CPU twins: add_inplace, fill, scale and the bfloat16 casts agree bit for bit (the same
// single IEEE operation per element, no FMA), the double sums to 1e-12 relative (both in
// double, in different orders: about 1e-15). Sizes are odd, and each map also runs at an
// offset of one float so that the scalar path (not 16-byte aligned) is tested beside the
// float4 one.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "gpu_test.hpp"
#include "ndmesh/core/dtype.hpp"
#include "ndmesh/nn/adamw.hpp"
#include "ndmesh/nn/cuda_ops.hpp"
#include "ndmesh/tensor/device.hpp"
#include "ndmesh/tensor/ops.hpp"
#include "ndmesh/tensor/params.hpp"

namespace ndmesh {
namespace {

using namespace testing;  // gpu_test.hpp

constexpr std::int64_t kSizes[] = {1, 7, 1031, 100003};

TEST(CudaElementwise, AddInplaceFillAndScaleAreTheCpuLoops) {
  NDMESH_GPU_OR_SKIP();
  for (std::int64_t n : kSizes)
    for (std::int64_t offset : {0, 1}) {
      const auto dst = normal(static_cast<std::size_t>(n + offset), 1),
                 src = normal(static_cast<std::size_t>(n + offset), 2);
      std::vector<float> added = dst, scaled = dst, filled = dst;
      for (std::int64_t i = offset; i < n + offset; ++i) {
        const auto k = static_cast<std::size_t>(i);
        added[k] += src[k];
        scaled[k] *= -1.7f;
        filled[k] = 0.25f;
      }
      DeviceBuffer d_add = to_device(dst), d_src = to_device(src), d_scale = to_device(dst),
                   d_fill = to_device(dst);
      cuda::add_inplace(ptr<float>(d_add) + offset, ptr<float>(d_src) + offset, n);
      cuda::scale(ptr<float>(d_scale) + offset, -1.7f, n);
      cuda::fill(ptr<float>(d_fill) + offset, 0.25f, n);
      EXPECT_TRUE(same_bits(to_host<float>(d_add, dst.size()), added))
          << "add_inplace n=" << n << " offset=" << offset;
      EXPECT_TRUE(same_bits(to_host<float>(d_scale, dst.size()), scaled))
          << "scale n=" << n << " offset=" << offset;
      EXPECT_TRUE(same_bits(to_host<float>(d_fill, dst.size()), filled))
          << "fill n=" << n << " offset=" << offset;
    }
}

TEST(CudaElementwise, SquareSumIsTheOptimizersNormAndSumTheDoubleSum) {
  NDMESH_GPU_OR_SKIP();
  for (std::int64_t n : kSizes) {
    ParamStore<float> store;
    store.add("x", {n}, false);
    store.allocate();
    const auto x = normal(static_cast<std::size_t>(n), 3, 3.0f);
    std::copy(x.begin(), x.end(), store.grads().begin());
    const double square_ref = nn::AdamW<float>::grad_square_sum(store);
    double sum_ref = 0, abs_sum = 0;
    for (float v : x) sum_ref += v, abs_sum += std::fabs(v);
    DeviceBuffer d = to_device(x);
    const double square = cuda::square_sum(ptr<float>(d), n), total = cuda::sum(ptr<float>(d), n);
    // Double sums of up to 1e5 terms in two orders: about 1e-15 relative to the sum of the
    // magnitudes; a missed or doubled element is off by at least 1e-5 of it.
    EXPECT_NEAR(square, square_ref, 1e-12 * square_ref) << "square_sum n=" << n;
    EXPECT_NEAR(total, sum_ref, 1e-12 * abs_sum) << "sum n=" << n;
  }
  EXPECT_EQ(cuda::sum(nullptr, 0), 0.0);
}

// The global gradient norm's pass over many tensors: the per-piece square sums added in
// piece order, the same double arithmetic bit for bit, with one read back (pieces of odd
// sizes, an empty one, one larger than a block's share).
TEST(CudaElementwise, SquareSumManyIsEachPiecesSquareSumAddedInOrder) {
  NDMESH_GPU_OR_SKIP();
  const std::int64_t sizes[] = {1, 1000, 0, 33, 70001, 7};
  std::vector<DeviceBuffer> buffers;
  std::vector<const float*> xs;
  std::vector<std::int64_t> ns;
  double expected = 0;
  for (std::size_t i = 0; i < std::size(sizes); ++i) {
    buffers.push_back(to_device(normal(static_cast<std::size_t>(sizes[i]), 10 + i, 2.0f)));
    xs.push_back(ptr<float>(buffers.back()));
    ns.push_back(sizes[i]);
    expected += cuda::square_sum(xs.back(), sizes[i]);
  }
  EXPECT_EQ(cuda::square_sum_many(xs.data(), ns.data(), static_cast<int>(xs.size())), expected);
  EXPECT_EQ(cuda::square_sum_many(nullptr, nullptr, 0), 0.0);
  std::vector<std::pair<const float*, std::int64_t>> pieces;
  for (std::size_t i = 0; i < xs.size(); ++i) pieces.emplace_back(xs[i], ns[i]);
  EXPECT_EQ(ops::square_sum_many<float>(pieces, Device::kCuda), expected);
}

TEST(CudaElementwise, BFloat16CastsRoundLikeTheHost) {
  NDMESH_GPU_OR_SKIP();
  std::vector<float> x = normal(1031, 4, 100.0f);
  // Ties (round to even both ways), the largest finite, infinities, NaN, a subnormal, -0.
  const std::uint32_t bits[] = {0x3f808000u, 0x3f818000u, 0x7f7fffffu, 0x7f800000u, 0xff800000u,
                                0x7fc00001u, 0x00000123u, 0x80000000u, 0x3f807fffu};
  for (std::uint32_t b : bits) {
    float f;
    std::memcpy(&f, &b, sizeof f);
    x.push_back(f);
  }
  std::vector<BFloat16> ref(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) ref[i] = BFloat16(x[i]);
  DeviceBuffer dx = to_device(x), dh(x.size() * sizeof(BFloat16)), dback(x.size() * sizeof(float));
  const auto n = static_cast<std::int64_t>(x.size());
  cuda::cast(ptr<BFloat16>(dh), ptr<float>(dx), n);
  cuda::cast(ptr<float>(dback), ptr<BFloat16>(dh), n);
  std::vector<std::uint16_t> got_bits(x.size()), ref_bits(x.size());
  const auto got = to_host<BFloat16>(dh, x.size());
  for (std::size_t i = 0; i < x.size(); ++i) got_bits[i] = got[i].bits, ref_bits[i] = ref[i].bits;
  EXPECT_TRUE(same_bits(got_bits, ref_bits)) << "float -> bfloat16";
  std::vector<float> widened(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) widened[i] = static_cast<float>(ref[i]);
  EXPECT_TRUE(same_bits(to_host<float>(dback, x.size()), widened)) << "bfloat16 -> float";
  // A tail after the 16-byte body (n - 3), and a start that is not 16-byte aligned (the
  // scalar path): the same bits, and nothing outside the range written.
  for (const auto& [off, len] : {std::pair<std::int64_t, std::int64_t>{0, n - 3}, {1, n - 1}}) {
    DeviceBuffer h2 = to_device(std::vector<BFloat16>(x.size(), BFloat16(7.0f)));
    DeviceBuffer b2 = to_device(std::vector<float>(x.size(), 7.0f));
    cuda::cast(ptr<BFloat16>(h2) + off, ptr<float>(dx) + off, len);
    cuda::cast(ptr<float>(b2) + off, ptr<BFloat16>(h2) + off, len);
    const auto h = to_host<BFloat16>(h2, x.size());
    const auto b = to_host<float>(b2, x.size());
    for (std::int64_t i = 0; i < n; ++i) {
      const auto k = static_cast<std::size_t>(i);
      const bool in = i >= off && i < off + len;
      EXPECT_EQ(h[k].bits, in ? ref[k].bits : BFloat16(7.0f).bits) << "float -> bfloat16 at " << i << " of " << off << "+" << len;
      if (in) EXPECT_TRUE(same_bits(std::vector<float>{b[k]}, std::vector<float>{widened[k]})) << "bfloat16 -> float at " << i;
      else EXPECT_EQ(b[k], 7.0f) << "written outside the range at " << i;
    }
  }
  // ops::cast (what GradReducer's bf16 buckets use): these kernels on CUDA, BFloat16 on the CPU.
  DeviceBuffer oh(x.size() * sizeof(BFloat16)), oback(x.size() * sizeof(float));
  ops::cast(ptr<BFloat16>(oh), ptr<float>(dx), n, Device::kCuda);
  ops::cast(ptr<float>(oback), ptr<BFloat16>(oh), n, Device::kCuda);
  std::vector<BFloat16> host_h(x.size());
  std::vector<float> host_back(x.size());
  ops::cast(host_h.data(), x.data(), n, Device::kCpu);
  ops::cast(host_back.data(), host_h.data(), n, Device::kCpu);
  const auto ops_got = to_host<BFloat16>(oh, x.size());
  std::vector<std::uint16_t> ops_bits(x.size()), host_bits(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) ops_bits[i] = ops_got[i].bits, host_bits[i] = host_h[i].bits;
  EXPECT_TRUE(same_bits(ops_bits, ref_bits)) << "ops::cast on CUDA, float -> bfloat16";
  EXPECT_TRUE(same_bits(host_bits, ref_bits)) << "ops::cast on the CPU, float -> bfloat16";
  EXPECT_TRUE(same_bits(to_host<float>(oback, x.size()), widened)) << "ops::cast on CUDA, bfloat16 -> float";
  EXPECT_TRUE(same_bits(host_back, widened)) << "ops::cast on the CPU, bfloat16 -> float";
}

// Kernel times (ndmesh train --kernel-times): every operation enqueued between start and stop
// is a row with its calls, the rows add up to the total, a stopped timer times nothing more,
// and a restart forgets what came before.
TEST(CudaElementwise, KernelTimesCountEveryOperationBetweenStartAndStop) {
  NDMESH_GPU_OR_SKIP();
  const std::int64_t n = 1 << 16;
  DeviceBuffer a = to_device(normal(static_cast<std::size_t>(n), 4)), b = to_device(normal(static_cast<std::size_t>(n), 5));
  cuda::fill(ptr<float>(a), 1.0f, n);  // before the start: not counted
  cuda::kernel_times_start();
  for (int i = 0; i < 3; ++i) cuda::fill(ptr<float>(a), 0.5f, n);
  for (int i = 0; i < 2; ++i) cuda::add_inplace(ptr<float>(a), ptr<float>(b), n);
  cuda::scale(ptr<float>(a), 2.0f, n);
  const std::vector<float> back = to_host<float>(a, static_cast<std::size_t>(n));  // a copy and a host wait
  const cuda::KernelTimes t = cuda::kernel_times_stop();
  cuda::fill(ptr<float>(a), 1.0f, n);  // after the stop: not counted
  auto row = [&](const std::string& name) -> const cuda::KernelTime* {
    for (const cuda::KernelTime& r : t.rows)
      if (r.name == name) return &r;
    return nullptr;
  };
  ASSERT_NE(row("fill"), nullptr);
  EXPECT_EQ(row("fill")->calls, 3);
  ASSERT_NE(row("add_inplace"), nullptr);
  EXPECT_EQ(row("add_inplace")->calls, 2);
  ASSERT_NE(row("scale"), nullptr);
  EXPECT_EQ(row("scale")->calls, 1);
  ASSERT_NE(row("copy device to host"), nullptr);
  EXPECT_EQ(row("copy device to host")->calls, 1);
  EXPECT_EQ(t.rows.size(), 4u);
  double sum = 0;
  for (std::size_t i = 0; i < t.rows.size(); ++i) {
    EXPECT_GE(t.rows[i].seconds, 0.0) << t.rows[i].name;
    if (i > 0) {
      EXPECT_GE(t.rows[i - 1].seconds, t.rows[i].seconds) << "rows by time, the longest first";
    }
    sum += t.rows[i].seconds;
  }
  EXPECT_GT(t.seconds, 0.0);
  EXPECT_NEAR(sum, t.seconds, 1e-9 + 1e-9 * t.seconds);
  EXPECT_EQ(t.host_waits, 1) << "copy_to_host waits for the stream once";
  EXPECT_TRUE(cuda::kernel_times_stop().rows.empty()) << "stopped: nothing more is timed";
  cuda::kernel_times_start();
  cuda::scale(ptr<float>(a), 0.5f, n);
  const cuda::KernelTimes again = cuda::kernel_times_stop();
  ASSERT_EQ(again.rows.size(), 1u) << "a restart forgets the earlier rows";
  EXPECT_EQ(again.rows[0].name, "scale");
  EXPECT_EQ(again.rows[0].calls, 1);
}

// cuda::upload through its ring of pinned slots: more uploads than slots, back to back (each
// slot written again while its earlier transfers may still be queued: the slot's event
// orders them), of every size around the slot's 1 MiB (the larger ones copied directly), and
// the host buffer reused at once: each destination holds what was uploaded to it.
TEST(CudaUpload, UploadsThroughThePinnedSlotsArriveIntactWhileTheHostReusesItsBuffer) {
  NDMESH_GPU_OR_SKIP();
  const std::size_t slot = std::size_t{1} << 20;
  const std::vector<std::size_t> sizes = {1, 4, 4096, slot - 4, slot, slot + 4, 3 * slot, 12, 64 * 1024, 7};
  std::vector<DeviceBuffer> dst;
  std::vector<std::vector<unsigned char>> want;
  std::vector<unsigned char> host;  // reused for every upload
  for (int round = 0; round < 3; ++round)
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      host.assign(sizes[k], 0);
      for (std::size_t i = 0; i < host.size(); ++i)
        host[i] = static_cast<unsigned char>((i * 131 + k * 7 + static_cast<std::size_t>(round) * 29) & 0xff);
      dst.emplace_back(sizes[k]);
      cuda::upload(dst.back().data(), host.data(), host.size());
      want.push_back(host);
      std::fill(host.begin(), host.end(), 0xee);  // the caller's buffer, free again at once
    }
  for (std::size_t i = 0; i < dst.size(); ++i) {
    std::vector<unsigned char> got(want[i].size());
    cuda::copy_to_host(got.data(), dst[i].data(), got.size());
    EXPECT_TRUE(got == want[i]) << "upload " << i << " of " << want[i].size() << " bytes";
  }
}

}  // namespace
}  // namespace ndmesh
