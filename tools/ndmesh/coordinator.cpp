// `ndmesh coordinator`: the coordinator of elastic data parallelism (docs/elastic.md). It
// serves a TCP store at --host:--port that the replicas (`ndmesh train` with
// NDMESH_COORDINATOR=HOST:PORT) meet at, decides the quorum and the commit of every step,
// and keeps its state in --state-file. Runs in the foreground until SIGTERM or SIGINT
// (exit 0); prints "coordinator listening on HOST:PORT" once it listens.
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <memory>

#include <fmt/core.h>

#include "ndmesh/core/error.hpp"
#include "ndmesh/elastic/coordinator.hpp"
#include "subcommand.hpp"

// Its own namespace: the tool compiles as a unity build (CMakeLists.txt), where every
// subcommand's file shares one translation unit with the others.
namespace ndmesh::cli::coordinator_command {
namespace {

std::atomic<bool> g_stop{false};
void on_signal(int) { g_stop.store(true); }

int run(const elastic::CoordinatorOptions& o) {
  if (o.port < 0 || o.port > 65535)
    fail<ConfigError>("coordinator",
                      "--port={} is not a TCP port; pass 0 (a free one) to 65535, e.g. --port 29400", o.port);
  if (o.min_replicas < 1)
    fail<ConfigError>("coordinator", "--min-replicas={} must be at least 1; e.g. --min-replicas 2",
                      o.min_replicas);
  if (!(o.heartbeat_timeout_s > 0 && o.heartbeat_timeout_s <= 3600))
    fail<ConfigError>("coordinator",
                      "--heartbeat-timeout-s={} must be in (0, 3600]; e.g. --heartbeat-timeout-s 5",
                      o.heartbeat_timeout_s);
  if (!o.state_file.empty()) {
    namespace fs = std::filesystem;
    const fs::path p(o.state_file);
    const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
    std::error_code ec;
    if (!fs::is_directory(dir, ec) || ::access(dir.c_str(), W_OK) != 0)
      fail<ConfigError>(
          "coordinator",
          "--state-file={}: the folder '{}' does not exist or is not writable; create it or pick another",
          o.state_file, dir.string());
  }
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGINT, &sa, nullptr);
  elastic::run_coordinator(o, g_stop, [](const std::string& host, int port) {
    fmt::print("coordinator listening on {}:{}\n", host, port);
    std::fflush(stdout);
  });
  return 0;
}

Action setup(CLI::App& app) {
  auto o = std::make_shared<elastic::CoordinatorOptions>();
  app.add_option("--port", o->port, "TCP port of the coordinator's store (0: a free one, printed)")
      ->required();
  app.add_option("--host", o->host, "address to listen on (an address of this host)")->capture_default_str();
  app.add_option("--min-replicas", o->min_replicas,
                 "fewest live replicas that may train (and always more than half of those ever seen)")
      ->required();
  app.add_option(
      "--state-file", o->state_file,
      "keep the generation and the committed step here (written atomically); a restarted coordinator "
      "resumes from it");
  app.add_option("--heartbeat-timeout-s", o->heartbeat_timeout_s,
                 "a replica silent this long is dead (it heartbeats every tenth of it, at most every 0.1 s)")
      ->capture_default_str();
  app.footer(
      "Example:\n"
      "  ndmesh coordinator --port 29400 --min-replicas 2 --state-file coord.json &\n"
      "  NDMESH_COORDINATOR=127.0.0.1:29400 NDMESH_REPLICA_ID=0 mpirun -np 2 ndmesh train --tp 2 ...");
  return [o] { return run(*o); };
}

const Subcommand kCoordinator{
    "coordinator", "Coordinate elastic data-parallel replicas (quorum, commit, state; see docs/elastic.md)",
    setup};

}  // namespace
}  // namespace ndmesh::cli::coordinator_command
