// ZeRO's mappable device memory (cuda::alloc_mappable: on a GPU CUDA's virtual memory
// management, in the emulator host pages that fault while given back) and the chunk keeper
// on top of it (DevicePages). Built for the GPU (the GPU check's kernel step runs
// it) and for the emulator.
#include <cstdint>
#include <vector>

#include "gpu_test.hpp"
#include "ndmesh/tensor/device_pages.hpp"

namespace ndmesh {
namespace {

// unmap_pages gives back exactly the chunks wholly inside its range, the allocator's
// statistics follow the backed chunks, map_pages backs them again, and what stayed backed
// keeps its contents through both.
TEST(CudaMappable, ChunksWhollyInsideARangeGoBackAndComeBack) {
  NDMESH_GPU_OR_SKIP();
  const std::size_t g = cuda::map_granularity();
  const std::size_t n = 6 * g / sizeof(float);
  const std::int64_t before = cuda::allocator_stats().allocated_bytes;
  DeviceBuffer b = DeviceBuffer::mappable(6 * g);
  EXPECT_EQ(cuda::allocator_stats().allocated_bytes - before, static_cast<std::int64_t>(6 * g));
  auto* p = static_cast<float*>(b.data());
  ASSERT_EQ(reinterpret_cast<std::uintptr_t>(p) % g, 0u) << "a mappable block starts on a chunk";
  std::vector<float> host(n);
  for (std::size_t i = 0; i < n; ++i) host[i] = static_cast<float>(i);
  cuda::copy_to_device(p, host.data(), n * sizeof(float));
  // [1.5 g, 4.5 g): chunks 2 and 3 lie wholly inside; 1 and 4 only partly.
  const std::size_t quarter = g / sizeof(float) / 2;
  cuda::synchronize();
  cuda::unmap_pages(p + 3 * quarter, 6 * quarter * sizeof(float));
  EXPECT_EQ(cuda::allocator_stats().allocated_bytes - before, static_cast<std::int64_t>(4 * g));
  cuda::map_pages(p, 6 * g);
  EXPECT_EQ(cuda::allocator_stats().allocated_bytes - before, static_cast<std::int64_t>(6 * g));
  std::vector<float> back(n);
  cuda::copy_to_host(back.data(), p, n * sizeof(float));
  const std::size_t chunk = g / sizeof(float);
  for (std::size_t i = 0; i < n; ++i) {
    if (i >= 2 * chunk && i < 4 * chunk) continue;  // given back and backed again: undefined
    ASSERT_EQ(back[i], host[i]) << "element " << i << " of a chunk kept";
  }
  b = DeviceBuffer();
  EXPECT_EQ(cuda::allocator_stats().allocated_bytes, before);
}

// Mappable memory made without backing (a ZeRO model's buffers: only what a rank keeps is
// ever backed) holds no chunk until map_pages backs one; backed_chunks says which are, and a
// DevicePages made over it starts from that (its backed bytes, what drop_unheld gives back).
TEST(CudaMappable, MadeWithoutBackingHoldsNothingUntilMapped) {
  NDMESH_GPU_OR_SKIP();
  const std::size_t g = cuda::map_granularity(), chunk = g / sizeof(float);
  const std::int64_t before = cuda::allocator_stats().allocated_bytes;
  DeviceBuffer b = DeviceBuffer::mappable(6 * g, false);
  EXPECT_EQ(cuda::allocator_stats().allocated_bytes, before);
  auto* p = static_cast<float*>(b.data());
  EXPECT_EQ(cuda::backed_chunks(p, 6 * g), std::vector<bool>(6, false));
  cuda::map_pages(p + chunk, 2 * g);  // chunks 1 and 2
  EXPECT_EQ(cuda::allocator_stats().allocated_bytes - before, static_cast<std::int64_t>(2 * g));
  EXPECT_EQ(cuda::backed_chunks(p, 6 * g), (std::vector<bool>{false, true, true, false, false, false}));
  EXPECT_EQ(cuda::backed_chunks(p + chunk, 2 * g), (std::vector<bool>{true, true}));
  std::vector<float> host(2 * chunk, 3.0f), back(2 * chunk);
  cuda::copy_to_device(p + chunk, host.data(), 2 * g);
  {
    DevicePages pages(p, 6 * g);
    EXPECT_EQ(pages.backed_bytes(), static_cast<std::int64_t>(2 * g));
    EXPECT_FALSE(pages.backed(p));
    EXPECT_TRUE(pages.backed(p + chunk + 5));
    pages.hold(p + 2 * chunk, g);  // chunk 2 stays, chunk 1 goes
    pages.drop_unheld();
    pages.flush();
    EXPECT_EQ(cuda::backed_chunks(p, 6 * g), (std::vector<bool>{false, false, true, false, false, false}));
    cuda::copy_to_host(back.data(), p + 2 * chunk, g);
    EXPECT_EQ(back[0], 3.0f);
    EXPECT_EQ(back[chunk - 1], 3.0f);
    pages.hold(p, g);  // chunk 0 backed for the first time
    EXPECT_EQ(pages.backed_bytes(), static_cast<std::int64_t>(2 * g));
  }
  b = DeviceBuffer();
  EXPECT_EQ(cuda::allocator_stats().allocated_bytes, before);
}

// DevicePages (ZeRO's mappable parameters and gradients): a chunk stays backed while any held
// range touches it, goes once nothing holds it and the stream has passed the drop (poll or
// flush), and a hold before that cancels the give-back, keeping the contents.
TEST(CudaMappable, DevicePagesGiveBackTheChunksNoHeldRangeTouches) {
  NDMESH_GPU_OR_SKIP();
  const std::size_t g = cuda::map_granularity(), chunk = g / sizeof(float);
  const std::int64_t before = cuda::allocator_stats().allocated_bytes;
  const auto backed = [&] {
    return (cuda::allocator_stats().allocated_bytes - before) / static_cast<std::int64_t>(g);
  };
  DeviceBuffer b = DeviceBuffer::mappable(8 * g);
  auto* p = static_cast<float*>(b.data());
  {
    DevicePages pages(p, 8 * g);
    pages.drop_unheld();
    EXPECT_EQ(backed(), 8) << "queued, not given back before a poll";
    pages.flush();
    EXPECT_EQ(backed(), 0);
    EXPECT_EQ(pages.backed_bytes(), 0);
    const std::size_t half = chunk / 2;
    pages.hold(p + chunk + half, 2 * chunk * sizeof(float));  // [1.5, 3.5): chunks 1, 2 and 3
    pages.hold(p + 3 * chunk + half, half * sizeof(float));   // [3.5, 4): chunk 3 again
    EXPECT_EQ(backed(), 3);
    std::vector<float> host(chunk, 7.0f);
    cuda::copy_to_device(p + 3 * chunk, host.data(), chunk * sizeof(float));
    pages.drop(p + chunk + half, 2 * chunk * sizeof(float));
    pages.flush();
    EXPECT_EQ(backed(), 1) << "chunk 3 is still held";
    pages.drop(p + 3 * chunk + half, half * sizeof(float));
    pages.hold(p + 3 * chunk, chunk * sizeof(float));  // before any poll: the give-back is cancelled
    pages.flush();
    EXPECT_EQ(backed(), 1);
    std::vector<float> back(chunk);
    cuda::copy_to_host(back.data(), p + 3 * chunk, chunk * sizeof(float));
    EXPECT_EQ(back, host) << "a cancelled give-back keeps the contents";
    pages.drop(p + 3 * chunk, chunk * sizeof(float));
    pages.flush();
    EXPECT_EQ(backed(), 0);
    EXPECT_EQ(pages.peak_backed_bytes(), static_cast<std::int64_t>(8 * g));
  }
  b = DeviceBuffer();
  EXPECT_EQ(cuda::allocator_stats().allocated_bytes, before);
}

}  // namespace
}  // namespace ndmesh
