// ElasticReplica on in-process ranks: replicas of one rank each are threads of one
// in-process job, the coordinator runs on a thread of this process, and each generation's
// communicator across replicas is a comm::inproc::connect_group. The committed steps equal
// the serial run's, with all replicas and after one of them left (its threads returned:
// the others' reduction fails at once, the coordinator drops it at the heartbeat timeout,
// and the step is redone by the two left).
#include <atomic>
#include <cmath>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "support/model_fixtures.hpp"

#include "ndmesh/comm/inproc.hpp"
#include "ndmesh/comm/process_groups.hpp"
#include "ndmesh/elastic/coordinator.hpp"
#include "ndmesh/elastic/replica.hpp"
#include "ndmesh/model/data.hpp"
#include "ndmesh/parallel/trainer.hpp"

namespace ndmesh::elastic {
namespace {

using comm::Communicator;
using parallel::TrainOptions;

TrainOptions run_options(std::int64_t steps) {
  return {.model = {.layers = 1, .hidden = 32, .heads = 2, .kv_heads = 1, .seq = 16, .vocab = 16},
          .batch = 6,
          .micro_batch = 1,
          .steps = steps,
          .lr = 1e-2,
          .warmup = 2,
          .seed = 1};
}

std::unique_ptr<model::DataSource> data() {
  return std::make_unique<model::MarkovSource>(model::MarkovOptions{.vocab = 16, .seed = 1, .sharpness = 2.5});
}

Mesh serial_mesh() { return Mesh({{"dp", 1}, {"pp", 1}, {"cp", 1}, {"tp", 1}}); }

std::vector<double> serial_losses(std::int64_t steps) {
  std::vector<double> losses;
  comm::inproc::run(1, [&](const Communicator& world) {
    testing_support::single_blas_thread();
    ProcessGroups groups(serial_mesh(), world);
    parallel::Trainer trainer(run_options(steps), data(), groups);
    for (std::int64_t s = 0; s < steps; ++s) losses.push_back(trainer.step().loss);
  });
  return losses;
}

// A coordinator on a thread of this process for the scope's life.
class Coordinator {
 public:
  explicit Coordinator(CoordinatorOptions options) {
    thread_ = std::thread([this, options] {
      run_coordinator(options, stop_, [this](const std::string&, int port) { port_.store(port); });
    });
    while (port_.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~Coordinator() {
    stop_.store(true);
    thread_.join();
  }
  int port() const { return port_.load(); }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<int> port_{0};
  std::thread thread_;
};

// Runs `replicas` replicas of one rank for `steps` committed steps under a coordinator that
// trains with `min_replicas`; replica `leaver` (-1:
// none) returns after committing `leave_after` steps. losses[r][s]: replica r's loss of
// step s + 1 (NaN where it did not commit it); replicas[s]: how many computed step s + 1.
struct Outcome {
  std::vector<std::vector<double>> losses;
  std::vector<int> replicas;
};

Outcome run_replicas(int replicas, int min_replicas, std::int64_t steps, int leaver = -1,
                     std::int64_t leave_after = 0) {
  Coordinator coordinator({.port = 0, .min_replicas = min_replicas, .heartbeat_timeout_s = 0.5});
  Outcome out{.losses = std::vector<std::vector<double>>(static_cast<std::size_t>(replicas),
                                                         std::vector<double>(static_cast<std::size_t>(steps), NAN)),
              .replicas = std::vector<int>(static_cast<std::size_t>(steps), 0)};
  std::mutex mutex;
  comm::inproc::run(replicas, [&](const Communicator& world) {
    const int r = world.rank();
    // The replica's own world (ranks from 0, as a job of its own).
    const Communicator mine = comm::inproc::connect_group(world, fmt::format("replica{}", r), 0, 1, "world");
    testing_support::single_blas_thread();
    ProcessGroups groups(serial_mesh(), mine);
    parallel::Trainer trainer(run_options(steps), data(), groups);
    ElasticReplica replica(
        {.host = "127.0.0.1",
         .port = coordinator.port(),
         .replica = r,
         .heartbeat_timeout_s = 0.5,
         .reduce_timeout_s = 10,
         .connect_group = [&world](const launch::Store&, int position, int size, const comm::StoreGroupOptions& o) {
           return comm::inproc::connect_group(world, o.name, position, size, o.name, o.timeout_s);
         }},
        trainer, mine);
    while (replica.steps_done() < steps) {
      if (r == leaver && replica.steps_done() == leave_after) return;
      const CommittedStep c = replica.step();
      if (c.finished) break;
      std::lock_guard lock(mutex);
      const auto s = static_cast<std::size_t>(c.stats.step - 1);
      out.losses[static_cast<std::size_t>(r)][s] = c.stats.loss;
      out.replicas[s] = c.replicas;
    }
    replica.finish();
  });
  return out;
}

void expect_equal_losses(const std::vector<double>& got, const std::vector<double>& serial, int replica) {
  for (std::size_t s = 0; s < serial.size(); ++s) {
    if (std::isnan(got[s])) continue;
    EXPECT_NEAR(got[s], serial[s], 1e-5 * std::abs(serial[s])) << "replica " << replica << " step " << s + 1;
  }
}

TEST(ElasticReplica, ThreeReplicasCommitTheSerialRunsSteps) {
  const std::vector<double> serial = serial_losses(3);
  const Outcome out = run_replicas(3, 3, 3);
  for (int r = 0; r < 3; ++r) {
    for (std::size_t s = 0; s < serial.size(); ++s) EXPECT_FALSE(std::isnan(out.losses[r][s])) << r << " " << s;
    expect_equal_losses(out.losses[static_cast<std::size_t>(r)], serial, r);
  }
  for (int n : out.replicas) EXPECT_EQ(n, 3);
}

TEST(ElasticReplica, AReplicaThatLeavesIsDroppedAndTheStepIsRedoneByTheOthers) {
  const std::vector<double> serial = serial_losses(4);
  // Two may train, so a replica that joins late computes from a later step (healed).
  const Outcome out = run_replicas(3, 2, 4, /*leaver=*/2, /*leave_after=*/2);
  for (int r = 0; r < 2; ++r) {
    // Steps 3 and 4 by both that stayed (earlier ones perhaps not by one that joined late).
    for (std::size_t s = 2; s < serial.size(); ++s) EXPECT_FALSE(std::isnan(out.losses[r][s])) << r << " " << s;
    expect_equal_losses(out.losses[static_cast<std::size_t>(r)], serial, r);
  }
  EXPECT_EQ(out.replicas[2], 2);  // step 3 is computed without replica 2
  EXPECT_EQ(out.replicas[3], 2);
}

}  // namespace
}  // namespace ndmesh::elastic
