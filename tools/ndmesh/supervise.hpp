// `ndmesh launch` runs mpirun as its child instead of replacing itself with it, so that
// the job ends even when mpirun would not: Open MPI 4.1's mpirun waits for the daemon of
// every node, also for one it can no longer reach (cut off by the network, or slowed
// beyond any timeout), long after the ranks ended themselves. A rank that ends the job on
// a timeout first sends its one-line message to the launcher's socket
// (ndmesh/launch/notify.hpp); from then on mpirun gets a grace period to end by itself,
// then it and the processes it started on this node get SIGKILL (SIGTERM made it crash in
// its PMIx teardown; the daemons of the nodes it still reaches end their ranks when they
// lose it). The launcher prints the rank's line (of several, the one naming a group
// across nodes: telling_report) and exits with the timeout status.
#pragma once

#include <string>
#include <vector>

namespace ndmesh::cli {

/// A datagram socket in a fresh temporary directory, removed with it.
class NotifySocket {
 public:
  /// Creates the socket; `path()` is what the ranks get in NDMESH_LAUNCH_NOTIFY.
  NotifySocket();
  ~NotifySocket();
  NotifySocket(const NotifySocket&) = delete;
  NotifySocket& operator=(const NotifySocket&) = delete;
  const std::string& path() const { return path_; }
  int fd() const { return fd_; }

 private:
  std::string dir_, path_;
  int fd_ = -1;
};

/// Runs `argv` (argv[0] a full path) as a child and waits for it; returns its exit
/// status (128 + signal when killed by one). After the first line a rank sends to
/// `socket`, the child gets `grace_s` seconds to end, then it and its local descendants
/// are killed, the telling line is printed and the result is kTimeoutExitCode. SIGTERM and SIGHUP
/// are passed on to the child (which then gets grace_s + 1 s); SIGINT reaches it from the
/// terminal, and one sent to this process alone (kill -INT) is passed on too.
int supervise(const std::vector<std::string>& argv, const NotifySocket& socket, double grace_s);

}  // namespace ndmesh::cli
