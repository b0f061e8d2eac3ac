// The batch source's split of a step's global batch over the live replicas of an elastic
// run: every membership covers the micro-batches once, in replica order, the first
// m mod L replicas one more; fewer micro-batches than replicas is bad input.
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

}  // namespace
}  // namespace ndmesh::parallel
