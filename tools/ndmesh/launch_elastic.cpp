// `ndmesh launch --elastic`: R data-parallel replicas of N local ranks each, and the
// coordinator they vote through. Each replica is what `ndmesh launch --store -n N` runs
// (its own store on its own held port, every rank its own process group, tagged output),
// and its ranks also get NDMESH_COORDINATOR=HOST:PORT and NDMESH_REPLICA_ID=r. Unlike the
// fail-fast launch, a replica whose rank fails is ended whole (SIGTERM to its process
// groups, SIGKILL after the grace period) and started again with the same replica id,
// while the other replicas train on; it rejoins through the coordinator and heals from
// them. The job fails, with one line, when a replica fails once more than
// --max-restarts allows, when a rank reports bad input (exit 2: a restart cannot fix
// it), when fewer than --min-replicas replicas are left to run, or when the coordinator
// ends. Signals to the launcher end everything, the coordinator last.
#include "launch_elastic.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "launch_store.hpp"
#include "ndmesh/core/error.hpp"
#include "subcommand.hpp"

namespace ndmesh::cli {
namespace {

constexpr std::string_view kListening = "coordinator listening on ";

struct Replica {
  std::int64_t id = 0;
  std::int64_t restarts = 0;
  std::unique_ptr<PortHold> port;  // its store's, one per start
  std::unique_ptr<LocalJob> job;
  bool failed = false;  // a rank failed: being ended, then started again
  bool done = false;    // every rank exited 0
};

std::string self_exe() {
  char buf[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0)
    fail<>("launch", "cannot find this ndmesh executable (/proc/self/exe): {}", std::strerror(errno));
  return std::string(buf, static_cast<std::size_t>(n));
}

std::string quote(const std::string& s) {
  if (!s.empty() && s.find_first_of(" \t\"'$\\;&|<>*?()#~`!{}[]") == std::string::npos) return s;
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string shell_words(const std::vector<std::string>& words) {
  std::string out;
  for (const auto& w : words) out += (out.empty() ? "" : " ") + quote(w);
  return out;
}

std::string describe(int status) {
  if (status > 128 && status < 128 + NSIG) {
    const char* name = sigabbrev_np(status - 128);
    if (name != nullptr) return fmt::format("status {} (SIG{})", status, name);
  }
  return fmt::format("status {}", status);
}

void start_replica(Replica& r, const ElasticOptions& o, const std::string& coordinator) {
  r.port = std::make_unique<PortHold>();
  r.job = std::make_unique<LocalJob>(o.grace_s, stdout);
  std::vector<ProcessSpec> specs;
  for (std::int64_t rank = 0; rank < o.n; ++rank) {
    EnvList env = store_env(rank, o.n, r.port->port());
    env.emplace_back("NDMESH_COORDINATOR", coordinator);
    env.emplace_back("NDMESH_REPLICA_ID", std::to_string(r.id));
    env.emplace_back("TORCHELASTIC_RESTART_COUNT", std::to_string(r.restarts));
    specs.push_back(
        {o.program, std::move(env), o.tag ? fmt::format("[r{}.{}] ", r.id, rank) : std::string()});
  }
  r.job->start(specs);
}

}  // namespace

std::int64_t default_min_replicas(std::int64_t replicas) { return replicas / 2 + 1; }

int launch_elastic(const ElasticOptions& o) {
  using Clock = std::chrono::steady_clock;
  LaunchSignals signals;  // before the first fork: a signal at any moment reaches every process
  std::vector<Replica> replicas;
  if (o.replica_id >= 0) {
    replicas.push_back({.id = o.replica_id});
  } else {
    for (std::int64_t r = 0; r < o.replicas; ++r) replicas.push_back({.id = r});
  }

  // The coordinator: started here (its own process group, tagged "[coordinator] ") unless
  // o.coordinator names one; its address is the line it prints once it listens.
  std::unique_ptr<LocalJob> coordinator;
  std::string address = o.coordinator;
  if (address.empty()) {
    coordinator = std::make_unique<LocalJob>(o.grace_s, o.tag ? stdout : stderr);
    coordinator->watch(std::string(kListening));
    const std::vector<std::string> argv = {self_exe(), "coordinator",    "--port",
                                           "0",        "--min-replicas", std::to_string(o.min_replicas)};
    coordinator->start({{argv, {}, "[coordinator] "}});
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(o.startup_s));
    std::string failure;
    int status = 1;
    while (address.empty() && failure.empty()) {
      std::vector<pollfd> fds;
      coordinator->add_fds(fds);
      if (!fds.empty()) {
        ::poll(fds.data(), fds.size(), 20);
        coordinator->read(fds);
      } else {
        ::usleep(20000);
      }
      if (const std::string& line = coordinator->matched(0); !line.empty()) {
        const std::string rest = line.substr(kListening.size());
        address = rest.substr(0, rest.find_first_of(" \t"));
        if (address.find(':') == std::string::npos)
          failure = fmt::format("the coordinator printed `{}`, which names no HOST:PORT", line);
        continue;
      }
      if (const int sig = signals.next()) {
        failure = fmt::format("SIG{} while the coordinator started", sigabbrev_np(sig));
        status = 128 + sig;
      } else if (int ws = 0; ::waitpid(coordinator->pid(0), &ws, WNOHANG) == coordinator->pid(0)) {
        coordinator->reaped(coordinator->pid(0), ws);
        const std::string& last = coordinator->last_line(0);
        failure = fmt::format("the coordinator ({}) ended with {} before it listened{}", shell_words(argv),
                              describe(coordinator->status(0)), last.empty() ? "" : ": " + last);
      } else if (Clock::now() >= deadline) {
        failure = fmt::format("the coordinator ({}) printed no `{}HOST:PORT` line within {} s",
                              shell_words(argv), kListening, o.startup_s);
      }
    }
    if (!failure.empty()) {
      if (coordinator->running() > 0) {
        coordinator->kill_now();
        ::waitpid(coordinator->pid(0), nullptr, 0);
        coordinator->reaped(coordinator->pid(0), 0);
      }
      coordinator->finish();
      std::fprintf(stderr, "ndmesh: [launch] %s\n", failure.c_str());
      return status;
    }
  }

  for (Replica& r : replicas) start_replica(r, o, address);

  int status = 0;
  std::string reason;   // the line that says why the job failed
  bool ending = false;  // everything is being ended: no more restarts
  auto end_all = [&](int sig) {
    ending = true;
    for (Replica& r : replicas)
      if (r.job) r.job->end(sig);
    if (coordinator) coordinator->end(sig);
  };
  auto stop = [&](int st, std::string why) {
    if (ending) return;
    status = st;
    reason = std::move(why);
    end_all(SIGTERM);
  };
  auto running = [&] {
    std::size_t n = coordinator ? coordinator->running() : 0;
    for (const Replica& r : replicas) n += r.job ? r.job->running() : 0;
    return n;
  };

  for (;;) {
    // A failed replica whose ranks are all gone starts again.
    for (Replica& r : replicas) {
      if (!r.failed || ending || r.job->running() > 0) continue;
      r.job->finish();
      r.job.reset();
      r.port.reset();
      ++r.restarts;
      r.failed = false;
      std::fprintf(stderr, "ndmesh: [launch] replica %lld starts again (restart %lld of %lld)\n",
                   static_cast<long long>(r.id), static_cast<long long>(r.restarts),
                   static_cast<long long>(o.max_restarts));
      std::fflush(stderr);
      start_replica(r, o, address);
    }
    if (running() == 0) break;
    std::vector<pollfd> fds;
    if (coordinator) coordinator->add_fds(fds);
    for (const Replica& r : replicas) r.job->add_fds(fds);
    if (!fds.empty()) {
      ::poll(fds.data(), fds.size(), 20);
      if (coordinator) coordinator->read(fds);
      for (Replica& r : replicas) r.job->read(fds);
    } else {
      ::usleep(20000);
    }
    if (const int sig = signals.next()) {
      if (status == 0) status = 128 + sig;
      if (signals.taken() == 1) {
        end_all(sig);
      } else {  // asked twice: at once
        for (Replica& r : replicas) r.job->kill_now();
        if (coordinator) coordinator->kill_now();
      }
    }
    if (coordinator) coordinator->tick();
    for (Replica& r : replicas) r.job->tick();

    int ws = 0;
    pid_t done;
    while ((done = ::waitpid(-1, &ws, WNOHANG)) > 0) {
      if (coordinator && coordinator->reaped(done, ws) >= 0) {
        stop(coordinator->status(0) != 0 ? coordinator->status(0) : 1,
             fmt::format(
                 "the coordinator at {} ended with {}; without it no replica can commit a step, so the "
                 "job ends (restart it with its --state-file to resume)",
                 address, describe(coordinator->status(0))));
        continue;
      }
      for (Replica& r : replicas) {
        const std::int64_t rank = r.job->reaped(done, ws);
        if (rank < 0) continue;
        const int rc = r.job->status(static_cast<std::size_t>(rank));
        if (ending || r.failed) break;
        if (rc == 0) {
          r.done = r.job->running() == 0;
          break;
        }
        r.failed = true;
        const std::string what = fmt::format("replica {} rank {} exited with {}", r.id, rank, describe(rc));
        std::int64_t left = 0;  // replicas that can still take part
        for (const Replica& other : replicas) left += other.done ? 0 : 1;
        if (rc == kExitUsage) {
          stop(rc, what + " (bad input, which a restart cannot fix; see its line above)");
        } else if (r.restarts >= o.max_restarts) {
          stop(rc, fmt::format("{} and was restarted {} time{} already (--max-restarts {}): the job ends",
                               what, r.restarts, r.restarts == 1 ? "" : "s", o.max_restarts));
        } else if (coordinator && o.replica_id < 0 && left < o.min_replicas) {
          stop(rc, fmt::format(
                       "{}; {} replica{} finished, so fewer than --min-replicas {} can take part: the job "
                       "ends",
                       what, o.replicas - left, o.replicas - left == 1 ? "" : "s", o.min_replicas));
        } else {
          std::fprintf(
              stderr, "ndmesh: [launch] %s; ending its ranks to start it again (restart %lld of %lld)\n",
              what.c_str(), static_cast<long long>(r.restarts + 1), static_cast<long long>(o.max_restarts));
          std::fflush(stderr);
          r.job->end(SIGTERM);
        }
        break;
      }
    }
    // Every replica finished: the coordinator's work is done.
    if (!ending && std::all_of(replicas.begin(), replicas.end(), [](const Replica& r) { return r.done; })) {
      ending = true;
      if (coordinator) coordinator->end(SIGTERM);
    }
  }
  for (Replica& r : replicas) r.job->finish();
  if (coordinator) coordinator->finish();
  while (::waitpid(-1, nullptr, WNOHANG) > 0) {
  }
  if (!reason.empty()) {
    std::fprintf(stderr, "ndmesh: [launch] %s\n", reason.c_str());
    std::fflush(stderr);
  }
  return status;
}

void print_cluster_commands(const ElasticOptions& o) {
  // Without --coordinator the address is a placeholder the user replaces.
  const std::string address = o.coordinator.empty() ? "COORDINATOR_HOST:29400" : o.coordinator;
  const std::string host = address.substr(0, address.rfind(':'));
  const std::string port = address.substr(address.rfind(':') + 1);
  fmt::print("# 1. The coordinator, on the host {} (an address every replica's node reaches):\n", host);
  fmt::print(
      "ndmesh coordinator --host {} --port {} --min-replicas {} --state-file ndmesh-coordinator.state\n",
      host, port, o.min_replicas);
  fmt::print(
      "# 2. One launcher per replica, each on its own node with {} ranks, e.g. one scheduler task each:\n",
      o.n);
  for (std::int64_t r = 0; r < o.replicas; ++r)
    fmt::print(
        "ndmesh launch --elastic --replicas {} --replica-id {} --coordinator {} --max-restarts {} -n {} -- "
        "{}\n",
        o.replicas, r, address, o.max_restarts, o.n, shell_words(o.program));
}

}  // namespace ndmesh::cli
