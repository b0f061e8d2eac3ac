// Message matching that cannot collide (comm/tags.hpp), on in-process jobs:
//  - asymmetric use: ranks that run more all-reduces on one group than their peers still
//    agree with them on every other group (the tag sequence is per communicator; a
//    process-wide one made these ranks wait for tags their peers never send);
//  - a subsystem on a communicator shared with other traffic (ProcessGroups gives group
//    kinds with the same members one communicator) is not disturbed by a foreign message
//    of its own tag in flight there: it sends on its own duplicate.
// The ring attention and pipeline executor versions of the second test are with their
// component tests (tests/unit/parallel).
#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

#include "ndmesh/comm/allreduce.hpp"
#include "ndmesh/comm/inproc.hpp"
#include "ndmesh/comm/process_groups.hpp"
#include "ndmesh/comm/tags.hpp"

namespace ndmesh::comm {
namespace {

// Rank r's element i: small integers, so every sum is exact.
std::int64_t value(std::int64_t r, std::size_t i) { return (r * 5 + static_cast<std::int64_t>(i)) % 9 - 4; }

std::int64_t sum_over(const std::vector<std::int64_t>& ranks, std::size_t i) {
  std::int64_t s = 0;
  for (std::int64_t r : ranks) s += value(r, i);
  return s;
}

TEST(TagDiscipline, AGroupUsedMoreOftenOnSomeRanksDoesNotShiftAnother) {
  for (auto algorithm : {AllReduceAlgorithm::kRing, AllReduceAlgorithm::kTree}) {
    inproc::run(4,
                [&](const Communicator& world) {
                  const int r = world.rank();
                  // Group A: {0,1} and {2,3}; group B: the world. Ranks 0 and 1 run three all-reduces
                  // on A, ranks 2 and 3 one; then everyone runs two on B, one of them while A is busy.
                  Communicator a = world.split(r / 2, r, "a");
                  AllReducer on_a(a, {.algorithm = algorithm}), on_b(world, {.algorithm = algorithm});
                  const int rounds = r < 2 ? 3 : 1;
                  std::vector<std::int64_t> x(37);
                  for (int k = 0; k < rounds; ++k) {
                    for (std::size_t i = 0; i < x.size(); ++i) x[i] = value(r, i);
                    on_a.all_reduce(std::span<std::int64_t>(x));
                    for (std::size_t i = 0; i < x.size(); ++i)
                      ASSERT_EQ(x[i], sum_over(a.members(), i)) << "group a";
                  }
                  std::vector<std::int64_t> y(101), z(5);
                  for (std::size_t i = 0; i < y.size(); ++i) y[i] = value(r, i);
                  for (std::size_t i = 0; i < z.size(); ++i) z[i] = value(r, i);
                  for (std::size_t i = 0; i < x.size(); ++i) x[i] = value(r, i);
                  PendingAllReduce busy = on_a.start(std::span<std::int64_t>(x));
                  PendingAllReduce first = on_b.start(std::span<std::int64_t>(y));
                  PendingAllReduce second = on_b.start(std::span<std::int64_t>(z));
                  second.wait();
                  first.wait();
                  busy.wait();
                  for (std::size_t i = 0; i < y.size(); ++i)
                    ASSERT_EQ(y[i], sum_over(world.members(), i)) << "group b";
                  for (std::size_t i = 0; i < z.size(); ++i)
                    ASSERT_EQ(z[i], sum_over(world.members(), i)) << "group b";
                  for (std::size_t i = 0; i < x.size(); ++i)
                    ASSERT_EQ(x[i], sum_over(a.members(), i)) << "group a";
                },
                {.timeout_s = 5});
  }
}

TEST(TagDiscipline, AForeignMessageOfTheAllReduceTagOnASharedGroupIsNotTaken) {
  // dp and dp-cp are one communicator when cp = 1. A message with the all-reduce's first
  // tag travels on it, sent before the all-reduce starts and received after it ends: the
  // all-reduce (on its own duplicate) neither takes it nor is disturbed.
  inproc::run(2, [](const Communicator& world) {
    ProcessGroups groups(Mesh::parse("dp=2,cp=1"), world);
    const Communicator& dp = groups.dp();
    const Communicator& dp_cp = groups.cp_dp();
    ASSERT_EQ(dp.members(), dp_cp.members());
    const int r = world.rank(), peer = 1 - r;
    std::vector<std::int64_t> foreign(13, 1000 + r), got(13, -1);
    Work sent = dp.send_async(std::span<const std::int64_t>(foreign), peer, {.tag = tags::kAllReduceFirst});
    AllReducer reducer(dp_cp, {.algorithm = AllReduceAlgorithm::kRing});
    std::vector<std::int64_t> x(13);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = value(r, i);
    reducer.all_reduce(std::span<std::int64_t>(x));
    dp.recv(std::span<std::int64_t>(got), peer, {.tag = tags::kAllReduceFirst});
    sent.wait();
    for (std::size_t i = 0; i < x.size(); ++i) EXPECT_EQ(x[i], value(0, i) + value(1, i));
    EXPECT_EQ(got, std::vector<std::int64_t>(13, 1000 + peer));
  });
}

}  // namespace
}  // namespace ndmesh::comm
