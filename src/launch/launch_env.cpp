// Launcher detection. Each launcher family is read on its own (all of its variables,
// each checked to be a non-negative integer), then the innermost family present is
// chosen: Open MPI, then Hydra, then Slurm, then torchrun. Families that describe the
// same process are compared: a disagreement means two launchers were nested (torchrun
// inside mpirun) and nobody can tell which rank is meant, so it is an error naming both
// sets of variables. Slurm is not compared with an MPI family: mpirun inside an
// allocation starts its daemons with srun, so SLURM_PROCID there counts daemons.
#include "ndmesh/launch/launch_env.hpp"

#include <cerrno>
#include <cstdlib>

#include <fmt/core.h>
#include <fmt/format.h>

#include "ndmesh/core/error.hpp"

namespace ndmesh {

std::string_view launcher_name(Launcher launcher) {
  switch (launcher) {
    case Launcher::kNone:
      return "none";
    case Launcher::kOpenMpi:
      return "openmpi";
    case Launcher::kHydra:
      return "hydra";
    case Launcher::kSlurm:
      return "slurm";
    case Launcher::kTorchrun:
      return "torchrun";
  }
  return "?";
}

namespace {

// The variable names of one launcher family; empty string_view: not provided.
struct Family {
  Launcher launcher;
  std::string_view rank;
  std::vector<std::string_view> size;  // alternatives, first present wins
  std::string_view local_rank;
  std::string_view local_size;
  std::string_view node_rank;
};

const std::vector<Family>& families() {
  static const std::vector<Family> kFamilies = {
      {Launcher::kOpenMpi,
       "OMPI_COMM_WORLD_RANK",
       {"OMPI_COMM_WORLD_SIZE"},
       "OMPI_COMM_WORLD_LOCAL_RANK",
       "OMPI_COMM_WORLD_LOCAL_SIZE",
       ""},
      {Launcher::kHydra, "PMI_RANK", {"PMI_SIZE"}, "MPI_LOCALRANKID", "MPI_LOCALNRANKS", ""},
      {Launcher::kSlurm,
       "SLURM_PROCID",
       {"SLURM_NTASKS", "SLURM_NPROCS"},
       "SLURM_LOCALID",
       "",
       "SLURM_NODEID"},
      {Launcher::kTorchrun, "RANK", {"WORLD_SIZE"}, "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK"},
  };
  return kFamilies;
}

struct Reader {
  const EnvLookup& lookup;
  std::vector<std::string> used;

  // nullopt when `name` is empty or unset; ConfigError when set but not an integer >= min.
  std::optional<std::int64_t> get(std::string_view name, std::int64_t min) {
    if (name.empty()) return std::nullopt;
    auto value = lookup(name);
    if (!value) return std::nullopt;
    errno = 0;
    char* end = nullptr;
    long long parsed = std::strtoll(value->c_str(), &end, 10);
    if (errno != 0 || end == value->c_str() || *end != '\0' || parsed < min)
      fail<ConfigError>("launch",
                        "{}='{}' is not an integer >= {}; the launcher sets it, so unset it or fix it", name,
                        *value, min);
    used.push_back(fmt::format("{}={}", name, *value));
    return parsed;
  }
};

// Reads one family; nullopt when its rank variable is absent.
std::optional<LaunchEnv> read_family(const Family& f, const EnvLookup& lookup) {
  Reader r{lookup, {}};
  auto rank = r.get(f.rank, 0);
  std::optional<std::int64_t> size;
  std::string_view size_name = f.size.front();
  for (auto name : f.size) {
    size = r.get(name, 1);
    if (size) {
      size_name = name;
      break;
    }
  }
  if (!rank && !size) return std::nullopt;
  if (!rank)
    fail<ConfigError>("launch", "{}={} is set but {} is not; {} sets both, so set both or neither", size_name,
                      *size, f.rank, launcher_name(f.launcher));
  if (!size)
    fail<ConfigError>("launch", "{}={} is set but {} is not; {} sets both, so set both or neither", f.rank,
                      *rank, size_name, launcher_name(f.launcher));
  if (*rank >= *size)
    fail<ConfigError>("launch", "{}={} is not below {}={}: a rank must be in [0, world size)", f.rank, *rank,
                      size_name, *size);
  LaunchEnv env;
  env.launcher = f.launcher;
  env.rank = *rank;
  env.world_size = *size;
  env.local_rank = r.get(f.local_rank, 0);
  env.local_world_size = r.get(f.local_size, 1);
  env.node_rank = r.get(f.node_rank, 0);
  if (env.local_world_size && *env.local_world_size > env.world_size)
    fail<ConfigError>("launch", "{}={} exceeds {}={}: a node cannot hold more processes than the job",
                      f.local_size, *env.local_world_size, size_name, env.world_size);
  if (env.local_rank && env.local_world_size && *env.local_rank >= *env.local_world_size)
    fail<ConfigError>("launch", "{}={} is not below {}={}: a local rank must be in [0, local world size)",
                      f.local_rank, *env.local_rank, f.local_size, *env.local_world_size);
  if (env.local_rank && *env.local_rank >= env.world_size)
    fail<ConfigError>("launch", "{}={} is not below {}={}", f.local_rank, *env.local_rank, size_name,
                      env.world_size);
  if (env.node_rank && *env.node_rank >= env.world_size)
    fail<ConfigError>("launch", "{}={} is not below {}={}: there are fewer nodes than processes", f.node_rank,
                      *env.node_rank, size_name, env.world_size);
  env.sources = std::move(r.used);
  return env;
}

// MASTER_ADDR, MASTER_PORT and torchrun's elastic variables, for the store.
void read_store(const EnvLookup& lookup, LaunchEnv& env) {
  Reader r{lookup, {}};
  env.master_addr = lookup("MASTER_ADDR");
  if (env.master_addr) r.used.push_back("MASTER_ADDR=" + *env.master_addr);
  env.master_port = r.get("MASTER_PORT", 1);
  if (env.master_port && *env.master_port > 65535)
    fail<ConfigError>("launch", "MASTER_PORT={} is not a TCP port; use a free port in [1, 65535], e.g. 29500",
                      *env.master_port);
  if (auto agent = lookup("TORCHELASTIC_USE_AGENT_STORE")) {
    const std::string& v = *agent;
    if (v == "True" || v == "true" || v == "1") {
      env.agent_store = true;
    } else if (!(v == "False" || v == "false" || v == "0")) {
      fail<ConfigError>(
          "launch",
          "TORCHELASTIC_USE_AGENT_STORE='{}' is not True or False; torchrun sets it, so unset it or fix it",
          v);
    }
    r.used.push_back("TORCHELASTIC_USE_AGENT_STORE=" + v);
  }
  env.restart_count = r.get("TORCHELASTIC_RESTART_COUNT", 0).value_or(0);
  if (auto id = lookup("TORCHELASTIC_RUN_ID")) {
    env.run_id = *id;
    r.used.push_back("TORCHELASTIC_RUN_ID=" + *id);
  }
  env.sources.insert(env.sources.end(), r.used.begin(), r.used.end());
}

bool is_mpi_family(Launcher l) { return l == Launcher::kOpenMpi || l == Launcher::kHydra; }

}  // namespace

LaunchEnv LaunchEnv::detect() {
  return detect([](std::string_view name) -> std::optional<std::string> {
    const char* value = std::getenv(std::string(name).c_str());
    if (value == nullptr || *value == '\0') return std::nullopt;
    return std::string(value);
  });
}

LaunchEnv LaunchEnv::detect(const EnvLookup& lookup) {
  std::vector<LaunchEnv> found;
  for (const auto& f : families())
    if (auto env = read_family(f, lookup)) found.push_back(std::move(*env));
  if (found.empty()) {
    LaunchEnv alone;
    // Rank variables of process managers whose launchers ndmesh does not read.
    for (std::string_view name : {"PMIX_RANK", "PMIX_NAMESPACE", "PMI_FD", "PMI_ID", "MV2_COMM_WORLD_RANK",
                                  "MPIRUN_RANK"})
      if (auto value = lookup(name)) {
        alone.process_manager = fmt::format("{}={}", name, *value);
        break;
      }
    return alone;
  }
  const LaunchEnv& chosen = found.front();
  for (std::size_t i = 1; i < found.size(); ++i) {
    const LaunchEnv& other = found[i];
    // Two direct spawners (Open MPI and Hydra) or torchrun nested in an MPI launcher
    // must agree on who this process is.
    bool comparable = (is_mpi_family(chosen.launcher) && is_mpi_family(other.launcher)) ||
                      (is_mpi_family(chosen.launcher) && other.launcher == Launcher::kTorchrun) ||
                      (chosen.launcher == Launcher::kSlurm && other.launcher == Launcher::kTorchrun);
    if (!comparable) continue;
    if (other.rank != chosen.rank || other.world_size != chosen.world_size)
      fail<ConfigError>("launch",
                        "contradictory launcher variables: {} (from {}) but {} (from {}); this process looks "
                        "started by two launchers: unset the {} variables or launch with one launcher",
                        fmt::join(chosen.sources, " "), launcher_name(chosen.launcher),
                        fmt::join(other.sources, " "), launcher_name(other.launcher),
                        launcher_name(other.launcher));
  }
  LaunchEnv result = chosen;
  if (result.launcher == Launcher::kTorchrun) read_store(lookup, result);
  if (result.launcher == Launcher::kSlurm)
    result.slurm_without_pmi = !lookup("PMIX_RANK") && !lookup("PMI_FD") &&
                               (result.world_size > 1 || lookup("SLURM_STEP_ID") || lookup("SLURM_STEPID"));
  // A family lower in the list that agrees on the rank may know what the chosen one does
  // not (SLURM_NODEID under srun with Open MPI's PMIx).
  for (std::size_t i = 1; i < found.size(); ++i) {
    if (found[i].rank != chosen.rank || found[i].world_size != chosen.world_size) continue;
    if (!result.local_rank) result.local_rank = found[i].local_rank;
    if (!result.local_world_size) result.local_world_size = found[i].local_world_size;
    if (!result.node_rank) result.node_rank = found[i].node_rank;
  }
  return result;
}

bool LaunchEnv::has_mpi_world() const {
  return launcher == Launcher::kOpenMpi || launcher == Launcher::kHydra ||
         (launcher == Launcher::kSlurm && !slurm_without_pmi);
}

bool LaunchEnv::has_store() const { return launcher == Launcher::kTorchrun && master_addr && master_port; }

void LaunchEnv::require_store() const {
  if (launcher != Launcher::kTorchrun) return;
  for (auto [name, set] :
       {std::pair{"MASTER_ADDR", master_addr.has_value()}, std::pair{"MASTER_PORT", master_port.has_value()}})
    if (!set)
      fail<ConfigError>("launch",
                        "RANK={} and WORLD_SIZE={} are set (as by torchrun) but {} is not; the ranks meet at "
                        "MASTER_ADDR:MASTER_PORT, which torchrun sets: set both, e.g. MASTER_ADDR=127.0.0.1 "
                        "MASTER_PORT=29500, or unset RANK and WORLD_SIZE and launch with `mpirun -np {}`, "
                        "`srun --mpi=pmix -n {}` or `ndmesh launch -n {} --`",
                        rank, world_size, name, world_size, world_size, world_size);
}

void LaunchEnv::require_mpi_world() const {
  if (launcher == Launcher::kSlurm && !has_mpi_world())
    fail<ConfigError>("launch",
                      "started by srun ({}) without PMIx (PMIX_RANK is not set), so MPI cannot join the {} "
                      "tasks into one job; launch with `srun --mpi=pmix -n {} <prog> <args>`, or set "
                      "MpiDefault=pmix in slurm.conf (`srun --mpi=list` shows the plugins)",
                      fmt::join(sources, " "), world_size, world_size);
  if (launcher != Launcher::kTorchrun) return;
  fail<ConfigError>("launch",
                    "started by torchrun ({}), which creates no MPI world, and NDMESH_BACKEND=mpi; unset "
                    "NDMESH_BACKEND (gloo is chosen under torchrun), or launch the same {} processes with "
                    "`mpirun -np {} <prog> <args>`, `srun --mpi=pmix -n {} <prog> "
                    "<args>` or `ndmesh launch -n {} -- <prog> <args>`",
                    fmt::join(sources, " "), world_size, world_size, world_size, world_size);
}

std::string LaunchEnv::describe() const {
  auto opt = [](const std::optional<std::int64_t>& v) { return v ? std::to_string(*v) : std::string("?"); };
  return fmt::format("{} rank {} of {}, local {} of {}, node {}", launcher_name(launcher), rank, world_size,
                     opt(local_rank), opt(local_world_size), opt(node_rank));
}

}  // namespace ndmesh
