// LaunchEnv under a real mpirun: the launcher's answer matches the engine's, and the
// values mpirun leaves out come from the engine's shared-memory split.
#include <gtest/gtest.h>

#include "ndmesh/comm/communicator.hpp"
#include "ndmesh/launch/launch_env.hpp"

namespace ndmesh::comm {
namespace {

TEST(LaunchUnderMpirun, DetectMatchesTheEngine) {
  Communicator world = Communicator::world();
  LaunchEnv env = LaunchEnv::detect();
  EXPECT_EQ(env.launcher, Launcher::kOpenMpi);
  EXPECT_EQ(env.rank, world.rank());
  EXPECT_EQ(env.world_size, world.size());
  EXPECT_TRUE(env.has_mpi_world());
}

TEST(LaunchUnderMpirun, ResolvedLocalValuesOnOneNode) {
  Communicator world = Communicator::world();
  LaunchEnv env = resolve_launch_env(world);
  // mpirun on this machine puts every rank on one node.
  EXPECT_EQ(env.node_rank, 0);
  EXPECT_EQ(env.local_rank, world.rank());
  EXPECT_EQ(env.local_world_size, world.size());
  Communicator node = world.split_node();
  EXPECT_EQ(node.size(), world.size());
  EXPECT_EQ(node.rank(), world.rank());
}

}  // namespace
}  // namespace ndmesh::comm
