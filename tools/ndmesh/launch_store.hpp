// `ndmesh launch --store`: N local ranks with torchrun's variables, no mpirun. The pieces
// it is made of (a held port, the signals to the launcher, a job of local processes each
// leading its own process group) are also what `ndmesh launch --elastic` runs each
// replica and the coordinator with (launch_elastic.cpp).
#pragma once

#include <poll.h>
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace ndmesh::cli {

/// Starts `n` processes of `program` with torchrun's variables (rank 0 serves the store at
/// 127.0.0.1 on a port this launcher holds for the job, so no other program takes it in
/// between; the ranks use Gloo), prefixing their output lines with "[rank] " when `tag`;
/// returns the first non-zero exit status, else 0. Each rank is the leader of its own
/// process group, which is what gets signalled (a rank started through `bash -c` or a
/// Python wrapper leaves no child behind), and dies with the launcher (parent-death
/// signal). When a rank fails, the others get SIGTERM; SIGINT, SIGTERM and SIGHUP sent to
/// the launcher are passed on to every rank (then the status is 128 + the signal); ranks
/// still there `grace_s` later get SIGKILL, as does a second such signal at once. With
/// `dry_run`, prints the equivalent shell lines instead.
int launch_store(std::int64_t n, const std::vector<std::string>& program, bool tag, bool dry_run, double grace_s);

using EnvList = std::vector<std::pair<std::string, std::string>>;

/// A port on 127.0.0.1 held for a job's store: bound with SO_REUSEADDR and never
/// listening, so the kernel gives it to no other program, while rank 0's server
/// (SO_REUSEADDR too) can still bind and listen on it. Close-on-exec: no rank inherits it.
class PortHold {
 public:
  PortHold();
  ~PortHold();
  PortHold(const PortHold&) = delete;
  PortHold& operator=(const PortHold&) = delete;
  int port() const { return port_; }

 private:
  int fd_ = -1, port_ = 0;
};

/// torchrun's variables for `rank` of a one-node job of `n` ranks meeting at 127.0.0.1:`port`.
EnvList store_env(std::int64_t rank, std::int64_t n, int port);

/// SIGINT, SIGTERM and SIGHUP to the launcher, caught while this object lives (the
/// previous handlers come back with its end). Installed before the first fork, so a signal
/// at any moment reaches every process started.
class LaunchSignals {
 public:
  LaunchSignals();
  ~LaunchSignals();
  LaunchSignals(const LaunchSignals&) = delete;
  LaunchSignals& operator=(const LaunchSignals&) = delete;
  /// The last signal received since the previous call, or 0 when none came.
  int next();
  /// How many signals have been taken by next() so far (1: end gracefully; more: at once).
  int taken() const { return taken_; }

 private:
  int taken_ = 0;
};

/// One process of a LocalJob.
struct ProcessSpec {
  std::vector<std::string> argv;  ///< run with execvp
  EnvList env;                    ///< set on top of the launcher's environment
  std::string tag;                ///< prefix of its output lines; empty: its output is not captured
};

/// Local processes started and ended together: each leads its own process group (what is
/// signalled), dies with the launcher (parent-death signal), and has its output lines
/// tagged on `sink` when its spec has a tag. The owner reaps them (waitpid(-1)) and hands
/// every status to reaped().
class LocalJob {
 public:
  LocalJob(double grace_s, std::FILE* sink) : grace_s_(grace_s), sink_(sink) {}
  /// Kills what remains (every process group) and prints what is left in the pipes.
  ~LocalJob();
  LocalJob(const LocalJob&) = delete;
  LocalJob& operator=(const LocalJob&) = delete;

  /// Forks the processes; a failed fork kills those started and throws.
  void start(const std::vector<ProcessSpec>& specs);
  /// Adds the open output pipes to `fds` (to poll them).
  void add_fds(std::vector<pollfd>& fds) const;
  /// Reads the pipes that `fds` (after poll) says are ready.
  void read(const std::vector<pollfd>& fds);
  /// When `pid` is one of its processes: records its exit status (`wstatus` from waitpid)
  /// and returns its index; otherwise -1.
  std::int64_t reaped(pid_t pid, int wstatus);
  /// Sends `sig` to every process group whose leader still runs; the ones still there
  /// grace_s later get SIGKILL (tick()).
  void end(int sig);
  /// SIGKILL to every process group whose leader still runs.
  void kill_now();
  /// SIGKILL once the grace period of end() is over.
  void tick();
  /// Ends what the leaders left in their groups (a wrapper's children), prints what is
  /// left in the pipes and closes them; for a job whose processes have all been reaped.
  void finish();

  std::size_t size() const { return procs_.size(); }
  std::size_t running() const;
  /// The exit status of process `i` (128 + signal when killed by one), once reaped.
  int status(std::size_t i) const { return procs_[i].status; }
  pid_t pid(std::size_t i) const { return procs_[i].pid; }
  /// Remembers, for each process, its first output line that starts with `prefix`
  /// (matched()); needs a tag.
  void watch(std::string prefix) { watch_ = std::move(prefix); }
  const std::string& matched(std::size_t i) const { return procs_[i].matched; }
  /// The last output line of process `i` (needs a tag).
  const std::string& last_line(std::size_t i) const { return procs_[i].last_line; }

 private:
  struct Proc {
    pid_t pid = -1;  // also its process group
    int out = -1;    // the read end of its output pipe, -1 once closed (or untagged)
    std::string tag, partial, matched, last_line;
    bool running = false;
    int status = 0;
  };
  void flush_lines(Proc& p, bool all);
  bool drain(Proc& p);  // false at the pipe's end
  void signal(int sig, bool all);

  double grace_s_;
  std::FILE* sink_;
  std::string watch_;
  std::vector<Proc> procs_;
  std::chrono::steady_clock::time_point kill_at_ = std::chrono::steady_clock::time_point::max();
  bool finished_ = false;
};

/// The exit status as a shell shows it: the code, or 128 + the signal.
int exit_status(int wstatus);

}  // namespace ndmesh::cli
