// `ndmesh launch -n N [-- mpirun options] -- prog args`: starts N local processes of a
// program with mpirun and what this machine needs: --oversubscribe when N exceeds the
// cores, --allow-run-as-root when run as root, rank-tagged output, and the NDMESH_*
// variables that are set forwarded to every rank. Open MPI and MPICH/Hydra spell these
// differently; the flavour is read from `mpirun --version`. mpirun runs supervised
// (supervise.hpp), so that a job whose ranks time out ends even when mpirun waits for an
// unreachable node. With --store it starts the ranks itself, as torchrun would
// (launch_store.cpp).
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "launch_elastic.hpp"
#include "launch_store.hpp"
#include "ndmesh/core/env.hpp"
#include "ndmesh/core/error.hpp"
#include "subcommand.hpp"
#include "supervise.hpp"

// Its own namespace: the tool compiles as a unity build (CMakeLists.txt), where every
// subcommand's file shares one translation unit with the others.
namespace ndmesh::cli::launch_command {
namespace {

struct LaunchOptions {
  std::int64_t n = 0;
  std::string mpirun = "mpirun";
  bool dry_run = false;
  bool no_tag = false;
  bool store = false;
  std::vector<std::string> rest;  // [mpirun options --] prog args
  // --elastic (launch_elastic.hpp); the options record whether they were given.
  bool elastic = false;
  bool cluster_commands = false;
  std::int64_t replicas = 0, max_restarts = 0, min_replicas = 0, replica_id = -1;
  std::string coordinator;
  CLI::Option *replicas_opt = nullptr, *max_restarts_opt = nullptr, *min_replicas_opt = nullptr,
              *replica_id_opt = nullptr, *coordinator_opt = nullptr, *mpirun_opt = nullptr,
              *cluster_opt = nullptr;
};

// The full path of `name` on PATH (or `name` itself when it holds a '/'), or empty.
std::string find_program(const std::string& name) {
  namespace fs = std::filesystem;
  if (name.find('/') != std::string::npos) return access(name.c_str(), X_OK) == 0 ? name : "";
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "";
  std::size_t start = 0;
  while (start <= dirs.size()) {
    std::size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    fs::path candidate = fs::path(dirs.substr(start, end - start)) / name;
    if (!candidate.parent_path().empty() && access(candidate.c_str(), X_OK) == 0 &&
        !fs::is_directory(candidate))
      return candidate.string();
    start = end + 1;
  }
  return "";
}

// "openmpi" or "hydra" from `mpirun --version`.
std::string flavour(const std::string& mpirun) {
  std::string cmd = fmt::format("'{}' --version 2>&1", mpirun);
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(cmd.c_str(), "r"), pclose);
  std::string text;
  char buf[256];
  while (pipe && std::fgets(buf, sizeof buf, pipe.get())) text += buf;
  if (text.find("Open MPI") != std::string::npos || text.find("OpenRTE") != std::string::npos)
    return "openmpi";
  return "hydra";
}

std::string quote(const std::string& s) {
  if (!s.empty() && s.find_first_of(" \t\"'$\\;&|<>*?()") == std::string::npos) return s;
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// The train command's --dp value (empty when it has none): inside a replica dp is 1.
std::string dp_flag(const std::vector<std::string>& program) {
  for (std::size_t i = 0; i < program.size(); ++i) {
    if (program[i] == "--dp" && i + 1 < program.size()) return program[i + 1];
    if (program[i].starts_with("--dp=")) return program[i].substr(5);
  }
  return "";
}

// `--elastic` and `--print-cluster-commands`: the flags checked together, then
// launch_elastic.cpp.
int run_elastic(const LaunchOptions& o, const std::vector<std::string>& extra,
                const std::vector<std::string>& program, double grace) {
  const std::string example = fmt::format(
      "e.g. ndmesh launch --elastic --replicas 3 --max-restarts 2 -n {} -- ndmesh train --tp {}", o.n, o.n);
  NDMESH_CHECK_CONFIG(o.elastic, "launch",
                      "--print-cluster-commands shows an elastic job's commands; add --elastic, {}", example);
  NDMESH_CHECK_CONFIG(
      o.replicas_opt->count() > 0, "launch",
      "--elastic needs --replicas R, the number of data-parallel replicas of -n {} ranks each; {}", o.n,
      example);
  NDMESH_CHECK_CONFIG(o.replicas >= 1 && o.replicas <= 4096, "launch",
                      "--replicas {} must be between 1 and 4096; {}", o.replicas, example);
  NDMESH_CHECK_CONFIG(o.max_restarts >= 0 && o.max_restarts <= 1000000, "launch",
                      "--max-restarts {} must be between 0 (no restart) and 1000000; {}", o.max_restarts,
                      example);
  NDMESH_CHECK_CONFIG(
      extra.empty() && o.mpirun_opt->count() == 0 && !o.dry_run, "launch",
      "--elastic starts each replica's ranks itself (as --store does), so it takes no {}; drop it",
      o.dry_run        ? "--dry-run (--print-cluster-commands shows the commands)"
      : !extra.empty() ? fmt::format("mpirun options ({})", fmt::join(extra, " "))
                       : fmt::format("--mpirun {}", o.mpirun));
  const std::string dp = dp_flag(program);
  NDMESH_CHECK_CONFIG(
      dp.empty() || dp == "1", "launch",
      "the program's --dp {}: with --elastic dp is 1 inside a replica and the replicas are the "
      "data-parallel dimension; drop --dp and set --replicas (now {})",
      dp, o.replicas);
  const bool external = o.coordinator_opt->count() > 0;
  if (external) {
    const auto colon = o.coordinator.rfind(':');
    const std::string port = colon == std::string::npos ? "" : o.coordinator.substr(colon + 1);
    NDMESH_CHECK_CONFIG(
        colon != std::string::npos && colon > 0 && !port.empty() && port.size() <= 5 &&
            port.find_first_not_of("0123456789") == std::string::npos && std::stoi(port) >= 1 &&
            std::stoi(port) <= 65535,
        "launch",
        "--coordinator {} is not HOST:PORT (a port 1-65535); give the address the coordinator "
        "printed, e.g. --coordinator 10.0.0.1:29400",
        o.coordinator);
    NDMESH_CHECK_CONFIG(
        o.min_replicas_opt->count() == 0 || o.cluster_commands, "launch",
        "--min-replicas {} is for the coordinator this launcher starts; with --coordinator {} give it "
        "to that coordinator (ndmesh coordinator --min-replicas {}) and drop it here",
        o.min_replicas, o.coordinator, o.min_replicas);
  }
  if (o.replica_id_opt->count() > 0) {
    NDMESH_CHECK_CONFIG(external, "launch",
                        "--replica-id {} runs one replica of a job whose coordinator runs elsewhere; add "
                        "--coordinator HOST:PORT (see --print-cluster-commands)",
                        o.replica_id);
    NDMESH_CHECK_CONFIG(o.replica_id >= 0 && o.replica_id < o.replicas, "launch",
                        "--replica-id {} is not one of the replicas 0..{} (--replicas {})", o.replica_id,
                        o.replicas - 1, o.replicas);
    NDMESH_CHECK_CONFIG(!o.cluster_commands, "launch",
                        "--print-cluster-commands prints every replica's command; drop --replica-id {}",
                        o.replica_id);
  }
  const std::int64_t min_replicas =
      o.min_replicas_opt->count() > 0 ? o.min_replicas : default_min_replicas(o.replicas);
  NDMESH_CHECK_CONFIG(min_replicas >= 1 && min_replicas <= o.replicas, "launch",
                      "--min-replicas {} must be between 1 and --replicas {} (default {}, a majority)",
                      min_replicas, o.replicas, default_min_replicas(o.replicas));
  ElasticOptions e;
  e.n = o.n;
  e.replicas = o.replicas;
  e.max_restarts = o.max_restarts;
  e.min_replicas = min_replicas;
  e.coordinator = o.coordinator;
  e.replica_id = o.replica_id_opt->count() > 0 ? o.replica_id : -1;
  e.program = program;
  e.tag = !o.no_tag;
  e.grace_s = grace;
  e.startup_s = env::seconds("NDMESH_INIT_TIMEOUT_S", env::seconds("NDMESH_TIMEOUT_S", 300));
  if (o.cluster_commands) {
    print_cluster_commands(e);
    return 0;
  }
  return launch_elastic(e);
}

int run(const LaunchOptions& o) {
  NDMESH_CHECK_CONFIG(o.n >= 1, "launch", "-n {} must be at least 1; e.g. ndmesh launch -n 4 -- prog", o.n);
  NDMESH_CHECK_CONFIG(o.n <= (std::int64_t{1} << 20), "launch",
                      "-n {} is above the limit of {} processes; e.g. ndmesh launch -n 4 -- prog", o.n,
                      std::int64_t{1} << 20);
  // `-- --mpirun-opt ... -- prog args`: mpirun options come first when the rest starts
  // with an option and holds a second `--`.
  std::vector<std::string> extra, program = o.rest;
  auto sep = std::find(o.rest.begin(), o.rest.end(), "--");
  if (sep != o.rest.end() && !o.rest.empty() && o.rest.front().starts_with("-")) {
    extra.assign(o.rest.begin(), sep);
    program.assign(sep + 1, o.rest.end());
  }
  NDMESH_CHECK_CONFIG(
      !program.empty(), "launch",
      "no program to launch; write it after `--`, e.g. ndmesh launch -n {} -- ndmesh check --tp {}", o.n,
      o.n);
  // How long the ranks (or mpirun) get to end after SIGTERM before SIGKILL.
  const double grace = std::clamp(env::seconds("NDMESH_TIMEOUT_S", 300) / 4, 1.0, 10.0);
  if (o.elastic || o.cluster_commands) return run_elastic(o, extra, program, grace);
  for (const CLI::Option* given : {o.replicas_opt, o.max_restarts_opt, o.min_replicas_opt, o.replica_id_opt,
                                   o.coordinator_opt, o.cluster_opt})
    NDMESH_CHECK_CONFIG(
        given->count() == 0, "launch",
        "{} belongs to an elastic launch; add --elastic, e.g. ndmesh launch --elastic --replicas 3 "
        "--max-restarts 2 -n {} -- prog",
        given->get_name(), o.n);
  if (o.store) {
    NDMESH_CHECK_CONFIG(extra.empty(), "launch",
                        "--store starts the ranks itself: mpirun options ({}) do not apply",
                        fmt::join(extra, " "));
    return launch_store(o.n, program, !o.no_tag, o.dry_run, grace);
  }
  std::string mpirun = find_program(o.mpirun);
  if (mpirun.empty()) {
    const char* path = std::getenv("PATH");
    fail<ConfigError>(
        "launch",
        "{} not found on PATH ({}); install Open MPI (Debian: apt-get install openmpi-bin) or MPICH, "
        "or start the {} processes with srun --mpi=pmix -n {} {}, or without MPI: ndmesh launch --store -n "
        "{} -- {}",
        o.mpirun, path ? path : "unset", o.n, o.n, program.front(), o.n, program.front());
  }
  // The program runs on this node (without mpirun options, which may name other hosts): say
  // so here if it is not there, instead of mpirun's "failed to start" block and status 132.
  if (extra.empty() && !o.dry_run && find_program(program.front()).empty())
    fail<ConfigError>("launch",
                      "{}: no such program{} (or not executable); give its path or put it on PATH, e.g. "
                      "ndmesh launch -n {} -- build/bin/ndmesh check",
                      program.front(), program.front().find('/') == std::string::npos ? " on PATH" : "", o.n);
  std::string kind = flavour(mpirun);
  std::vector<std::string> args = {mpirun, "-n", std::to_string(o.n)};
  unsigned cores = std::thread::hardware_concurrency();
  if (kind == "openmpi") {
    if (o.n > static_cast<std::int64_t>(cores)) args.push_back("--oversubscribe");
    if (geteuid() == 0) args.push_back("--allow-run-as-root");
    if (!o.no_tag) args.push_back("--tag-output");
    for (const auto& v : env::variables())
      if (env::raw(v.name)) args.insert(args.end(), {"-x", std::string(v.name)});
  } else {
    if (!o.no_tag) args.push_back("-prepend-rank");
    std::vector<std::string> names;
    for (const auto& v : env::variables())
      if (env::raw(v.name)) names.emplace_back(v.name);
    if (!names.empty()) args.insert(args.end(), {"-genvlist", fmt::format("{}", fmt::join(names, ","))});
  }
  args.insert(args.end(), extra.begin(), extra.end());
  args.insert(args.end(), program.begin(), program.end());

  std::vector<std::string> shown;
  for (const auto& a : args) shown.push_back(quote(a));
  if (o.dry_run) {
    fmt::print("{}\n", fmt::join(shown, " "));
    return 0;
  }
  // Supervised (supervise.hpp): the ranks on this node report a timeout to the socket,
  // and the launcher ends mpirun when mpirun waits for a node it cannot reach.
  NotifySocket notify;
  setenv("NDMESH_LAUNCH_NOTIFY", notify.path().c_str(), 1);
  if (kind == "openmpi")
    args.insert(args.begin() + 3, {"-x", "NDMESH_LAUNCH_NOTIFY"});
  else
    args.insert(args.begin() + 3, {"-genv", "NDMESH_LAUNCH_NOTIFY", notify.path()});
  return supervise(args, notify, grace);
}

Action setup(CLI::App& app) {
  auto o = std::make_shared<LaunchOptions>();
  app.add_option("-n,--np", o->n,
                 "number of processes (-np too, as mpirun spells it; --elastic: of each replica)")
      ->required();
  o->mpirun_opt = app.add_option("--mpirun", o->mpirun, "the MPI launcher to use (default: mpirun on PATH)");
  app.add_flag("--dry-run", o->dry_run, "print the mpirun command instead of running it");
  app.add_flag("--no-tag", o->no_tag, "do not prefix output lines with the rank (e.g. to pipe JSON)");
  app.add_flag(
      "--store", o->store,
      "no mpirun: start the ranks with torchrun's variables (a TCP store on 127.0.0.1, the Gloo backend)");
  app.add_flag("--elastic", o->elastic,
               "elastic data parallelism: --replicas jobs of -n ranks each (started as --store does), a "
               "coordinator, and a failed replica restarted while the others train on");
  o->replicas_opt =
      app.add_option("--replicas", o->replicas, "--elastic: the number of data-parallel replicas R")
          ->group("Elastic");
  o->max_restarts_opt =
      app.add_option(
             "--max-restarts", o->max_restarts,
             "--elastic: how often each replica may be restarted (default 0); one more failure ends the job")
          ->group("Elastic");
  o->min_replicas_opt =
      app.add_option(
             "--min-replicas", o->min_replicas,
             "--elastic: the fewest replicas that may commit a step (default R/2+1, a majority); given to "
             "the coordinator started here")
          ->group("Elastic");
  o->coordinator_opt =
      app.add_option(
             "--coordinator", o->coordinator,
             "--elastic: HOST:PORT of a coordinator started elsewhere (ndmesh coordinator) instead of one "
             "started here")
          ->group("Elastic");
  o->replica_id_opt =
      app.add_option("--replica-id", o->replica_id,
                     "--elastic with --coordinator: run only this replica (one launcher per node)")
          ->group("Elastic");
  o->cluster_opt =
      app.add_flag("--print-cluster-commands", o->cluster_commands,
                   "--elastic: print the coordinator's and each replica's launcher command for a "
                   "cluster instead of running")
          ->group("Elastic");
  app.add_option("args", o->rest, "[-- mpirun options] -- program and its arguments");
  app.footer(
      "Examples:\n"
      "  ndmesh launch -n 8 -- ndmesh check --dp 2 --pp 2 --tp 2\n"
      "  ndmesh launch -n 4 -- --bind-to none -- build/bin/parallel_config --tp 2 --dp 2\n"
      "  ndmesh launch --store -n 4 -- ndmesh train --dp 2 --tp 2     (no mpirun: Gloo)\n"
      "  ndmesh launch --elastic --replicas 3 --max-restarts 2 -n 2 -- ndmesh train --tp 2\n"
      "      (3 replicas of tp 2 and their coordinator; a replica whose rank fails is restarted, up to\n"
      "      2 times each, while the others train on; output lines tagged [rREPLICA.RANK])\n"
      "  ndmesh launch --elastic --replicas 3 --max-restarts 2 -n 2 --print-cluster-commands -- ndmesh train "
      "--tp 2\n"
      "      (the coordinator's command and one launcher command per replica, for a cluster)\n"
      "On a cluster use the scheduler instead: srun --mpi=pmix -n 64 ndmesh check --tp 8 --dp 8");
  return [o] { return run(*o); };
}

const Subcommand kLaunch{"launch", "Start N local processes of a program under mpirun", setup};

}  // namespace
}  // namespace ndmesh::cli::launch_command
