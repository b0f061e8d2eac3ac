// Communicator and ProcessGroups in a single process (an MPI world of one, no launcher),
// and the launcher checks Communicator::world() makes before starting the engine. Each
// test runs in its own process (gtest_discover_tests), so world() starts fresh in each.
#include <cstdlib>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "ndmesh/comm/communicator.hpp"
#include "ndmesh/comm/process_groups.hpp"
#include "ndmesh/core/error.hpp"

namespace ndmesh::comm {
namespace {

// RANK and WORLD_SIZE without MASTER_ADDR: no store to meet at, refused before any engine starts.
TEST(CommunicatorSingle, TorchrunWithoutAStoreIsRefusedBeforeTheEngineStarts) {
  setenv("RANK", "0", 1);
  setenv("WORLD_SIZE", "2", 1);
  try {
    Communicator::world();
    FAIL() << "torchrun variables must be refused";
  } catch (const ConfigError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("RANK=0 and WORLD_SIZE=2 are set (as by torchrun) but MASTER_ADDR is not"), std::string::npos)
        << msg;
    EXPECT_NE(msg.find("mpirun -np 2"), std::string::npos) << msg;
  }
  unsetenv("RANK");
  unsetenv("WORLD_SIZE");
}

TEST(CommunicatorSingle, ALauncherWorldTheEngineDoesNotSeeIsAnError) {
  // As if started by srun without --mpi=pmix: refused before MPI_Init, naming the fix.
  setenv("SLURM_PROCID", "2", 1);
  setenv("SLURM_NTASKS", "4", 1);
  try {
    Communicator::world();
    FAIL() << "srun without PMIx must be refused";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("without PMIx"), std::string::npos) << e.what();
  }
  // With a PMI to use (PMI-2's PMI_FD) that MPI still starts as a singleton: Slurm says 4
  // ranks, MPI has 1.
  setenv("PMI_FD", "999", 1);
  try {
    Communicator::world();
    FAIL() << "a launcher world of 4 with an engine world of 1 must be refused";
  } catch (const ConfigError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("the launcher says rank 2 of 4 (SLURM_PROCID=2 SLURM_NTASKS=4) but the mpi world has "
                       "rank 0 of 1"),
              std::string::npos)
        << msg;
  }
  unsetenv("SLURM_PROCID");
  unsetenv("SLURM_NTASKS");
  unsetenv("PMI_FD");
}

// Every operation of a world of one, on whichever backend world() chose.
void collectives_on_a_world_of_one() {
  Communicator world = Communicator::world();
  ASSERT_EQ(world.size(), 1);
  EXPECT_EQ(world.rank(), 0);
  std::vector<double> v = {2, 4};
  world.all_reduce(std::span<double>(v), {.op = ReduceOp::kAvg});
  EXPECT_EQ(v, (std::vector<double>{2, 4}));
  std::vector<std::int32_t> in = {7, 8}, out(2);
  world.all_gather(std::span<const std::int32_t>(in), std::span<std::int32_t>(out));
  EXPECT_EQ(out, in);
  world.reduce_scatter(std::span<const std::int32_t>(in), std::span<std::int32_t>(out));
  EXPECT_EQ(out, in);
  world.all_to_all(std::span<const std::int32_t>(in), std::span<std::int32_t>(out), {.timeout_s = 5});
  EXPECT_EQ(out, in);
  // A message to oneself: async send, blocking recv.
  std::vector<std::int64_t> msg = {1, 2, 3}, got(3);
  Work w = world.send_async(std::span<const std::int64_t>(msg), 0, {.tag = 3});
  world.recv(std::span<std::int64_t>(got), 0, {.tag = 3});
  w.wait();
  EXPECT_EQ(got, msg);
  EXPECT_EQ(world.split(std::nullopt, 0).valid(), false);
  Communicator self = world.split(5, 0, "self");
  EXPECT_EQ(self.size(), 1);
  EXPECT_EQ(self.name(), "self");
  EXPECT_EQ(self.members(), (std::vector<std::int64_t>{0}));
}

// A process that nothing launched is alone: the "self" world, no engine started (no
// MPI_Init: as an MPI singleton a serial run paid 0.3 s of Open MPI's start-up).
TEST(CommunicatorSingle, CollectivesOnAWorldOfOne) {
  unsetenv("NDMESH_BACKEND");
  EXPECT_EQ(Communicator::world().backend(), "self");
  collectives_on_a_world_of_one();
}

// NDMESH_BACKEND=mpi without a launcher: the same operations on an MPI singleton.
TEST(CommunicatorSingle, CollectivesOnAnMpiSingleton) {
  setenv("NDMESH_BACKEND", "mpi", 1);
  EXPECT_EQ(Communicator::world().backend(), "mpi");
  collectives_on_a_world_of_one();
  unsetenv("NDMESH_BACKEND");
}

// A wait that nothing can complete on the self world ends with the line naming the
// operation and the group, never a hang.
TEST(CommunicatorSingle, AReceiveNothingSendsTimesOutOnTheSelfWorld) {
  unsetenv("NDMESH_BACKEND");
  Communicator world = Communicator::world();
  ASSERT_EQ(world.backend(), "self");
  std::vector<float> got(3);
  try {
    world.recv(std::span<float>(got), 0, {.timeout_s = 0.2, .tag = 9});
    ADD_FAILURE() << "a receive without a send must time out";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("on group world"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("timed out after 0.2 s"), std::string::npos) << e.what();
  }
}

// NDMESH_BACKEND=self names a process alone: under a launcher it is refused in one line.
TEST(CommunicatorSingle, TheSelfBackendUnderALauncherIsRefused) {
  setenv("OMPI_COMM_WORLD_RANK", "1", 1);
  setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
  setenv("NDMESH_BACKEND", "self", 1);
  try {
    Communicator::world();
    FAIL() << "NDMESH_BACKEND=self under mpirun must be refused";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("NDMESH_BACKEND=self is a process alone, but this one was started by "
                                         "openmpi (OMPI_COMM_WORLD_RANK=1 OMPI_COMM_WORLD_SIZE=2)"),
              std::string::npos)
        << e.what();
  }
  unsetenv("OMPI_COMM_WORLD_RANK");
  unsetenv("OMPI_COMM_WORLD_SIZE");
  unsetenv("NDMESH_BACKEND");
}

TEST(CommunicatorSingle, ReceivingFewerElementsThanSentIsAnError) {
  Communicator world = Communicator::world();
  std::vector<float> msg(5, 1.0f), got(7);
  Work w = world.send_async(std::span<const float>(msg), 0);
  try {
    world.recv(std::span<float>(got), 0);
    ADD_FAILURE() << "a 5-element message into a 7-element recv must be refused";
  } catch (const Error& e) {
    // MPI's line says "7 elements ... held 5", the self world's "7 float32 elements ... 5 float32".
    const std::string line = e.what();
    EXPECT_NE(line.find("expected 7 "), std::string::npos) << line;
    EXPECT_NE(line.find("held 5"), std::string::npos) << line;
  }
  w.wait();
}

TEST(CommunicatorSingle, ProcessGroupsOfAOneRankMesh) {
  Communicator world = Communicator::world();
  ProcessGroups pg(Mesh({{"dp", 1}, {"pp", 1}, {"cp", 1}, {"tp", 1}}), world);
  EXPECT_EQ(pg.tp().size(), 1);
  EXPECT_EQ(pg.tp().name(), "tp");
  EXPECT_EQ(pg.cp_dp().size(), 1);
  EXPECT_EQ(pg.splits(), 0);  // every kind is the whole (one-rank) world
  EXPECT_EQ(pg.to_string(), "TP(1)-CP(1)-PP(1)-DP(1)-Rank(0)");
  EXPECT_EQ(pg.config_view(0).to_string(),
            "ParallelConfig(global_rank=0, world_size=1, tp=1[rank=0], pp=1[rank=0], dp=1[rank=0])");
  try {
    ProcessGroups wrong(Mesh({{"dp", 2}, {"tp", 2}}), world);
    ADD_FAILURE() << "a 4-rank mesh on a world of 1 must be refused";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("mesh dp=2,tp=2 has 4 ranks but the job has 1"), std::string::npos)
        << e.what();
  }
}

TEST(CommunicatorSingle, ResolvedLaunchEnvOfAWorldOfOne) {
  LaunchEnv env = resolve_launch_env(Communicator::world());
  EXPECT_EQ(env.launcher, Launcher::kNone);
  EXPECT_EQ(env.world_size, 1);
  EXPECT_EQ(env.local_rank, 0);
  EXPECT_EQ(env.local_world_size, 1);
  EXPECT_EQ(env.node_rank, 0);
}

}  // namespace
}  // namespace ndmesh::comm
