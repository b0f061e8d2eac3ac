// `ndmesh launch --elastic`: data-parallel replicas that survive each other's failures.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ndmesh::cli {

/// What `ndmesh launch --elastic` runs (validated by launch.cpp).
struct ElasticOptions {
  std::int64_t n = 0;             ///< ranks per replica (-n)
  std::int64_t replicas = 0;      ///< R (--replicas)
  std::int64_t max_restarts = 0;  ///< K: restarts of each replica (--max-restarts)
  std::int64_t min_replicas = 0;  ///< M, for the coordinator started here (--min-replicas)
  std::string coordinator;        ///< HOST:PORT of a coordinator started elsewhere, or empty
  std::int64_t replica_id = -1;   ///< >= 0: run only this replica (one launcher per node)
  std::vector<std::string> program;
  bool tag = true;
  double grace_s = 10;    ///< SIGTERM to SIGKILL
  double startup_s = 60;  ///< how long the coordinator may take to print its address
};

/// The default --min-replicas for R replicas: a majority, R / 2 + 1.
std::int64_t default_min_replicas(std::int64_t replicas);

/// Starts the coordinator (unless o.coordinator names one), then the replicas, each an
/// `ndmesh launch --store` job of o.n ranks on its own port whose ranks get
/// NDMESH_COORDINATOR and NDMESH_REPLICA_ID; restarts a replica whose rank fails (all its
/// ranks ended first) up to o.max_restarts times; returns 0 once every replica's ranks
/// exited 0, else the status of the failure that ended the job, after one line naming it.
int launch_elastic(const ElasticOptions& o);

/// Prints the commands that run the same job on a cluster: the coordinator, then one
/// launcher per replica.
void print_cluster_commands(const ElasticOptions& o);

}  // namespace ndmesh::cli
