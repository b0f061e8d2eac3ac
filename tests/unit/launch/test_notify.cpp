// telling_report: which of the ranks' timeout lines `ndmesh launch` prints. The lines are
// the ones a link-down fault between two nodes produced (tests/multinode/faults.sh, in
// the order the launcher received them in a CI run).
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "ndmesh/launch/notify.hpp"

namespace ndmesh {
namespace {

const std::string kWithinNode = "[rank 0] [comm] all_reduce on group tp (ranks 0,1) timed out after 5 s";
const std::string kAcrossNodes =
    "[rank 1] [comm] all_reduce on group world (ranks 0,1,2,3) timed out after 5 s; the group spans nodes "
    "node0,node1";
const std::string kAcrossManyNodes =
    "[rank 3] [comm] all_reduce on group dp (ranks 3,11,19,...,123 (16 ranks)) timed out after 5 s; "
    "the group spans 16 nodes (node0,node1,...,node15)";

TEST(TellingReport, PrefersTheLineNamingAGroupAcrossNodes) {
  EXPECT_EQ(telling_report({kWithinNode, kAcrossNodes}), kAcrossNodes);
  EXPECT_EQ(telling_report({kWithinNode, kAcrossManyNodes, kWithinNode}), kAcrossManyNodes);
}

TEST(TellingReport, OfSeveralAcrossNodesTheFirst) {
  EXPECT_EQ(telling_report({kAcrossNodes, kAcrossManyNodes}), kAcrossNodes);
  EXPECT_EQ(telling_report({kWithinNode, kAcrossManyNodes, kAcrossNodes}), kAcrossManyNodes);
}

TEST(TellingReport, OtherwiseTheFirstLine) {
  const std::string other = "[rank 1] [comm] barrier on group tp (ranks 0,1) timed out after 5 s";
  EXPECT_EQ(telling_report({kWithinNode, other}), kWithinNode);
  EXPECT_EQ(telling_report({"[pp] stage 1 failed"}), "[pp] stage 1 failed");
  EXPECT_EQ(telling_report({}), "");
}

}  // namespace
}  // namespace ndmesh
