// Elastic replicas on in-process ranks (comm/inproc.hpp), for the tests of ElasticReplica on
// the CPU (tests/unit/elastic/test_replica.cpp) and on emulated GPUs
// (tests/gpu/test_train_device.cpp): the replicas' ranks are threads of one in-process job,
// each replica's own world is a comm::inproc::connect_group of its ranks, the coordinator
// runs on a thread of this process, and each generation's communicator across replicas is a
// comm::inproc::connect_group. Needs NDMESH_HAVE_ELASTIC (ndmesh built with Gloo).
#pragma once

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "ndmesh/comm/inproc.hpp"
#include "ndmesh/comm/process_groups.hpp"
#include "ndmesh/elastic/coordinator.hpp"
#include "ndmesh/elastic/replica.hpp"
#include "ndmesh/model/data.hpp"
#include "ndmesh/parallel/trainer.hpp"
#include "support/model_fixtures.hpp"

namespace ndmesh::testing_support {

/// A coordinator on a thread of this process for the scope's life.
class InProcessCoordinator {
 public:
  explicit InProcessCoordinator(elastic::CoordinatorOptions options) {
    thread_ = std::thread([this, options] {
      elastic::run_coordinator(options, stop_, [this](const std::string&, int port) { port_.store(port); });
    });
    while (port_.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~InProcessCoordinator() {
    stop_.store(true);
    thread_.join();
  }
  InProcessCoordinator(const InProcessCoordinator&) = delete;
  InProcessCoordinator& operator=(const InProcessCoordinator&) = delete;
  int port() const { return port_.load(); }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<int> port_{0};
  std::thread thread_;
};

/// What run_replicas runs: `replicas` replicas of the layout `mesh` (Mesh::parse text; its
/// world size is the replica's ranks) under a coordinator that trains with `min_replicas`,
/// until `steps` steps are committed; replica `leaver` (-1: none) returns after committing
/// `leave_after` steps (its threads return: the others' reduction fails at once, the
/// coordinator drops it at the heartbeat timeout, 0.5 s); replica `late` (-1: none) joins
/// once another committed `join_after` steps (it is behind: it heals from a donor first).
struct ReplicaRun {
  int replicas = 3;
  int min_replicas = 3;
  std::int64_t steps = 3;
  int leaver = -1;
  std::int64_t leave_after = 0;
  int late = -1;
  std::int64_t join_after = 0;
  std::string mesh = "dp=1";
  parallel::TrainOptions options;  ///< steps is set from `steps`
  std::function<std::unique_ptr<model::DataSource>()> data;
  /// The communicator a replica's groups are built on, from its world (a GPU run's device
  /// communicator); empty: the world itself.
  std::function<comm::Communicator(const comm::Communicator&)> groups_world;
  comm::inproc::JobOptions job;
};

/// losses[r][s], norms[r][s]: replica r's loss and gradient norm of step s + 1 (NaN where it
/// did not commit it); replicas[s]: how many replicas computed step s + 1.
struct ReplicaOutcome {
  std::vector<std::vector<double>> losses, norms;
  std::vector<int> replicas;
};

inline ReplicaOutcome run_replicas(const ReplicaRun& run) {
  const Mesh mesh = Mesh::parse(run.mesh);
  const int ranks = static_cast<int>(mesh.world_size());
  InProcessCoordinator coordinator({.port = 0, .min_replicas = run.min_replicas, .heartbeat_timeout_s = 0.5});
  const auto r_count = static_cast<std::size_t>(run.replicas), s_count = static_cast<std::size_t>(run.steps);
  ReplicaOutcome out{.losses = std::vector<std::vector<double>>(r_count, std::vector<double>(s_count, NAN)),
                     .norms = std::vector<std::vector<double>>(r_count, std::vector<double>(s_count, NAN)),
                     .replicas = std::vector<int>(s_count, 0)};
  std::mutex mutex;
  std::atomic<std::int64_t> committed{0};  // the most steps any replica committed
  comm::inproc::run(
      run.replicas * ranks,
      [&](const comm::Communicator& world) {
        const int r = world.rank() / ranks, k = world.rank() % ranks;
        // The replica's own world (ranks from 0, as a job of its own).
        const comm::Communicator mine =
            comm::inproc::connect_group(world, fmt::format("replica{}", r), k, ranks, "world");
        single_blas_thread();
        ProcessGroups groups(mesh, run.groups_world ? run.groups_world(mine) : mine);
        parallel::TrainOptions options = run.options;
        options.steps = run.steps;
        parallel::Trainer trainer(options, run.data(), groups);
        if (r == run.late) {  // (joins anyway after a minute: the test fails then, it does not hang)
          const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
          while (committed.load() < run.join_after && std::chrono::steady_clock::now() < give_up)
            std::this_thread::sleep_for(std::chrono::milliseconds(2));
        }
        elastic::ElasticReplica replica(
            {.host = "127.0.0.1",
             .port = coordinator.port(),
             .replica = r,
             .heartbeat_timeout_s = 0.5,
             .reduce_timeout_s = 10,
             .connect_group =
                 [&world](const launch::Store&, int position, int size, const comm::StoreGroupOptions& o) {
                   return comm::inproc::connect_group(world, o.name, position, size, o.name, o.timeout_s);
                 }},
            trainer, mine);
        while (replica.steps_done() < run.steps) {
          if (r == run.leaver && replica.steps_done() == run.leave_after) return;
          const elastic::CommittedStep c = replica.step();
          if (c.finished) break;
          for (std::int64_t seen = committed.load();
               c.stats.step > seen && !committed.compare_exchange_weak(seen, c.stats.step);) {
          }
          if (k != 0) continue;
          std::lock_guard lock(mutex);
          const auto s = static_cast<std::size_t>(c.stats.step - 1);
          out.losses[static_cast<std::size_t>(r)][s] = c.stats.loss;
          out.norms[static_cast<std::size_t>(r)][s] = c.stats.grad_norm;
          out.replicas[s] = c.replicas;
        }
        replica.finish();
      },
      run.job);
  return out;
}

}  // namespace ndmesh::testing_support
