// Device memory: host <-> device round trips, zeroing, and the caching allocator (a freed
// block serves the next request of its size class without another cudaMalloc).
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <numeric>
#include <thread>
#include <vector>

#include "gpu_test.hpp"

namespace ndmesh {
namespace {

using testing::to_device;
using testing::to_host;

TEST(DeviceMemory, RoundTripsAndZeroes) {
  NDMESH_GPU_OR_SKIP();
  std::vector<float> host(1001);
  std::iota(host.begin(), host.end(), -500.0f);
  DeviceBuffer a = to_device(host);
  DeviceBuffer b(host.size() * sizeof(float));
  cuda::copy_device(b.data(), a.data(), host.size() * sizeof(float));
  EXPECT_EQ(to_host<float>(b, host.size()), host);
  cuda::memset_zero(b.data(), 10 * sizeof(float));
  const std::vector<float> back = to_host<float>(b, host.size());
  for (int i = 0; i < 10; ++i) EXPECT_EQ(back[static_cast<std::size_t>(i)], 0.0f);
  EXPECT_EQ(back[10], host[10]);
}

TEST(DeviceMemory, TheAllocatorReusesFreedBlocks) {
  NDMESH_GPU_OR_SKIP();
  { DeviceBuffer warm(3 << 20); }
  const cuda::AllocatorStats before = cuda::allocator_stats();
  for (int step = 0; step < 10; ++step) {
    DeviceBuffer x(3 << 20), y(1000);
  }
  const cuda::AllocatorStats after = cuda::allocator_stats();
  // One new small block at most (the 1000-byte class), never one per step.
  EXPECT_LE(after.driver_allocations - before.driver_allocations, 1);
  EXPECT_EQ(after.allocated_bytes, before.allocated_bytes);
  EXPECT_GE(after.peak_allocated_bytes, std::int64_t{3} << 20);
}

// The cross-stream rule on the GPU (tensor/block_cache.hpp): a block that work on another stream
// may still use is not handed out again before that stream has passed its free.
TEST(DeviceMemory, ABlockAnotherStreamUsesWaitsForThatStream) {
  NDMESH_GPU_OR_SKIP();
  cudaStream_t side = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking), cudaSuccess);
  std::atomic<bool> go{false};
  // The side stream is held by a host function until the test lets it go.
  ASSERT_EQ(cudaLaunchHostFunc(
                side,
                [](void* flag) {
                  while (!static_cast<std::atomic<bool>*>(flag)->load())
                    std::this_thread::sleep_for(std::chrono::milliseconds(1));
                },
                &go),
            cudaSuccess);
  void* first = nullptr;
  {
    DeviceBuffer x(12345);
    first = x.data();
    cuda::record_stream(static_cast<char*>(x.data()) + 100, side);  // inside the block
  }
  {
    DeviceBuffer y(12345);
    EXPECT_NE(y.data(), first) << "a block the side stream may still read was handed out";
  }
  go = true;
  ASSERT_EQ(cudaStreamSynchronize(side), cudaSuccess);
  DeviceBuffer a(12345), b(12345);
  EXPECT_TRUE(a.data() == first || b.data() == first) << "the block did not come back once the stream passed";
  cudaStreamDestroy(side);
}

}  // namespace
}  // namespace ndmesh
