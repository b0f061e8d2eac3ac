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

#include "launch_store.hpp"
#include "ndmesh/core/env.hpp"
#include "ndmesh/core/error.hpp"
#include "subcommand.hpp"
#include "supervise.hpp"

namespace ndmesh::cli {
namespace {

struct LaunchOptions {
  std::int64_t n = 0;
  std::string mpirun = "mpirun";
  bool dry_run = false;
  bool no_tag = false;
  bool store = false;
  std::vector<std::string> rest;  // [mpirun options --] prog args
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
  app.add_option("-n,--np", o->n, "number of processes")->required();
  app.add_option("--mpirun", o->mpirun, "the MPI launcher to use (default: mpirun on PATH)");
  app.add_flag("--dry-run", o->dry_run, "print the mpirun command instead of running it");
  app.add_flag("--no-tag", o->no_tag, "do not prefix output lines with the rank (e.g. to pipe JSON)");
  app.add_flag(
      "--store", o->store,
      "no mpirun: start the ranks with torchrun's variables (a TCP store on 127.0.0.1, the Gloo backend)");
  app.add_option("args", o->rest, "[-- mpirun options] -- program and its arguments");
  app.footer(
      "Examples:\n"
      "  ndmesh launch -n 8 -- ndmesh check --dp 2 --pp 2 --tp 2\n"
      "  ndmesh launch -n 4 -- --bind-to none -- build/bin/parallel_config --tp 2 --dp 2\n"
      "  ndmesh launch --store -n 4 -- ndmesh train --dp 2 --tp 2     (no mpirun: Gloo)\n"
      "On a cluster use the scheduler instead: srun --mpi=pmix -n 64 ndmesh check --tp 8 --dp 8");
  return [o] { return run(*o); };
}

const Subcommand kLaunch{"launch", "Start N local processes of a program under mpirun", setup};

}  // namespace
}  // namespace ndmesh::cli
