// `ndmesh launch --store`: starts N local processes without mpirun, the way torchrun does
// on one node: each gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK,
// ROLE_RANK, ROLE_NAME, GROUP_WORLD_SIZE, ROLE_WORLD_SIZE, MASTER_ADDR=127.0.0.1 and a
// MASTER_PORT this launcher holds, so the ranks meet at rank 0's TCP store and communicate
// over Gloo. Output lines are prefixed "[rank] " unless --no-tag; when a rank exits
// non-zero the others get SIGTERM and the launch exits with that rank's status (as
// torchrun does). Every rank leads its own process group, which is what is signalled, so
// that nothing a rank started outlives the job (see launch_store.hpp).
#include "launch_store.hpp"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "ndmesh/core/error.hpp"

namespace ndmesh::cli {
namespace {

volatile std::sig_atomic_t g_signal = 0;   // the last SIGINT/SIGTERM/SIGHUP received
volatile std::sig_atomic_t g_signals = 0;  // how many

void on_store_signal(int sig) {
  g_signal = sig;
  g_signals = g_signals + 1;
}

struct sigaction g_old_int {}, g_old_term{}, g_old_hup{};

}  // namespace

PortHold::PortHold() {
  fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  int one = 1;
  if (fd_ < 0 || ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
      ::bind(fd_, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
      ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const int err = errno;
    if (fd_ >= 0) ::close(fd_);
    fail<>("launch", "cannot find a free port for the store: {}", std::strerror(err));
  }
  port_ = ntohs(addr.sin_port);
}

PortHold::~PortHold() { ::close(fd_); }

EnvList store_env(std::int64_t rank, std::int64_t n, int port) {
  auto s = [](std::int64_t v) { return std::to_string(v); };
  return {{"RANK", s(rank)},         {"LOCAL_RANK", s(rank)},
          {"WORLD_SIZE", s(n)},      {"LOCAL_WORLD_SIZE", s(n)},
          {"GROUP_RANK", "0"},       {"ROLE_RANK", s(rank)},
          {"ROLE_NAME", "default"},  {"GROUP_WORLD_SIZE", "1"},
          {"ROLE_WORLD_SIZE", s(n)}, {"MASTER_ADDR", "127.0.0.1"},
          {"MASTER_PORT", s(port)},  {"TORCHELASTIC_USE_AGENT_STORE", "False"}};
}

LaunchSignals::LaunchSignals() {
  g_signal = 0;
  g_signals = 0;
  struct sigaction forward {};
  forward.sa_handler = on_store_signal;
  sigemptyset(&forward.sa_mask);
  sigaction(SIGINT, &forward, &g_old_int);
  sigaction(SIGTERM, &forward, &g_old_term);
  sigaction(SIGHUP, &forward, &g_old_hup);
}

LaunchSignals::~LaunchSignals() {
  sigaction(SIGINT, &g_old_int, nullptr);
  sigaction(SIGTERM, &g_old_term, nullptr);
  sigaction(SIGHUP, &g_old_hup, nullptr);
}

int LaunchSignals::next() {
  const int count = g_signals;
  if (count <= taken_) return 0;
  taken_ = count;
  return g_signal;
}

int exit_status(int wstatus) {
  if (WIFEXITED(wstatus)) return WEXITSTATUS(wstatus);
  if (WIFSIGNALED(wstatus)) return 128 + WTERMSIG(wstatus);
  return 1;
}

LocalJob::~LocalJob() {
  if (!finished_) {
    signal(SIGKILL, true);
    finish();
  }
}

void LocalJob::start(const std::vector<ProcessSpec>& specs) {
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t launcher = ::getpid();
  procs_.reserve(procs_.size() + specs.size());
  for (const ProcessSpec& spec : specs) {
    const bool capture = !spec.tag.empty();
    int fds[2] = {-1, -1};
    if (capture && ::pipe2(fds, O_CLOEXEC) != 0) {
      signal(SIGKILL, true);
      fail<>("launch", "pipe: {}", std::strerror(errno));
    }
    const pid_t pid = ::fork();
    if (pid < 0) {
      const int err = errno;
      if (capture) ::close(fds[0]), ::close(fds[1]);
      signal(SIGKILL, true);
      fail<>("launch", "cannot start {}: {}", spec.argv.front(), std::strerror(err));
    }
    if (pid == 0) {
      ::setpgid(0, 0);
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != launcher) std::_Exit(128 + SIGKILL);  // the launcher died meanwhile
      if (capture) {
        ::dup2(fds[1], STDOUT_FILENO);  // dup2 clears close-on-exec on the copies
        ::dup2(fds[1], STDERR_FILENO);
      }
      for (const auto& [k, v] : spec.env) ::setenv(k.c_str(), v.c_str(), 1);
      std::vector<char*> argv;
      for (const auto& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execvp(argv[0], argv.data());
      std::fprintf(stderr, "ndmesh: [launch] could not run %s: %s\n", argv[0], std::strerror(errno));
      std::_Exit(127);
    }
    ::setpgid(pid, pid);  // also here: no signal may find the child still in ours
    Proc p;
    p.pid = pid;
    p.running = true;
    p.tag = spec.tag;
    if (capture) {
      ::close(fds[1]);
      ::fcntl(fds[0], F_SETFL, ::fcntl(fds[0], F_GETFL) | O_NONBLOCK);
      p.out = fds[0];
    }
    procs_.push_back(std::move(p));
  }
}

void LocalJob::flush_lines(Proc& p, bool all) {
  std::size_t pos;
  auto emit = [&](const std::string& line) {
    if (!watch_.empty() && p.matched.empty() && line.starts_with(watch_)) p.matched = line;
    p.last_line = line;
    // A line that already starts with the tag (the coordinator's "[coordinator] ...") keeps one.
    std::fprintf(sink_, "%s%s\n", line.starts_with(p.tag) ? "" : p.tag.c_str(), line.c_str());
  };
  while ((pos = p.partial.find('\n')) != std::string::npos) {
    emit(p.partial.substr(0, pos));
    p.partial.erase(0, pos + 1);
  }
  if (all && !p.partial.empty()) {
    emit(p.partial);
    p.partial.clear();
  }
  std::fflush(sink_);
}

bool LocalJob::drain(Proc& p) {
  char buf[4096];
  for (;;) {
    const ssize_t got = ::read(p.out, buf, sizeof buf);
    if (got > 0) {
      p.partial.append(buf, static_cast<std::size_t>(got));
      continue;
    }
    if (got < 0 && errno == EINTR) continue;
    flush_lines(p, got == 0 || errno != EAGAIN);
    return got < 0 && errno == EAGAIN;
  }
}

void LocalJob::add_fds(std::vector<pollfd>& fds) const {
  for (const Proc& p : procs_)
    if (p.out >= 0) fds.push_back({p.out, POLLIN, 0});
}

void LocalJob::read(const std::vector<pollfd>& fds) {
  for (const pollfd& f : fds) {
    if (f.revents == 0) continue;
    for (Proc& p : procs_) {
      if (p.out != f.fd) continue;
      if (!drain(p)) {
        ::close(p.out);
        p.out = -1;
      }
      break;
    }
  }
}

std::int64_t LocalJob::reaped(pid_t pid, int wstatus) {
  for (std::size_t i = 0; i < procs_.size(); ++i) {
    Proc& p = procs_[i];
    if (p.pid != pid || !p.running) continue;
    p.running = false;
    p.status = exit_status(wstatus);
    return static_cast<std::int64_t>(i);
  }
  return -1;
}

void LocalJob::signal(int sig, bool all) {
  for (const Proc& p : procs_)
    if (p.pid > 0 && (p.running || all)) ::kill(-p.pid, sig);
}

void LocalJob::end(int sig) {
  using Clock = std::chrono::steady_clock;
  signal(sig, false);
  kill_at_ = std::min(kill_at_, Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                   std::chrono::duration<double>(grace_s_)));
}

void LocalJob::kill_now() { signal(SIGKILL, false); }

void LocalJob::tick() {
  if (std::chrono::steady_clock::now() < kill_at_) return;
  signal(SIGKILL, false);
  kill_at_ = std::chrono::steady_clock::time_point::max();
}

std::size_t LocalJob::running() const {
  std::size_t n = 0;
  for (const Proc& p : procs_) n += p.running ? 1 : 0;
  return n;
}

void LocalJob::finish() {
  finished_ = true;
  signal(SIGKILL, true);  // what the leaders left in their groups ends with them
  for (Proc& p : procs_) {
    if (p.out >= 0) {
      drain(p);
      ::close(p.out);
      p.out = -1;
    }
    flush_lines(p, true);
  }
}

int launch_store(std::int64_t n, const std::vector<std::string>& program, bool tag, bool dry_run,
                 double grace_s) {
  PortHold hold;
  const int port = hold.port();
  if (dry_run) {
    for (std::int64_t r = 0; r < n; ++r) {
      std::string line;
      for (const auto& [k, v] : store_env(r, n, port)) line += fmt::format("{}={} ", k, v);
      fmt::print("{}{} &\n", line, fmt::join(program, " "));
    }
    fmt::print("wait\n");
    return 0;
  }
  std::vector<ProcessSpec> specs;
  for (std::int64_t r = 0; r < n; ++r)
    specs.push_back({program, store_env(r, n, port), tag ? fmt::format("[{}] ", r) : std::string()});
  LaunchSignals signals;  // before the first fork: a signal at any moment reaches every rank
  LocalJob job(grace_s, stdout);
  job.start(specs);
  int status = 0;
  while (job.running() > 0) {
    std::vector<pollfd> fds;
    job.add_fds(fds);
    if (!fds.empty()) {
      ::poll(fds.data(), fds.size(), 20);
      job.read(fds);
    } else {
      ::usleep(20000);
    }
    if (const int sig = signals.next()) {
      if (status == 0) status = 128 + sig;
      if (signals.taken() == 1)
        job.end(sig);
      else
        job.kill_now();  // asked twice: at once
    }
    job.tick();
    int ws = 0;
    pid_t done;
    while ((done = ::waitpid(-1, &ws, WNOHANG)) > 0) {
      const std::int64_t i = job.reaped(done, ws);
      if (i < 0) continue;
      const int rc = job.status(static_cast<std::size_t>(i));
      if (rc != 0 && status == 0) {
        status = rc;
        job.end(SIGTERM);
      }
    }
  }
  job.finish();
  while (::waitpid(-1, nullptr, WNOHANG) > 0) {
  }
  return status;
}

}  // namespace ndmesh::cli
