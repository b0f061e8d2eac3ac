// The supervision of mpirun by `ndmesh launch` (see supervise.hpp). One loop polls the
// notify socket every 50 ms and reaps the child; the escalation runs on deadlines.
#include "supervise.hpp"

#include <dirent.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include <fmt/format.h>

#include "ndmesh/comm/communicator.hpp"
#include "ndmesh/core/error.hpp"
#include "ndmesh/launch/notify.hpp"

namespace ndmesh::cli {
namespace {

volatile std::sig_atomic_t g_forward = 0;  // a signal to pass on to the child

void on_signal(int sig) { g_forward = sig; }

// The terminal's SIGINT reaches mpirun by itself (the same process group); one sent to
// this process alone (kill, a scheduler) is passed on.
void on_sigint(int, siginfo_t* info, void*) {
  if (info == nullptr || info->si_code == SI_USER || info->si_code == SI_QUEUE || info->si_code == SI_TKILL)
    g_forward = SIGINT;
}

// The processes descending from `root` (not root itself), from /proc: mpirun puts each
// rank in a process group of its own, so a group kill would miss them.
std::vector<pid_t> descendants(pid_t root) {
  std::multimap<pid_t, pid_t> children;  // parent -> child
  if (DIR* d = opendir("/proc")) {
    while (dirent* e = readdir(d)) {
      char* end = nullptr;
      const long pid = std::strtol(e->d_name, &end, 10);
      if (end == e->d_name || *end != '\0') continue;
      std::ifstream stat(fmt::format("/proc/{}/stat", pid));
      std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
      const auto close_paren = text.rfind(')');  // the command name may hold spaces
      if (close_paren == std::string::npos) continue;
      std::istringstream rest(text.substr(close_paren + 1));
      char state = 0;
      long ppid = 0;
      if (rest >> state >> ppid) children.emplace(static_cast<pid_t>(ppid), static_cast<pid_t>(pid));
    }
    closedir(d);
  }
  std::vector<pid_t> out, todo = {root};
  while (!todo.empty()) {
    const pid_t p = todo.back();
    todo.pop_back();
    auto [lo, hi] = children.equal_range(p);
    for (auto it = lo; it != hi; ++it) {
      out.push_back(it->second);
      todo.push_back(it->second);
    }
  }
  return out;
}

int status_of(int wstatus) {
  if (WIFEXITED(wstatus)) return WEXITSTATUS(wstatus);
  if (WIFSIGNALED(wstatus)) return 128 + WTERMSIG(wstatus);
  return 1;
}

}  // namespace

NotifySocket::NotifySocket() {
  const char* tmp = std::getenv("TMPDIR");
  std::string templ = fmt::format("{}/ndmesh-launch-XXXXXX", tmp != nullptr && *tmp != '\0' ? tmp : "/tmp");
  if (mkdtemp(templ.data()) == nullptr)
    fail<>("launch", "cannot create a temporary directory {}: {}", templ, std::strerror(errno));
  dir_ = templ;
  path_ = dir_ + "/notify";
  sockaddr_un addr{};
  if (path_.size() >= sizeof(addr.sun_path)) {
    rmdir(dir_.c_str());
    fail<>("launch", "the socket path {} is longer than {} bytes; set TMPDIR to a shorter directory", path_,
           sizeof(addr.sun_path) - 1);
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path_.data(), path_.size());
  fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd_ < 0 || bind(fd_, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int err = errno;
    if (fd_ >= 0) close(fd_);
    rmdir(dir_.c_str());
    fail<>("launch", "cannot create the socket {}: {}", path_, std::strerror(err));
  }
}

NotifySocket::~NotifySocket() {
  if (fd_ >= 0) close(fd_);
  unlink(path_.c_str());
  rmdir(dir_.c_str());
}

int supervise(const std::vector<std::string>& argv, const NotifySocket& socket, double grace_s) {
  using Clock = std::chrono::steady_clock;
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t child = fork();
  if (child < 0) fail<>("launch", "cannot start {}: fork failed: {}", argv.front(), std::strerror(errno));
  if (child == 0) {
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args.front(), args.data());
    std::fprintf(stderr, "ndmesh: [launch] could not run %s: %s\n", args.front(), std::strerror(errno));
    std::_Exit(127);
  }
  // The terminal's SIGINT reaches mpirun directly (same process group); this process
  // stays to the end to reap it, and passes on a SIGINT sent to it alone.
  struct sigaction interrupt {
  }, forward{}, old_int{}, old_term{}, old_hup{};
  interrupt.sa_sigaction = on_sigint;
  interrupt.sa_flags = SA_SIGINFO;
  forward.sa_handler = on_signal;
  sigaction(SIGINT, &interrupt, &old_int);
  sigaction(SIGTERM, &forward, &old_term);
  sigaction(SIGHUP, &forward, &old_hup);

  std::vector<std::string> reports;  // the ranks' lines, in arrival order
  constexpr Clock::time_point kNever = Clock::time_point::max();
  Clock::time_point deadline = kNever;  // when mpirun gets killed
  auto after = [](double s) {
    return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
  };
  bool killed = false;
  int wstatus = 0;
  int forwarded = 0;  // the last signal passed on
  for (;;) {
    pollfd p{socket.fd(), POLLIN, 0};
    if (poll(&p, 1, 50) > 0) {
      char buf[kNotifyMaxBytes + 1];
      ssize_t n;
      while ((n = recv(socket.fd(), buf, kNotifyMaxBytes, 0)) > 0) {
        reports.emplace_back(buf, static_cast<std::size_t>(n));
        deadline = std::min(deadline, after(grace_s));
      }
    }
    if (g_forward != 0) {
      kill(child, g_forward);
      forwarded = g_forward;
      g_forward = 0;
      deadline = std::min(deadline, after(grace_s + 1));
    }
    const pid_t done = waitpid(child, &wstatus, WNOHANG);
    if (done == child || (done < 0 && errno != EINTR)) break;
    const auto now = Clock::now();
    if (now >= deadline) {  // mpirun did not end: end it and what it started here (before
      // killing mpirun, whose children are then no longer its)
      for (pid_t d : descendants(child)) kill(d, SIGKILL);
      kill(child, SIGKILL);
      deadline = kNever;
      killed = true;
    }
  }
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  sigaction(SIGHUP, &old_hup, nullptr);
  if (!reports.empty()) {
    const std::string report(telling_report(reports));
    const std::size_t others = reports.size() - 1;
    const std::string more = others > 0 ? fmt::format(" (and {} more report{})", others, others > 1 ? "s" : "") : "";
    if (killed)
      std::fprintf(
          stderr,
          "ndmesh: [launch] %s%s; mpirun had not ended %g s later (it waits for the daemon of a node "
          "it cannot reach in time), so the launcher ended it\n",
          report.c_str(), more.c_str(), grace_s);
    else
      std::fprintf(stderr, "ndmesh: [launch] the job ended after %s%s\n", report.c_str(), more.c_str());
    std::fflush(stderr);
  }
  if (killed && !reports.empty()) return comm::kTimeoutExitCode;
  if (killed && forwarded == 0) return 128 + SIGKILL;
  // Ended on a signal passed on: its status (mpirun's own is 1 then), as a shell reports it.
  if (forwarded != 0 && status_of(wstatus) != 0) return 128 + forwarded;
  return status_of(wstatus);
}

}  // namespace ndmesh::cli
