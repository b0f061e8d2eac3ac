// The coordinator of elastic data parallelism: one process outside every replica that
// serves the project's TCP store (launch/store.hpp, the c10d wire protocol) and runs the
// rules of elastic/quorum.hpp over it. Replicas talk to it only through store keys, all
// under "elastic/":
//   join_seq            counter; a replica's leader takes K = add(join_seq, 1) ...
//   join/K              ... and sets "REPLICA STEP" (its incarnation is K)
//   hb/REPLICA          counter the replica's leader increments every heartbeat period
//   gen/G               Generation::encode() of generation G (set once, never changed)
//   latest              the last generation's number
//   vote/G/S/REPLICA    "1" or "0": the replica's vote on attempt (G, S)
//   dec/G/S             Decision::encode(): commit or abort, and the next generation
//   ctx/G/RANK/...      the Gloo rendezvous of the ranks at replica rank RANK in generation G
// The state (generation, committed steps, replicas heard from) is written to the state file,
// atomically, before anything it changed is published; a restarted coordinator resumes from it.
#pragma once

#include <atomic>
#include <functional>
#include <string>

namespace ndmesh::elastic {

struct CoordinatorOptions {
  std::string host = "127.0.0.1";
  int port = 0;  ///< 0: a free port
  int min_replicas = 1;
  std::string state_file;  ///< empty: nothing persisted
  double heartbeat_timeout_s = 5;
};

/// Serves until `stop` becomes true. `listening(host, port)` is called once the store
/// listens. ConfigError for a port in use or an unreadable state file.
void run_coordinator(const CoordinatorOptions& options, const std::atomic<bool>& stop,
                     const std::function<void(const std::string&, int)>& listening);

/// The heartbeat period for a timeout: a tenth of it, at most 100 ms.
double heartbeat_period_s(double timeout_s);

}  // namespace ndmesh::elastic
