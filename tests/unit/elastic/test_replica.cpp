// ElasticReplica on in-process ranks: replicas of one rank each are threads of one
// in-process job, the coordinator runs on a thread of this process, and each generation's
// communicator across replicas is a comm::inproc::connect_group. The committed steps equal
// the serial run's, with all replicas and after one of them left (its threads returned:
// the others' reduction fails at once, the coordinator drops it at the heartbeat timeout,
// and the step is redone by the two left).
#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "support/elastic_replicas.hpp"
#include "support/model_fixtures.hpp"

namespace ndmesh::elastic {
namespace {

using comm::Communicator;
using parallel::TrainOptions;
using testing_support::ReplicaOutcome;

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

std::vector<double> serial_losses(std::int64_t steps) {
  std::vector<double> losses;
  comm::inproc::run(1, [&](const Communicator& world) {
    testing_support::single_blas_thread();
    ProcessGroups groups(Mesh::parse("dp=1"), world);
    parallel::Trainer trainer(run_options(steps), data(), groups);
    for (std::int64_t s = 0; s < steps; ++s) losses.push_back(trainer.step().loss);
  });
  return losses;
}

// `replicas` replicas of one rank for `steps` committed steps under a coordinator that
// trains with `min_replicas`; replica `leaver` (-1: none) returns after committing
// `leave_after` steps.
ReplicaOutcome run_replicas(int replicas, int min_replicas, std::int64_t steps, int leaver = -1,
                            std::int64_t leave_after = 0) {
  return testing_support::run_replicas({.replicas = replicas,
                                        .min_replicas = min_replicas,
                                        .steps = steps,
                                        .leaver = leaver,
                                        .leave_after = leave_after,
                                        .options = run_options(steps),
                                        .data = data});
}

void expect_equal_losses(const std::vector<double>& got, const std::vector<double>& serial, int replica) {
  for (std::size_t s = 0; s < serial.size(); ++s) {
    if (std::isnan(got[s])) continue;
    EXPECT_NEAR(got[s], serial[s], 1e-5 * std::abs(serial[s])) << "replica " << replica << " step " << s + 1;
  }
}

TEST(ElasticReplica, ThreeReplicasCommitTheSerialRunsSteps) {
  const std::vector<double> serial = serial_losses(3);
  const ReplicaOutcome out = run_replicas(3, 3, 3);
  for (int r = 0; r < 3; ++r) {
    for (std::size_t s = 0; s < serial.size(); ++s) EXPECT_FALSE(std::isnan(out.losses[r][s])) << r << " " << s;
    expect_equal_losses(out.losses[static_cast<std::size_t>(r)], serial, r);
  }
  for (int n : out.replicas) EXPECT_EQ(n, 3);
}

TEST(ElasticReplica, AReplicaThatLeavesIsDroppedAndTheStepIsRedoneByTheOthers) {
  const std::vector<double> serial = serial_losses(4);
  // Two may train, so a replica that joins late computes from a later step (healed).
  const ReplicaOutcome out = run_replicas(3, 2, 4, /*leaver=*/2, /*leave_after=*/2);
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
