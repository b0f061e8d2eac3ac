// The batch source's split of a step's global batch over the live replicas of an elastic
// run: every membership covers the micro-batches once, in replica order, the first
// m mod L replicas one more; in units of pp micro-batches under the interleaved schedule;
// fewer micro-batches (units) than replicas is bad input.
#include <string>

#include <gtest/gtest.h>

#include "ndmesh/core/error.hpp"
#include "ndmesh/parallel/batch_source.hpp"

namespace ndmesh::parallel {
namespace {

TEST(ReplicaShare, EveryMembershipCoversTheBatchOnceInReplicaOrder) {
  for (std::int64_t m : {1, 2, 5, 6, 7, 12, 13})
    for (std::int64_t l = 1; l <= m && l <= 6; ++l) {
      std::int64_t next = 0;
      for (std::int64_t i = 0; i < l; ++i) {
        const ReplicaShare s = replica_share(m, i, l);
        EXPECT_EQ(s.first, next) << "m=" << m << " l=" << l << " i=" << i;
        EXPECT_EQ(s.count, m / l + (i < m % l ? 1 : 0)) << "m=" << m << " l=" << l << " i=" << i;
        next += s.count;
      }
      EXPECT_EQ(next, m) << "m=" << m << " l=" << l;
    }
  // 7 micro-batches over 3 replicas: [0,3) [3,5) [5,7).
  EXPECT_EQ(replica_share(7, 1, 3).first, 3);
  EXPECT_EQ(replica_share(7, 2, 3).first, 5);
}

TEST(ReplicaShare, FewerMicroBatchesThanReplicasIsOneLineNamingTheFlags) {
  try {
    replica_share(2, 0, 3);
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()),
              "[elastic] the global batch has 2 micro-batches per data-parallel rank (--batch / --micro-batch / "
              "--dp), fewer than the 3 live replicas; raise --batch or lower --micro-batch");
  }
}

TEST(ReplicaShare, InUnitsOfAGranuleEveryShareIsAMultipleOfIt) {
  for (std::int64_t g : {2, 3})
    for (std::int64_t units : {1, 2, 3, 5, 6, 7})
      for (std::int64_t l = 1; l <= units && l <= 4; ++l) {
        const std::int64_t m = units * g;
        std::int64_t next = 0;
        for (std::int64_t i = 0; i < l; ++i) {
          const ReplicaShare s = replica_share(m, i, l, g);
          EXPECT_EQ(s.first, next) << "m=" << m << " g=" << g << " l=" << l << " i=" << i;
          EXPECT_EQ(s.count, (units / l + (i < units % l ? 1 : 0)) * g)
              << "m=" << m << " g=" << g << " l=" << l << " i=" << i;
          next += s.count;
        }
        EXPECT_EQ(next, m) << "m=" << m << " g=" << g << " l=" << l;
      }
  // 6 micro-batches of pp 2 over 2 replicas: [0,4) [4,6), not 3 and 3.
  EXPECT_EQ(replica_share(6, 0, 2, 2).count, 4);
  EXPECT_EQ(replica_share(6, 1, 2, 2).first, 4);
  EXPECT_EQ(replica_share(6, 1, 2, 2).count, 2);
}

TEST(ReplicaShare, FewerUnitsThanReplicasIsOneLineNamingTheSchedule) {
  try {
    replica_share(4, 0, 3, 2);
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()),
              "[elastic] the global batch has 4 micro-batches per data-parallel rank (--batch / --micro-batch / "
              "--dp) and the interleaved schedule runs a multiple of pp=2 on each replica: fewer than the 3 live "
              "replicas need (6); raise --batch or lower --micro-batch");
  }
}

}  // namespace
}  // namespace ndmesh::parallel
