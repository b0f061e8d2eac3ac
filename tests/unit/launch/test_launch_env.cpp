// LaunchEnv::detect() in-process: the launcher variables are set with setenv and the
// expected values are the ones written into the environment by hand.
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "ndmesh/core/error.hpp"
#include "ndmesh/launch/launch_env.hpp"
#include "ndmesh/launch/store.hpp"

namespace ndmesh {
namespace {

// Clears every launcher variable for the test and restores the old values after.
class ScopedEnv {
 public:
  explicit ScopedEnv(const std::map<std::string, std::string>& values) {
    for (const char* name : kNames) {
      const char* old = std::getenv(name);
      if (old) saved_[name] = old;
      unsetenv(name);
    }
    for (const auto& [k, v] : values) setenv(k.c_str(), v.c_str(), 1);
  }
  ~ScopedEnv() {
    for (const char* name : kNames) unsetenv(name);
    for (const auto& [k, v] : saved_) setenv(k.c_str(), v.c_str(), 1);
  }

 private:
  static constexpr const char* kNames[] = {"OMPI_COMM_WORLD_RANK",
                                           "OMPI_COMM_WORLD_SIZE",
                                           "OMPI_COMM_WORLD_LOCAL_RANK",
                                           "OMPI_COMM_WORLD_LOCAL_SIZE",
                                           "PMI_RANK",
                                           "PMI_SIZE",
                                           "MPI_LOCALRANKID",
                                           "MPI_LOCALNRANKS",
                                           "SLURM_PROCID",
                                           "SLURM_NTASKS",
                                           "SLURM_NPROCS",
                                           "SLURM_LOCALID",
                                           "SLURM_NODEID",
                                           "PMIX_RANK",
                                           "PMIX_NAMESPACE",
                                           "PMI_FD",
                                           "PMI_ID",
                                           "MV2_COMM_WORLD_RANK",
                                           "MPIRUN_RANK",
                                           "SLURM_STEP_ID",
                                           "RANK",
                                           "WORLD_SIZE",
                                           "LOCAL_RANK",
                                           "LOCAL_WORLD_SIZE",
                                           "GROUP_RANK",
                                           "MASTER_ADDR",
                                           "MASTER_PORT",
                                           "TORCHELASTIC_USE_AGENT_STORE",
                                           "TORCHELASTIC_RESTART_COUNT",
                                           "TORCHELASTIC_RUN_ID"};
  std::map<std::string, std::string> saved_;
};

std::string error_of(const std::map<std::string, std::string>& values) {
  ScopedEnv env(values);
  try {
    LaunchEnv::detect();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(LaunchEnv, NothingSetIsAWorldOfOne) {
  ScopedEnv env({});
  LaunchEnv e = LaunchEnv::detect();
  EXPECT_EQ(e.launcher, Launcher::kNone);
  EXPECT_EQ(e.rank, 0);
  EXPECT_EQ(e.world_size, 1);
  EXPECT_FALSE(e.local_rank.has_value());
  EXPECT_FALSE(e.has_mpi_world());
  EXPECT_NO_THROW(e.require_mpi_world());
  EXPECT_EQ(e.process_manager, "");  // alone: Communicator::world() starts no engine
}

// A process manager whose launcher's rank variables ndmesh does not read (prterun's PMIx,
// PMI-2, MVAPICH): no launcher, but MPI_Init would join the job, so the process is not alone.
TEST(LaunchEnv, AProcessManagerWithoutALauncherIsNamed) {
  for (const auto& [name, value] : std::vector<std::pair<std::string, std::string>>{
           {"PMIX_RANK", "3"}, {"PMIX_NAMESPACE", "prterun-host-1@1"}, {"PMI_FD", "7"}, {"PMI_ID", "2"},
           {"MV2_COMM_WORLD_RANK", "1"}, {"MPIRUN_RANK", "0"}}) {
    ScopedEnv env(std::map<std::string, std::string>{{name, value}});
    LaunchEnv e = LaunchEnv::detect();
    EXPECT_EQ(e.launcher, Launcher::kNone) << name;
    EXPECT_EQ(e.process_manager, name + "=" + value);
  }
  // Under a launcher ndmesh reads, the launcher answers and the field stays empty.
  ScopedEnv env({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"PMIX_RANK", "0"}});
  EXPECT_EQ(LaunchEnv::detect().process_manager, "");
}

TEST(LaunchEnv, OpenMpi) {
  ScopedEnv env({{"OMPI_COMM_WORLD_RANK", "5"},
                 {"OMPI_COMM_WORLD_SIZE", "8"},
                 {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                 {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}});
  LaunchEnv e = LaunchEnv::detect();
  EXPECT_EQ(e.launcher, Launcher::kOpenMpi);
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.world_size, 8);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 4);
  EXPECT_FALSE(e.node_rank.has_value());  // Open MPI does not say; the engine will
  EXPECT_TRUE(e.has_mpi_world());
  EXPECT_EQ(e.describe(), "openmpi rank 5 of 8, local 1 of 4, node ?");
}

TEST(LaunchEnv, Hydra) {
  ScopedEnv env({{"PMI_RANK", "3"}, {"PMI_SIZE", "4"}, {"MPI_LOCALRANKID", "1"}, {"MPI_LOCALNRANKS", "2"}});
  LaunchEnv e = LaunchEnv::detect();
  EXPECT_EQ(e.launcher, Launcher::kHydra);
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.world_size, 4);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 2);
}

TEST(LaunchEnv, SlurmWithNodeAndNprocsFallback) {
  ScopedEnv env(
      {{"SLURM_PROCID", "6"}, {"SLURM_NPROCS", "16"}, {"SLURM_LOCALID", "2"}, {"SLURM_NODEID", "1"}});
  LaunchEnv e = LaunchEnv::detect();
  EXPECT_EQ(e.launcher, Launcher::kSlurm);
  EXPECT_EQ(e.rank, 6);
  EXPECT_EQ(e.world_size, 16);
  EXPECT_EQ(e.local_rank, 2);
  EXPECT_FALSE(e.local_world_size.has_value());
  EXPECT_EQ(e.node_rank, 1);
}

TEST(LaunchEnv, SlurmWithoutPmixIsRefusedBeforeMpiInit) {
  // Plain `srun -n 4` where MpiDefault is none: Slurm's variables, none of PMIx's.
  ScopedEnv env(
      {{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "1"}, {"SLURM_NODEID", "0"}});
  LaunchEnv e = LaunchEnv::detect();
  EXPECT_EQ(e.launcher, Launcher::kSlurm);
  EXPECT_FALSE(e.has_mpi_world());
  try {
    e.require_mpi_world();
    FAIL() << "srun without PMIx must be refused";
  } catch (const ConfigError& err) {
    std::string msg = err.what();
    EXPECT_NE(msg.find("SLURM_PROCID=1 SLURM_NTASKS=4"), std::string::npos) << msg;
    EXPECT_NE(msg.find("srun --mpi=pmix -n 4"), std::string::npos) << msg;
    EXPECT_NE(msg.find("MpiDefault=pmix"), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

TEST(LaunchEnv, SlurmWithPmixOrPmi2OrOutsideAStepFormsAnMpiWorld) {
  for (auto extra : std::vector<std::map<std::string, std::string>>{
           {{"PMIX_RANK", "1"}, {"SLURM_NTASKS", "4"}}, {{"PMI_FD", "7"}, {"SLURM_NTASKS", "4"}}}) {
    extra["SLURM_PROCID"] = "1";
    ScopedEnv env(extra);
    LaunchEnv e = LaunchEnv::detect();
    EXPECT_TRUE(e.has_mpi_world());
    EXPECT_NO_THROW(e.require_mpi_world());
  }
  {
    ScopedEnv env({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}});  // a batch script's one task
    EXPECT_NO_THROW(LaunchEnv::detect().require_mpi_world());
  }
  ScopedEnv env({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"SLURM_STEP_ID", "0"}});  // srun -n 1
  EXPECT_THROW(LaunchEnv::detect().require_mpi_world(), ConfigError);
}

TEST(LaunchEnv, TorchrunIsDetectedButNeedsAnMpiLauncher) {
  ScopedEnv env({{"RANK", "1"},
                 {"WORLD_SIZE", "4"},
                 {"LOCAL_RANK", "1"},
                 {"LOCAL_WORLD_SIZE", "2"},
                 {"GROUP_RANK", "0"}});
  LaunchEnv e = LaunchEnv::detect();
  EXPECT_EQ(e.launcher, Launcher::kTorchrun);
  EXPECT_EQ(e.rank, 1);
  EXPECT_EQ(e.world_size, 4);
  EXPECT_EQ(e.node_rank, 0);
  EXPECT_FALSE(e.has_mpi_world());
  try {
    e.require_mpi_world();
    FAIL() << "torchrun must be refused";
  } catch (const ConfigError& err) {
    std::string msg = err.what();
    EXPECT_NE(msg.find("torchrun"), std::string::npos) << msg;
    EXPECT_NE(msg.find("mpirun -np 4"), std::string::npos) << msg;
    EXPECT_NE(msg.find("srun --mpi=pmix -n 4"), std::string::npos) << msg;
    EXPECT_NE(msg.find("ndmesh launch -n 4 --"), std::string::npos) << msg;
  }
}

TEST(LaunchEnv, TorchrunStoreVariables) {
  ScopedEnv env({{"RANK", "2"},
                 {"WORLD_SIZE", "4"},
                 {"MASTER_ADDR", "10.0.0.1"},
                 {"MASTER_PORT", "29500"},
                 {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                 {"TORCHELASTIC_RESTART_COUNT", "3"},
                 {"TORCHELASTIC_RUN_ID", "job-7"}});
  LaunchEnv e = LaunchEnv::detect();
  EXPECT_TRUE(e.has_store());
  EXPECT_EQ(e.run_id, "job-7");
  EXPECT_EQ(launch::job_key_prefix(e), "ndmesh/job-7/attempt_3/");
  EXPECT_EQ(e.master_addr, "10.0.0.1");
  EXPECT_EQ(e.master_port, 29500);
  EXPECT_TRUE(e.agent_store);
  EXPECT_EQ(e.restart_count, 3);
  EXPECT_NO_THROW(e.require_store());
}

TEST(LaunchEnv, TorchrunWithoutMasterPortNamesIt) {
  ScopedEnv env({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}});
  LaunchEnv e = LaunchEnv::detect();
  EXPECT_FALSE(e.has_store());
  EXPECT_EQ(e.run_id, "none");  // torchrun's default id
  EXPECT_FALSE(e.agent_store);
  try {
    e.require_store();
    FAIL() << "a store launch without MASTER_PORT must be refused";
  } catch (const ConfigError& err) {
    EXPECT_NE(std::string(err.what()).find("MASTER_PORT is not"), std::string::npos) << err.what();
  }
}

TEST(LaunchEnv, BadStoreVariablesNameTheVariable) {
  const std::pair<const char*, const char*> bad[] = {{"MASTER_PORT", "70000"},
                                                     {"MASTER_PORT", "port"},
                                                     {"TORCHELASTIC_USE_AGENT_STORE", "maybe"},
                                                     {"TORCHELASTIC_RESTART_COUNT", "-1"}};
  for (auto [name, value] : bad) {
    std::map<std::string, std::string> vars = {
        {"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"}};
    vars[name] = value;
    ScopedEnv env(vars);
    try {
      LaunchEnv::detect();
      ADD_FAILURE() << name << "=" << value << " accepted";
    } catch (const ConfigError& err) {
      EXPECT_NE(std::string(err.what()).find(name), std::string::npos) << err.what();
    }
  }
}

TEST(LaunchEnv, OpenMpiWinsOverAgreeingSlurmAndFillsNodeFromIt) {
  // srun --mpi=pmix of an Open MPI program that also exports OMPI_* (agreeing values).
  ScopedEnv env({{"OMPI_COMM_WORLD_RANK", "2"},
                 {"OMPI_COMM_WORLD_SIZE", "4"},
                 {"SLURM_PROCID", "2"},
                 {"SLURM_NTASKS", "4"},
                 {"SLURM_NODEID", "1"}});
  LaunchEnv e = LaunchEnv::detect();
  EXPECT_EQ(e.launcher, Launcher::kOpenMpi);
  EXPECT_EQ(e.node_rank, 1);
}

TEST(LaunchEnv, SlurmDaemonIdsUnderMpirunAreNotAContradiction) {
  // mpirun inside an allocation: SLURM_PROCID counts mpirun's daemons, not ranks.
  ScopedEnv env({{"OMPI_COMM_WORLD_RANK", "3"},
                 {"OMPI_COMM_WORLD_SIZE", "8"},
                 {"SLURM_PROCID", "0"},
                 {"SLURM_NTASKS", "2"},
                 {"SLURM_NODEID", "0"}});
  LaunchEnv e = LaunchEnv::detect();
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.world_size, 8);
  EXPECT_FALSE(e.node_rank.has_value());  // the disagreeing family is not used
}

TEST(LaunchEnv, TorchrunInsideMpirunDisagreeingIsAnError) {
  std::string msg = error_of(
      {{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"RANK", "3"}, {"WORLD_SIZE", "4"}});
  EXPECT_NE(msg.find("[launch] contradictory"), std::string::npos) << msg;
  EXPECT_NE(msg.find("OMPI_COMM_WORLD_RANK=1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("RANK=3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("WORLD_SIZE=4"), std::string::npos) << msg;
}

TEST(LaunchEnv, OpenMpiAndHydraDisagreeingIsAnError) {
  std::string msg = error_of(
      {{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"PMI_RANK", "0"}, {"PMI_SIZE", "2"}});
  EXPECT_NE(msg.find("PMI_RANK=0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("OMPI_COMM_WORLD_RANK=1"), std::string::npos) << msg;
}

TEST(LaunchEnv, MalformedValuesNameTheVariable) {
  EXPECT_NE(error_of({{"RANK", "one"}, {"WORLD_SIZE", "2"}}).find("RANK='one' is not an integer >= 0"),
            std::string::npos);
  EXPECT_NE(error_of({{"RANK", "-1"}, {"WORLD_SIZE", "2"}}).find("RANK='-1'"), std::string::npos);
  EXPECT_NE(error_of({{"PMI_RANK", "0"}, {"PMI_SIZE", "0"}}).find("PMI_SIZE='0' is not an integer >= 1"),
            std::string::npos);
  EXPECT_NE(error_of({{"SLURM_PROCID", "1x"}, {"SLURM_NTASKS", "2"}}).find("SLURM_PROCID='1x'"),
            std::string::npos);
}

TEST(LaunchEnv, InconsistentValuesNameBothVariables) {
  EXPECT_NE(error_of({{"RANK", "4"}, {"WORLD_SIZE", "4"}}).find("RANK=4 is not below WORLD_SIZE=4"),
            std::string::npos);
  EXPECT_NE(error_of({{"WORLD_SIZE", "4"}}).find("WORLD_SIZE=4 is set but RANK is not"), std::string::npos);
  EXPECT_NE(error_of({{"RANK", "0"}}).find("RANK=0 is set but WORLD_SIZE is not"), std::string::npos);
  EXPECT_NE(error_of({{"OMPI_COMM_WORLD_RANK", "0"},
                      {"OMPI_COMM_WORLD_SIZE", "2"},
                      {"OMPI_COMM_WORLD_LOCAL_RANK", "2"},
                      {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}})
                .find("OMPI_COMM_WORLD_LOCAL_RANK=2 is not below OMPI_COMM_WORLD_LOCAL_SIZE=2"),
            std::string::npos);
  EXPECT_NE(error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_WORLD_SIZE", "3"}})
                .find("LOCAL_WORLD_SIZE=3 exceeds WORLD_SIZE=2"),
            std::string::npos);
}

TEST(LaunchEnv, LookupOverloadReadsOnlyThroughTheLookup) {
  ScopedEnv env({});
  std::map<std::string, std::string> vars = {{"PMI_RANK", "1"}, {"PMI_SIZE", "3"}};
  LaunchEnv e = LaunchEnv::detect([&](std::string_view name) -> std::optional<std::string> {
    auto it = vars.find(std::string(name));
    if (it == vars.end()) return std::nullopt;
    return it->second;
  });
  EXPECT_EQ(e.launcher, Launcher::kHydra);
  EXPECT_EQ(e.rank, 1);
  EXPECT_EQ(e.world_size, 3);
}

}  // namespace
}  // namespace ndmesh
