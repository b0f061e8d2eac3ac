// One replica of elastic data parallelism (docs/elastic.md): the step loop of a trainer
// whose data-parallel dimension is the set of live replicas. Every rank of the replica runs
// it; the replica's rank 0 (its leader) talks to the coordinator (elastic/coordinator.hpp)
// and tells the other ranks over the replica's own communicator.
//
// Per step: the generation (quorum) gives this replica's position among the L live
// replicas, hence its share of the global batch (the batch source's replica_share);
// forward and backward on the share; the gradients and the loss summed over the replicas
// as the last level of GradSync's reduction, on a communicator of the ranks with this
// rank's coordinates (comm::connect_store_group: one per generation, under the
// generation's store prefix, with the comm layer's timeouts; aborted when the coordinator
// says a member fell silent); the replica's vote (every rank's ok); the optimizer step only
// when the coordinator commits. An aborted attempt is computed again in the next
// generation. A replica behind the generation's step first copies the state dict (the
// parameters and moments of every slice) and the step counters from the generation's root
// replica (rank by rank, over the same communicator: no disk).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

#include "ndmesh/comm/communicator.hpp"
#include "ndmesh/elastic/quorum.hpp"
#include "ndmesh/launch/store.hpp"
#include "ndmesh/parallel/trainer.hpp"

namespace ndmesh::elastic {

/// "HOST:PORT" -> (host, port); ConfigError naming `what` (a flag or variable).
std::pair<std::string, int> parse_address(const std::string& text, std::string_view what);

struct ReplicaOptions {
  std::string host;
  int port = 0;
  int replica = 0;
  /// The coordinator's heartbeat timeout (the leader heartbeats every tenth of it).
  double heartbeat_timeout_s = 5;
  /// Bound of the cross-replica collectives and of the meeting of a generation's communicator.
  double reduce_timeout_s = 10;
  /// How long the coordinator may be unreachable (a restart) before the replica stops.
  double reconnect_s = 30;
  /// Makes a generation's communicator of this rank's counterparts (this one at `position`
  /// of `size`) over `store` (the generation's prefix of the coordinator's store): by
  /// default comm::connect_store_group; the in-process tests pass comm::inproc::connect_group.
  std::function<comm::Communicator(const launch::Store& store, int position, int size,
                                   const comm::StoreGroupOptions& options)>
      connect_group;
};

/// A committed step as this replica saw it.
struct CommittedStep {
  parallel::StepStats stats;
  std::int64_t generation = 0;
  int replicas = 0;              ///< live replicas that computed it
  std::uint64_t param_hash = 0;  ///< of every rank's parameters after the update, in rank order
  bool first_member = false;     ///< this replica is the generation's first (it writes checkpoints)
  bool finished = false;         ///< nothing computed: the other replicas finished the run
};

/// The elastic step loop of one replica (collective over `world`, the replica's ranks).
class ElasticReplica {
 public:
  /// Joins the coordinator. ConfigError when the layout cannot be elastic.
  ElasticReplica(ReplicaOptions options, parallel::Trainer& trainer, const comm::Communicator& world);
  ~ElasticReplica();
  ElasticReplica(const ElasticReplica&) = delete;
  ElasticReplica& operator=(const ElasticReplica&) = delete;

  /// Attempts the next step until one commits (healing first when behind).
  CommittedStep step();
  std::int64_t steps_done() const { return trainer_.steps_done(); }
  /// The run is over (the last step is committed): a replica still waiting to join stops.
  void finish();

 private:
  class SupersededWatch;
  // Every rank: the leader's join, then the first generation that includes this process.
  void join();
  // Every rank: the first generation from `from` (0: the latest) that includes this
  // process; false when the coordinator was lost and the replica must join again.
  bool await_membership(std::int64_t from);
  void build_context();
  void heal();
  std::uint64_t hash_params() const;
  // The leader's connection, retried for reconnect_s; past it the replica stops with a line.
  launch::Store connect_or_stop();
  // Runs f on the leader and gives its text to every rank; "rejoin" when the leader lost
  // the coordinator (it reconnected).
  template <typename F>
  std::string leader_text(F&& f);
  std::string share_text(const std::string& text) const;
  void maybe_kill(std::string_view point) const;

  ReplicaOptions options_;
  parallel::Trainer& trainer_;
  comm::Communicator world_;
  bool leader_;
  launch::Store store_;  // the leader's connection
  launch::Store watch_store_;  // every rank's, for SupersededWatch (one reduction at a time)
  std::int64_t incarnation_ = 0;
  Generation gen_;
  int position_ = 0;
  std::int64_t attempt_step_ = 0;  // committed steps before the running attempt
  bool finished_ = false;          // the other replicas finished the run
  bool failed_ = false;            // the running attempt failed on this rank ...
  std::string why_;                // ... for this reason
  bool healed_ = false;            // in gen_
  // This rank's counterparts in the generation's replicas (comm::connect_store_group),
  // made per generation; empty with one replica.
  comm::Communicator cross_;
  std::int64_t ctx_generation_ = -1;
  std::atomic<bool> stop_{false};
  std::thread heartbeat_;
  std::string kill_;  // NDMESH_TEST_ELASTIC_KILL
};

}  // namespace ndmesh::elastic
