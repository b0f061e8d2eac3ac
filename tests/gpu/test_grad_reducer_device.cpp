// parallel::GradReducer with bf16 gradient communication (--grad-dtype bf16) on device
// buffers (--device cuda): each bucket rounded into a bf16 device buffer (ops::cast, the
// to_bf16 kernel), the collective on that buffer over the device communicator, the result
// widened back into the fp32 gradients (ops::cast, from_bf16), on in-process dp groups of 2
// and 3 ranks, directly and through the staged communicator (NDMESH_BACKEND=gloo|mpi on
// GPUs), against the same reducer on host buffers over the same group: bit for bit, since the
// kernels round as ndmesh::BFloat16 does and the sums are the CPU backend's in both runs (an
// NCCL sum differs from MPI's only in its order, as in fp32). ZeRO 0, 1 and 2 (its bucket_mb
// buckets, the GPU's path), overlap on and off, micro-batches. The staged communicator here
// stages only the emulator's device blocks, and counts them: every reduced byte must have been
// a device buffer's (the host-rounding reducer handed host copies to the communicator). The
// in-process communicator copies with memcpy, so this runs in the emulator only
// (gpu_emulated.*).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "emulated_staging.hpp"
#include "gpu_test.hpp"
#include "ndmesh/comm/inproc.hpp"
#include "ndmesh/comm/staged.hpp"
#include "ndmesh/parallel/dp/grad_reducer.hpp"
#include "ndmesh/tensor/ops.hpp"

namespace ndmesh {
namespace {

using namespace testing;  // gpu_test.hpp
using parallel::DataParallelOptions;
using parallel::GradReducer;

// The staging memory of an emulated GPU that stages the emulator's device blocks only (host
// buffers go to the CPU backend as they are) and counts the bytes it copied off the device.
class CountingStaging final : public comm::StagingMemory {
 public:
  bool is_device(const void* p) const override {
#ifdef NDMESH_CUDA_EMULATED
    return cuda::emulator::is_device(p);
#else
    return p != nullptr;  // not reached: on a GPU the test skips
#endif
  }
  void copy(void* dst, const void* src, std::size_t bytes) override {
    if (bytes == 0) return;
    if (is_device(src)) from_device_ += static_cast<std::int64_t>(bytes);
    // As the staged communicator's copy on a GPU: after the work queued on the stream.
    if (is_device(src) || is_device(dst)) cuda::synchronize();
    std::memcpy(dst, src, bytes);
  }
  std::shared_ptr<char> host_buffer(std::size_t bytes) override {
    return std::shared_ptr<char>(new char[bytes == 0 ? 1 : bytes], std::default_delete<char[]>());
  }
  std::int64_t from_device() const { return from_device_.load(); }

 private:
  std::atomic<std::int64_t> from_device_{0};
};

struct Case {
  std::string name;
  int micro = 1;
  DataParallelOptions options;
};

constexpr std::int64_t kFlat = 606;   // a multiple of 2 and 3 (ZeRO's blocks), 7 buckets of 96 and one of 30
constexpr std::int64_t kStride = 37;  // the grads-final watermark's steps: not the buckets' edges

// Rank r's gradient of micro-batch m: normal values with a wide spread of magnitudes, so that
// the bf16 rounding of the terms and of the partial sums shows.
std::vector<float> local_grads(int r, int m) {
  auto g = normal(static_cast<std::size_t>(kFlat), 1000 + 10 * static_cast<std::uint64_t>(r) + m);
  for (std::size_t i = 0; i < g.size(); ++i) g[i] *= std::ldexp(1.0f, static_cast<int>(i % 9) - 4);
  return g;
}

// What one rank's reducer leaves: the reduced gradients this rank owns, in flat order (the
// others zero), and the bytes it handed to the collectives.
struct Reduced {
  std::vector<float> owned;
  std::vector<char> mine;  // 1 where this rank owns the element
  std::int64_t bytes = 0;
};

void fetch(float* dst, const float* src, std::int64_t n, Device device) {
  if (device == Device::kCuda)
    cuda::copy_to_host(dst, src, static_cast<std::size_t>(n) * sizeof(float));
  else
    std::copy_n(src, n, dst);
}

// A backward as the model drives the reducer: every micro-batch adds its gradients from the
// end of the buffer in steps, announcing each watermark (grads_final) and polling (progress),
// then finish_backward. The buffers live on `device`; the arithmetic is the reducer's.
Reduced reduce(const comm::Communicator& group, const Case& c, Device device) {
  GradReducer reducer(group, kFlat, c.options, {}, device);
  Tensor<float> grads({kFlat}, device), g({kFlat}, device);
  reducer.zero_shard_grads();
  for (int m = 0; m < c.micro; ++m) {
    const auto host = local_grads(group.rank(), m);
    if (device == Device::kCuda)
      cuda::copy_to_device(g.data(), host.data(), host.size() * sizeof(float));
    else
      std::copy(host.begin(), host.end(), g.data());
    reducer.begin_backward(grads.data(), m + 1 == c.micro);
    for (std::int64_t hi = kFlat; hi > 0;) {
      const std::int64_t lo = std::max<std::int64_t>(0, hi - kStride);
      ops::add(grads.data() + lo, g.data() + lo, hi - lo, device);
      reducer.grads_final(lo);
      reducer.progress();
      hi = lo;
    }
    reducer.finish_backward();
  }
  Reduced out{.owned = std::vector<float>(kFlat, 0.0f),
              .mine = std::vector<char>(kFlat, 0),
              .bytes = reducer.reduced_bytes()};
  reducer.for_each_owned(grads.data(), 0, kFlat, [&](const float* x, std::int64_t n, std::int64_t at) {
    fetch(out.owned.data() + at, x, n, device);
    std::fill_n(out.mine.begin() + at, n, 1);
  });
  return out;
}

// The fp32 sum over ranks and micro-batches, in double, and the sum of magnitudes (the bound).
void exact(int p, int micro, std::vector<double>& sum, std::vector<double>& abs_sum) {
  sum.assign(kFlat, 0.0);
  abs_sum.assign(kFlat, 0.0);
  for (int r = 0; r < p; ++r)
    for (int m = 0; m < micro; ++m) {
      const auto g = local_grads(r, m);
      for (std::size_t i = 0; i < g.size(); ++i) sum[i] += g[i], abs_sum[i] += std::fabs(g[i]);
    }
}

void check_case(const comm::Communicator& group, const Case& c, bool staged_bytes_counted,
                const std::function<std::int64_t()>& staged_bytes) {
  const int p = group.size(), r = group.rank();
  const std::int64_t before = staged_bytes();
  const Reduced host = reduce(group, c, Device::kCpu);
  const std::int64_t after_host = staged_bytes();
  const Reduced dev = reduce(group, c, Device::kCuda);
  const std::int64_t after_dev = staged_bytes();
  const std::string what = fmt::format("{}, dp {}, rank {}", c.name, p, r);

  // Bit for bit the host reducer's elements.
  std::int64_t differ = 0, first = -1;
  for (std::int64_t i = 0; i < kFlat; ++i)
    if (std::memcmp(&dev.owned[static_cast<std::size_t>(i)], &host.owned[static_cast<std::size_t>(i)],
                    sizeof(float)) != 0 &&
        differ++ == 0)
      first = i;
  EXPECT_EQ(dev.mine, host.mine) << what;
  EXPECT_EQ(differ, 0) << what << ": " << differ << " elements differ from the host reducer's, the first "
                       << first << ": " << (first >= 0 ? dev.owned[static_cast<std::size_t>(first)] : 0.0f)
                       << " vs " << (first >= 0 ? host.owned[static_cast<std::size_t>(first)] : 0.0f);

  // bf16 on the wire: 2 bytes an element, every micro-batch under ZeRO 2 (it reduces each).
  const std::int64_t reductions = c.options.zero >= 2 ? c.micro : 1;
  EXPECT_EQ(dev.bytes, 2 * kFlat * reductions) << what;
  EXPECT_EQ(host.bytes, dev.bytes) << what;
  if (staged_bytes_counted) {  // the device run's collectives read device buffers, the host run's none
    EXPECT_EQ(after_host - before, 0) << what << ": the host run staged device memory";
    EXPECT_EQ(after_dev - after_host, dev.bytes) << what << ": the bf16 buckets were not device buffers";
  }

  // And it is a bf16 reduction of the right sums: within (p+1) u sum |g| of the exact sum
  // (u = 2^-8: each term rounded once, each partial sum once more; test_grad_reducer.cpp's
  // bound), and not the fp32 sum (some elements off by more than fp32 rounding).
  std::vector<double> sum, abs_sum;
  exact(p, c.micro, sum, abs_sum);
  const double u = std::ldexp(1.0, -8);
  std::int64_t owned = 0, rounded = 0, outside = 0;
  for (std::int64_t i = 0; i < kFlat; ++i) {
    const auto k = static_cast<std::size_t>(i);
    if (host.mine[k] == 0) continue;  // another rank's block (ZeRO)
    ++owned;
    const double err = std::fabs(host.owned[k] - sum[k]);
    if (err > (p * c.micro + 1) * u * abs_sum[k]) ++outside;
    if (err > 1e-5 * std::fabs(sum[k]) + 1e-30) ++rounded;
  }
  EXPECT_GE(owned, kFlat / p) << what;
  EXPECT_EQ(outside, 0) << what << ": elements off the exact sum by more than the bf16 bound";
  EXPECT_GT(rounded, owned / 4) << what << ": the reduction looks like fp32's, not bf16's";
}

const Case kCases[] = {
    {"ZeRO 0, micro-batches", 2, {.bucket_mb = 96 * 4 / 1048576.0, .bf16 = true}},
    {"ZeRO 0, no overlap",
     1,
     {.bucket_mb = 96 * 4 / 1048576.0, .overlap = false, .progress_thread = false, .bf16 = true}},
    {"ZeRO 0, no progress thread",
     1,
     {.bucket_mb = 96 * 4 / 1048576.0, .progress_thread = false, .bf16 = true}},
    {"ZeRO 1, micro-batches", 2, {.bucket_mb = 96 * 4 / 1048576.0, .zero = 1, .bf16 = true}},
    {"ZeRO 2 in buckets, micro-batches", 3, {.bucket_mb = 96 * 4 / 1048576.0, .zero = 2, .bf16 = true}},
};

TEST(CudaGradReducerBf16, EqualsTheHostReducerBitForBit) {
  NDMESH_GPU_OR_SKIP();
#ifndef NDMESH_CUDA_EMULATED
  GTEST_SKIP() << "in-process ranks exchange host memory: emulator only";
#endif
  for (bool staged : {false, true}) {
    const DirectDeviceExchange direct(!staged);
    for (int n : {2, 3})
      for (const Case& c : kCases)
        comm::inproc::run(n, [&](const comm::Communicator& world) {
          if (!staged) return check_case(world, c, false, [] { return std::int64_t{0}; });
          auto memory = std::make_shared<CountingStaging>();
          check_case(comm::staged(world, memory), c, true, [&] { return memory->from_device(); });
        });
  }
}

}  // namespace
}  // namespace ndmesh
