// Seed 000's program: every process prints its ParallelConfig line and the device it
// uses. Run it under a launcher, one process per rank:
//   mpirun -np 4 build/bin/parallel_config --tp 2 --pp 1 --dp 2
// The layout comes from the mesh (dp outermost, tp innermost, as in the seed), the local
// rank from the launcher or the engine, and the device is a GPU when the machine has
// one (local rank modulo the GPUs found), else the CPU.
#include <filesystem>
#include <string>

#include <fmt/core.h>
#include <CLI/CLI.hpp>

#include "ndmesh/comm/communicator.hpp"
#include "ndmesh/comm/process_groups.hpp"
#include "ndmesh/config/config.hpp"
#include "ndmesh/core/error.hpp"

namespace {

// GPUs the NVIDIA driver reports; 0 without a driver.
int count_gpus() {
  std::error_code ec;
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/driver/nvidia/gpus", ec)) {
    (void)e;
    ++n;
  }
  return n;
}

int run(std::int64_t tp, std::int64_t pp, std::int64_t dp, std::int64_t cp) {
  using ndmesh::comm::Communicator;
  Communicator world = Communicator::world();
  ndmesh::ParallelConfig config;
  config.set_size("tp", tp);
  config.set_size("pp", pp);
  config.set_size("dp", dp);
  config.set_size("cp", cp);
  config = ndmesh::resolve(config, world.size());
  ndmesh::validate(config);
  ndmesh::LaunchEnv launch = ndmesh::comm::resolve_launch_env(world);
  // The groups are created and agreed on by every rank, as a training job would.
  ndmesh::ProcessGroups groups(config.mesh(), world);
  std::string line =
      fmt::format("Process {}: {}\n", world.rank(), groups.config_view(*launch.local_rank).to_string());
  int gpus = count_gpus();
  if (gpus > 0)
    line += fmt::format("Process {} using GPU {}\n", world.rank(), *launch.local_rank % gpus);
  else
    line += fmt::format("Process {} using CPU (no GPU found)\n", world.rank());
  // One rank at a time, so the lines come out in rank order.
  for (int r = 0; r < world.size(); ++r) {
    if (r == world.rank()) {
      fmt::print("{}", line);
      std::fflush(stdout);
    }
    world.barrier();
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Seed 000's parallel_config: print each process's ParallelConfig and device"};
  std::int64_t tp = 1, pp = 1, dp = 1, cp = 1;
  app.add_option("--tp", tp, "tensor-parallel size");
  app.add_option("--pp", pp, "pipeline-parallel size");
  app.add_option("--dp", dp, "data-parallel size (-1: the rest of the world)");
  app.add_option("--cp", cp, "context-parallel size");
  CLI11_PARSE(app, argc, argv);
  try {
    return run(tp, pp, dp, cp);
  } catch (const ndmesh::ConfigError& e) {
    fmt::print(stderr, "parallel_config: {}\n", e.what());
    return 2;
  } catch (const ndmesh::Error& e) {
    fmt::print(stderr, "parallel_config: {}\n", e.what());
    return 1;
  }
}
