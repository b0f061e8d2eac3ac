// The device allocator's cross-stream rule (tensor/block_cache.hpp) on a fake stream: a
// block that a communication stream used is not handed out again before that stream has
// passed the point where the block was given back.
#include "ndmesh/tensor/block_cache.hpp"

#include <gtest/gtest.h>

#include "support/fake_streams.hpp"

namespace ndmesh {
namespace {

using testing::FakeStreams;

char g_blocks[4][512];

TEST(BlockCache, ABlockUsedOnlyOnTheComputeStreamIsReusedAtOnce) {
  FakeStreams fake;
  void* compute = fake.stream();
  BlockCache cache(&fake, compute);
  EXPECT_EQ(cache.take(512), nullptr);
  cache.note_use(g_blocks[0], compute);  // the home stream: no rule needed
  cache.give(g_blocks[0], 512);
  EXPECT_EQ(cache.pending(), 0u);
  EXPECT_EQ(cache.take(512), g_blocks[0]);
  EXPECT_EQ(cache.take(512), nullptr);
}

TEST(BlockCache, ABlockACollectiveMayStillReadWaitsForItsStream) {
  FakeStreams fake;
  void* compute = fake.stream();
  void* comm = fake.stream();
  BlockCache cache(&fake, compute);
  // The gradient bucket is all-reduced on the communication stream, which is slow.
  int reads = 0;
  fake.launch(comm, [&] { ++reads; });
  cache.note_use(g_blocks[1], comm);
  cache.give(g_blocks[1], 512);  // freed while the collective is still queued
  EXPECT_EQ(cache.pending(), 1u);
  // The hazard: handing the block to the next kernel now would let it overwrite the bucket.
  EXPECT_EQ(cache.take(512), nullptr);
  EXPECT_EQ(cache.drain().size(), 0u);  // a cache release keeps it too
  fake.run(comm);
  EXPECT_EQ(reads, 1);
  EXPECT_EQ(cache.take(512), g_blocks[1]);
  EXPECT_EQ(cache.pending(), 0u);
  EXPECT_EQ(fake.live_events(), 0);
  // Its use was forgotten with the give: given back again, it is free at once.
  cache.give(g_blocks[1], 512);
  EXPECT_EQ(cache.take(512), g_blocks[1]);
}

TEST(BlockCache, EveryStreamThatUsedTheBlockMustPass) {
  FakeStreams fake;
  void* compute = fake.stream();
  void* tp = fake.stream();
  void* dp = fake.stream();
  BlockCache cache(&fake, compute);
  cache.note_use(g_blocks[2], tp);
  cache.note_use(g_blocks[2], dp);
  cache.note_use(g_blocks[2], dp);
  fake.launch(dp, [] {});
  cache.give(g_blocks[2], 1024);
  fake.run(tp);
  EXPECT_EQ(cache.take(1024), nullptr);
  fake.run(dp);
  EXPECT_EQ(cache.take(1024), g_blocks[2]);
}

TEST(BlockCache, OtherSizesAndBlocksAreServedMeanwhile) {
  FakeStreams fake;
  void* compute = fake.stream();
  void* comm = fake.stream();
  BlockCache cache(&fake, compute);
  fake.launch(comm, [] {});
  cache.note_use(g_blocks[3], comm);
  cache.give(g_blocks[3], 512);
  cache.give(g_blocks[0], 512);
  EXPECT_EQ(cache.take(512), g_blocks[0]);
  EXPECT_EQ(cache.take(512), nullptr);
  auto drained = cache.drain();
  EXPECT_TRUE(drained.empty());
}

}  // namespace
}  // namespace ndmesh
