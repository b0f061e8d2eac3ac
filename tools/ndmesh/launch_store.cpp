// `ndmesh launch --store`: starts N local processes without mpirun, the way torchrun does
// on one node: each gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK,
// ROLE_RANK, ROLE_NAME, GROUP_WORLD_SIZE, ROLE_WORLD_SIZE, MASTER_ADDR=127.0.0.1 and a
// free MASTER_PORT, so the ranks meet at rank 0's TCP store and communicate over Gloo.
// Output lines are prefixed "[rank] " unless --no-tag; when a rank exits non-zero the
// others get SIGTERM and the launch exits with that rank's status (as torchrun does).
#include "launch_store.hpp"

#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "ndmesh/core/error.hpp"

namespace ndmesh::cli {
namespace {

// A port free now on the loopback (the kernel's pick; a tiny race with other programs).
int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
    fail<>("launch", "cannot find a free port for the store: {}", std::strerror(errno));
  ::close(fd);
  return ntohs(addr.sin_port);
}

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
  pid_t pid = -1;
  int out = -1;  // the read end of its output pipe, -1 once closed (or untagged)
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

}  // namespace

int launch_store(std::int64_t n, const std::vector<std::string>& program, bool tag, bool dry_run) {
  const int port = free_port();
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
  std::vector<Rank> ranks(static_cast<std::size_t>(n));
  for (std::int64_t r = 0; r < n; ++r) {
    int fds[2] = {-1, -1};
    if (tag && ::pipe(fds) != 0) fail<>("launch", "pipe: {}", std::strerror(errno));
    pid_t pid = ::fork();
    if (pid < 0) fail<>("launch", "cannot start rank {}: {}", r, std::strerror(errno));
    if (pid == 0) {
      if (tag) {
        ::dup2(fds[1], STDOUT_FILENO);
        ::dup2(fds[1], STDERR_FILENO);
        ::close(fds[0]);
        ::close(fds[1]);
      }
      for (const auto& [k, v] : rank_env(r, n, port)) ::setenv(k.c_str(), v.c_str(), 1);
      std::vector<char*> argv;
      for (const auto& a : program) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execvp(argv[0], argv.data());
      std::fprintf(stderr, "ndmesh: [launch] could not run %s: %s\n", argv[0], std::strerror(errno));
      std::_Exit(127);
    }
    ranks[static_cast<std::size_t>(r)].pid = pid;
    if (tag) {
      ::close(fds[1]);
      ranks[static_cast<std::size_t>(r)].out = fds[0];
    }
  }
  int status = 0;
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
      char buf[4096];
      ssize_t got = ::read(r.out, buf, sizeof buf);
      if (got > 0) {
        r.partial.append(buf, static_cast<std::size_t>(got));
        flush_lines(r, static_cast<std::int64_t>(owner[j]), false);
      } else if (got == 0 || errno != EINTR) {
        flush_lines(r, static_cast<std::int64_t>(owner[j]), true);
        ::close(r.out);
        r.out = -1;
      }
    }
    if (fds.empty()) ::usleep(20000);
    int ws = 0;
    pid_t done;
    while ((done = ::waitpid(-1, &ws, WNOHANG)) > 0) {
      for (auto& r : ranks) {
        if (r.pid != done || !r.running) continue;
        r.running = false;
        --running;
        int rc = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
        if (rc != 0 && status == 0) {
          status = rc;
          for (auto& other : ranks)
            if (other.running) ::kill(other.pid, SIGTERM);
        }
      }
    }
  }
  for (std::size_t i = 0; i < ranks.size(); ++i) {  // what is left in the pipes
    Rank& r = ranks[i];
    char buf[4096];
    ssize_t got;
    while (r.out >= 0 && (got = ::read(r.out, buf, sizeof buf)) > 0)
      r.partial.append(buf, static_cast<std::size_t>(got));
    flush_lines(r, static_cast<std::int64_t>(i), true);
    if (r.out >= 0) ::close(r.out);
  }
  return status;
}

}  // namespace ndmesh::cli
