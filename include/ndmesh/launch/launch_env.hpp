// LaunchEnv: who started this process and where it sits (rank, world size, local rank,
// local world size, node rank), read from the variables the launchers set.
//
// Launchers, in the order they are trusted (the innermost, direct spawner wins):
//   Open MPI mpirun   OMPI_COMM_WORLD_RANK/_SIZE/_LOCAL_RANK/_LOCAL_SIZE
//   MPICH / Hydra     PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS
//   Slurm srun        SLURM_PROCID, SLURM_NTASKS (or SLURM_NPROCS), SLURM_LOCALID, SLURM_NODEID
//   torchrun          RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, and for
//                     the store: MASTER_ADDR, MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE,
//                     TORCHELASTIC_RESTART_COUNT (any launcher that sets RANK and
//                     WORLD_SIZE, e.g. a Kubernetes operator, counts as this family)
// Values a launcher does not give stay empty: under MPI the comm layer fills them from
// the engine (a shared-memory split), never from an assumed number of devices per node.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ndmesh {

/// The program that started this process.
enum class Launcher {
  kNone,      ///< started by hand: a world of one
  kOpenMpi,   ///< Open MPI mpirun / mpiexec
  kHydra,     ///< MPICH / Intel MPI Hydra (mpiexec.hydra)
  kSlurm,     ///< srun
  kTorchrun,  ///< torchrun / torch.distributed.run (no MPI world)
};

/// "none", "openmpi", "hydra", "slurm", "torchrun".
std::string_view launcher_name(Launcher launcher);

/// Reads one environment variable: nullopt when unset or empty.
using EnvLookup = std::function<std::optional<std::string>(std::string_view)>;

/// Where this process sits in the job, as the launcher says.
struct LaunchEnv {
  Launcher launcher = Launcher::kNone;
  std::int64_t rank = 0;                         ///< global rank
  std::int64_t world_size = 1;                   ///< number of processes
  std::optional<std::int64_t> local_rank;        ///< rank within the node, when the launcher says
  std::optional<std::int64_t> local_world_size;  ///< processes on this node, when the launcher says
  std::optional<std::int64_t> node_rank;         ///< index of this node, when the launcher says
  /// The variables the values came from, "NAME=value", for messages.
  std::vector<std::string> sources;
  /// torchrun family: where the job's TCP store is (MASTER_ADDR, MASTER_PORT in [1, 65535]).
  std::optional<std::string> master_addr;
  std::optional<std::int64_t> master_port;
  /// TORCHELASTIC_USE_AGENT_STORE=True: torchrun's agent serves the store (rank 0 must not).
  bool agent_store = false;
  /// TORCHELASTIC_RESTART_COUNT: the attempt of an elastic job (keys are kept per attempt).
  std::int64_t restart_count = 0;
  /// TORCHELASTIC_RUN_ID: the job's id (its store keys carry it); "none" when unset.
  std::string run_id = "none";
  /// Slurm family: started as a task of srun (SLURM_STEP_ID, or several tasks) without a
  /// process-management interface (no PMIX_RANK from srun --mpi=pmix, no PMI_FD from
  /// PMI-2), so MPI_Init cannot join srun's tasks into one job.
  bool slurm_without_pmi = false;
  /// No launcher's rank variables (kNone), but a variable of an MPI process manager that
  /// MPI_Init would join ("PMIX_RANK=3": a PMIx launcher such as prterun, PMI-2's PMI_FD,
  /// MVAPICH's MV2_COMM_WORLD_RANK), "NAME=value"; empty without one. Such a process starts
  /// MPI; a process with neither is alone (Communicator::world(): the "self" world).
  std::string process_manager;

  /// Detects from the process environment. ConfigError naming the variables when a
  /// value is malformed (not a non-negative integer, rank >= size, ...) or when two
  /// launchers give contradictory answers (torchrun inside mpirun).
  static LaunchEnv detect();
  /// Same, reading variables through `lookup` (tests, tools).
  static LaunchEnv detect(const EnvLookup& lookup);

  /// True when the launcher provides an MPI world (Open MPI, Hydra, Slurm with PMI).
  bool has_mpi_world() const;
  /// True when the processes meet through a TCP store: RANK and WORLD_SIZE (torchrun
  /// family, no MPI launcher) with MASTER_ADDR and MASTER_PORT.
  bool has_store() const;
  /// ConfigError naming the missing variable when the torchrun family is detected
  /// without MASTER_ADDR or MASTER_PORT; returns otherwise.
  void require_store() const;
  /// ConfigError with the commands to use instead when the process was started by a
  /// launcher that creates no MPI world (torchrun, or srun of several tasks without PMIx,
  /// whose MPI_Init would print Open MPI's page of text) and the MPI backend was asked
  /// for; returns otherwise. Called before MPI_Init.
  void require_mpi_world() const;
  /// One line: "openmpi rank 1 of 4, local 1 of 4, node ?".
  std::string describe() const;
};

}  // namespace ndmesh
