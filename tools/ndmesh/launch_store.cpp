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

volatile std::sig_atomic_t g_signal = 0;  // the last SIGINT/SIGTERM/SIGHUP received
volatile std::sig_atomic_t g_signals = 0;  // how many

void on_signal(int sig) {
  g_signal = sig;
  g_signals = g_signals + 1;
}

// The store's port, held for the whole job: bound on the loopback with SO_REUSEADDR and
// never listening, so the kernel gives it to no other program, while rank 0's server
// (SO_REUSEADDR too) can still bind and listen on it. Close-on-exec: no rank inherits it.
class PortHold {
 public:
  PortHold() {
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
  ~PortHold() { ::close(fd_); }
  PortHold(const PortHold&) = delete;
  PortHold& operator=(const PortHold&) = delete;
  int port() const { return port_; }

 private:
  int fd_ = -1, port_ = 0;
};

std::vector<std::pair<std::string, std::string>> rank_env(std::int64_t rank, std::int64_t n, int port) {
  auto s = [](std::int64_t v) { return std::to_string(v); };
  return {{"RANK", s(rank)},         {"LOCAL_RANK", s(rank)},
          {"WORLD_SIZE", s(n)},      {"LOCAL_WORLD_SIZE", s(n)},
          {"GROUP_RANK", "0"},       {"ROLE_RANK", s(rank)},
          {"ROLE_NAME", "default"},  {"GROUP_WORLD_SIZE", "1"},
          {"ROLE_WORLD_SIZE", s(n)}, {"MASTER_ADDR", "127.0.0.1"},
          {"MASTER_PORT", s(port)},  {"TORCHELASTIC_USE_AGENT_STORE", "False"}};
}

struct Rank {
  pid_t pid = -1;  // also its process group
  int out = -1;    // the read end of its output pipe, -1 once closed (or untagged)
  std::string partial;
  bool running = true;
};

void flush_lines(Rank& r, std::int64_t index, bool all) {
  std::size_t pos;
  while ((pos = r.partial.find('\n')) != std::string::npos) {
    std::fprintf(stdout, "[%lld] %s\n", static_cast<long long>(index), r.partial.substr(0, pos).c_str());
    r.partial.erase(0, pos + 1);
  }
  if (all && !r.partial.empty()) {
    std::fprintf(stdout, "[%lld] %s\n", static_cast<long long>(index), r.partial.c_str());
    r.partial.clear();
  }
  std::fflush(stdout);
}

// Reads what the pipe holds now; false at its end.
bool drain(Rank& r, std::int64_t index) {
  char buf[4096];
  for (;;) {
    const ssize_t got = ::read(r.out, buf, sizeof buf);
    if (got > 0) {
      r.partial.append(buf, static_cast<std::size_t>(got));
      continue;
    }
    if (got < 0 && errno == EINTR) continue;
    flush_lines(r, index, got == 0 || errno != EAGAIN);
    return got < 0 && errno == EAGAIN;
  }
}

// Signals the process group of every rank whose leader still runs (or, `all`, of every
// rank: what the leaders left behind).
void signal_ranks(const std::vector<Rank>& ranks, int sig, bool all) {
  for (const Rank& r : ranks)
    if (r.pid > 0 && (r.running || all)) ::kill(-r.pid, sig);
}

}  // namespace

int launch_store(std::int64_t n, const std::vector<std::string>& program, bool tag, bool dry_run,
                 double grace_s) {
  PortHold hold;
  const int port = hold.port();
  if (dry_run) {
    for (std::int64_t r = 0; r < n; ++r) {
      std::string line;
      for (const auto& [k, v] : rank_env(r, n, port)) line += fmt::format("{}={} ", k, v);
      fmt::print("{}{} &\n", line, fmt::join(program, " "));
    }
    fmt::print("wait\n");
    return 0;
  }
  std::fflush(stdout);
  std::fflush(stderr);
  // Handlers before the first fork: a signal at any moment reaches every rank started.
  struct sigaction forward {};
  forward.sa_handler = on_signal;
  sigemptyset(&forward.sa_mask);
  struct sigaction old_int {}, old_term{}, old_hup{};
  sigaction(SIGINT, &forward, &old_int);
  sigaction(SIGTERM, &forward, &old_term);
  sigaction(SIGHUP, &forward, &old_hup);
  const pid_t launcher = ::getpid();
  std::vector<Rank> ranks(static_cast<std::size_t>(n));
  for (std::int64_t r = 0; r < n; ++r) {
    int fds[2] = {-1, -1};
    if (tag && ::pipe2(fds, O_CLOEXEC) != 0) fail<>("launch", "pipe: {}", std::strerror(errno));
    const pid_t pid = ::fork();
    if (pid < 0) {
      signal_ranks(ranks, SIGKILL, true);
      fail<>("launch", "cannot start rank {}: {}", r, std::strerror(errno));
    }
    if (pid == 0) {
      ::setpgid(0, 0);
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != launcher) std::_Exit(128 + SIGKILL);  // the launcher died meanwhile
      if (tag) {
        ::dup2(fds[1], STDOUT_FILENO);  // dup2 clears close-on-exec on the copies
        ::dup2(fds[1], STDERR_FILENO);
      }
      for (const auto& [k, v] : rank_env(r, n, port)) ::setenv(k.c_str(), v.c_str(), 1);
      std::vector<char*> argv;
      for (const auto& a : program) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execvp(argv[0], argv.data());
      std::fprintf(stderr, "ndmesh: [launch] could not run %s: %s\n", argv[0], std::strerror(errno));
      std::_Exit(127);
    }
    ::setpgid(pid, pid);  // also here: no signal may find the child still in ours
    ranks[static_cast<std::size_t>(r)].pid = pid;
    if (tag) {
      ::close(fds[1]);
      ::fcntl(fds[0], F_SETFL, ::fcntl(fds[0], F_GETFL) | O_NONBLOCK);
      ranks[static_cast<std::size_t>(r)].out = fds[0];
    }
  }
  using Clock = std::chrono::steady_clock;
  auto kill_at = Clock::time_point::max();  // when the ranks still there get SIGKILL
  auto end_ranks = [&](int sig) {
    signal_ranks(ranks, sig, false);
    kill_at = std::min(kill_at, Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                   std::chrono::duration<double>(grace_s)));
  };
  int status = 0;
  int handled = 0;  // signals to the launcher already passed on
  std::size_t running = ranks.size();
  while (running > 0) {
    std::vector<pollfd> fds;
    std::vector<std::size_t> owner;
    for (std::size_t i = 0; i < ranks.size(); ++i)
      if (ranks[i].out >= 0) {
        fds.push_back({ranks[i].out, POLLIN, 0});
        owner.push_back(i);
      }
    if (!fds.empty()) ::poll(fds.data(), fds.size(), 20);
    for (std::size_t j = 0; j < fds.size(); ++j) {
      if (fds[j].revents == 0) continue;
      Rank& r = ranks[owner[j]];
      if (!drain(r, static_cast<std::int64_t>(owner[j]))) {
        ::close(r.out);
        r.out = -1;
      }
    }
    if (fds.empty()) ::usleep(20000);
    if (g_signals > handled) {
      const int sig = g_signal;
      if (status == 0) status = 128 + sig;
      if (handled == 0) {
        end_ranks(sig);
      } else {
        signal_ranks(ranks, SIGKILL, false);  // asked twice: at once
      }
      handled = g_signals;
    }
    if (Clock::now() >= kill_at) {
      signal_ranks(ranks, SIGKILL, false);
      kill_at = Clock::time_point::max();
    }
    int ws = 0;
    pid_t done;
    while ((done = ::waitpid(-1, &ws, WNOHANG)) > 0) {
      for (auto& r : ranks) {
        if (r.pid != done || !r.running) continue;
        r.running = false;
        --running;
        const int rc = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
        if (rc != 0 && status == 0) {
          status = rc;
          end_ranks(SIGTERM);
        }
      }
    }
  }
  // What the ranks' leaders left in their groups (a wrapper's children) ends with them.
  signal_ranks(ranks, SIGKILL, true);
  for (std::size_t i = 0; i < ranks.size(); ++i) {  // what is left in the pipes
    Rank& r = ranks[i];
    if (r.out >= 0) {
      drain(r, static_cast<std::int64_t>(i));
      ::close(r.out);
    }
    flush_lines(r, static_cast<std::int64_t>(i), true);
  }
  while (::waitpid(-1, nullptr, WNOHANG) > 0) {
  }
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  sigaction(SIGHUP, &old_hup, nullptr);
  return status;
}

}  // namespace ndmesh::cli
