// The stage-to-block partition shared by the planner and the pipeline executor: balanced
// splits worked out by hand, explicit partitions, and the errors.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "ndmesh/config/config.hpp"
#include "ndmesh/config/partition.hpp"
#include "ndmesh/core/error.hpp"
#include "support/error_of.hpp"

namespace ndmesh {
namespace {

using testing_support::error_of;

using V = std::vector<std::int64_t>;

TEST(Partition, EvenSplitsStayEven) {
  EXPECT_EQ(balanced_partition(8, 1), V({8}));
  EXPECT_EQ(balanced_partition(8, 2), V({4, 4}));
  EXPECT_EQ(balanced_partition(96, 8), V(8, 12));
  EXPECT_EQ(balanced_partition(4, 4), V({1, 1, 1, 1}));
  // Virtual stages: 2 ranks x 2 chunks of 8 blocks.
  EXPECT_EQ(balanced_partition(8, 2, 2), V({2, 2, 2, 2}));
}

TEST(Partition, RemainderGoesToTheEarlierChunks) {
  // The max is ceil(L/k); blocks come off the later chunks (the last holds the head).
  EXPECT_EQ(balanced_partition(8, 3), V({3, 3, 2}));
  EXPECT_EQ(balanced_partition(24, 5), V({5, 5, 5, 5, 4}));
  EXPECT_EQ(balanced_partition(10, 4), V({3, 3, 2, 2}));
  EXPECT_EQ(balanced_partition(7, 2, 2), V({2, 2, 2, 1}));
}

TEST(Partition, EndCostsMoveBlocksOff) {
  // A head costing 2 blocks, 12 blocks over 3 stages: 4,4,4 costs 4,4,6; at max cost 5 the
  // chunks can take 5, 5 and 3 blocks, one too many, taken off the last: 5,5,2 (5, 5, 4).
  EXPECT_EQ(balanced_partition(12, 3, 1, {.embedding = 0, .head = 2}), V({5, 5, 2}));
  EXPECT_DOUBLE_EQ(max_chunk_cost(V({5, 5, 2}), {.embedding = 0, .head = 2}), 5);
  // Embedding 1 and head 1 over 10 blocks and 3 stages: total cost 12, so 4 each: 3,4,3.
  EXPECT_EQ(balanced_partition(10, 3, 1, {.embedding = 1, .head = 1}), V({3, 4, 3}));
  // A fractional head (0.5): 8 blocks over 2 stages, 4,4 costs 4.5, 5,3 costs 5: keep 4,4.
  EXPECT_EQ(balanced_partition(8, 2, 1, {.embedding = 0, .head = 0.5}), V({4, 4}));
  // A huge head still leaves the last chunk one block.
  EXPECT_EQ(balanced_partition(6, 3, 1, {.embedding = 0, .head = 10}), V({3, 2, 1}));
}

TEST(Partition, RanksSumTheirVirtualChunks) {
  // chunk k on rank k mod p: ranks 0 and 1 of p = 2 hold chunks {0, 2} and {1, 3}.
  EXPECT_EQ(blocks_per_rank(V({2, 2, 2, 1}), 2), V({4, 3}));
  EXPECT_EQ(blocks_per_rank(V({3, 3, 2}), 3), V({3, 3, 2}));
}

TEST(Partition, TooFewLayersIsAClearError) {
  const std::string e = error_of([] { balanced_partition(3, 2, 2); });
  EXPECT_NE(e.find("layers=3"), std::string::npos) << e;
  EXPECT_NE(e.find("2*2 = 4"), std::string::npos) << e;
}

TEST(Partition, ParseExplicit) {
  EXPECT_EQ(parse_partition("3,3,2", 8, 3), V({3, 3, 2}));
  EXPECT_EQ(parse_partition(" 1, 7 ", 8, 2), V({1, 7}));
  EXPECT_EQ(parse_partition("2,2,2,2", 8, 2, 2), V({2, 2, 2, 2}));
}

TEST(Partition, ParseErrorsNameTheFlagAndTheFix) {
  std::string e = error_of([] { parse_partition("3,3", 8, 3); });
  EXPECT_NE(e.find("--pp-layers '3,3' has 2 entries"), std::string::npos) << e;
  EXPECT_NE(e.find("3 chunks"), std::string::npos) << e;
  e = error_of([] { parse_partition("3,3,3", 8, 3); });
  EXPECT_NE(e.find("adds up to 9"), std::string::npos) << e;
  EXPECT_NE(e.find("layers=8"), std::string::npos) << e;
  e = error_of([] { parse_partition("4,4,0", 8, 3); });
  EXPECT_NE(e.find("entry 3 is 0"), std::string::npos) << e;
  e = error_of([] { parse_partition("4,x,4", 8, 3); });
  EXPECT_NE(e.find("'x' is not a block count"), std::string::npos) << e;
  e = error_of([] { parse_partition("4,,4", 8, 3); });
  EXPECT_NE(e.find("'' is not a block count"), std::string::npos) << e;
}

TEST(Partition, ValidationAcceptsUnevenStages) {
  ParallelConfig c;
  c.dims = {{"dp", 1}, {"pp", 3}, {"cp", 1}, {"tp", 1}};
  c.global_batch = 3;
  ModelSpec m{.layers = 8, .hidden = 64, .heads = 4, .seq = 64, .vocab = 32};
  // 8 layers on 3 stages run as 3,3,2 (what the pipeline executor runs).
  EXPECT_TRUE(problems(c, &m).empty());
  // uneven_stages = false asks for an even split.
  c.uneven_stages = false;
  auto probs = problems(c, &m);
  ASSERT_EQ(probs.size(), 1u);
  EXPECT_NE(probs[0].find("layers=8 is not divisible by pp=3"), std::string::npos) << probs[0];
  c.uneven_stages = true;
  m.layers = 2;
  probs = problems(c, &m);
  ASSERT_EQ(probs.size(), 1u);
  EXPECT_NE(probs[0].find("--layers=2 over --pp=3 x --vpp=1"), std::string::npos) << probs[0];
}

}  // namespace
}  // namespace ndmesh
