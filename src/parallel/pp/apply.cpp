// Pipeline parallelism as a transformation of the plan: the blocks are cut into pp x v
// chunks by the one partition function the planner also uses (config/partition.hpp), the
// schedule says what each stage runs (pp/schedule.hpp), and this rank holds local chunk c =
// virtual stage c * pp + stage. Without pipeline parallelism the plan is one stage with one
// chunk, run by the same executor.
#include <algorithm>

#include "ndmesh/config/partition.hpp"
#include "ndmesh/core/error.hpp"
#include "ndmesh/parallel/parallelize.hpp"

namespace ndmesh::parallel {

void apply_pipeline_parallel(ModelPlan& plan, ProcessGroups& groups, const TrainOptions& o) {
  plan.pp = groups.pp();
  const int stage = plan.pp.rank(), stages = plan.pp.size();
  const std::int64_t v = o.pp.virtual_stages, m = plan.batch.microbatches;
  const bool interleaved = o.pp.schedule == Schedule::kInterleaved;
  // The schedule rules (virtual stages, pp > 1 and a multiple of pp micro-batches for the
  // interleaved schedule) are training_problems()'s, checked once by parallelize().
  NDMESH_CHECK((interleaved ? v >= 2 && stages > 1 && m % stages == 0 : v == 1), "train",
               "schedule {} with vpp {}, pp {} and {} micro-batches: check the run with training_problems() first",
               schedule_name(o.pp.schedule), v, stages, m);
  try {
    plan.partition = o.pp.layers.empty() ? balanced_partition(plan.spec.layers, stages, v)
                                         : parse_partition(o.pp.layers, plan.spec.layers, stages, v, "--pp-layers");
  } catch (const ConfigError& e) {
    fail<ConfigError>("train", "--layers={} over --pp={} x --vpp={}: {}", plan.spec.layers, stages, v, e.what());
  }
  plan.schedule = pp::make_schedule({.schedule = o.pp.schedule,
                                     .stages = stages,
                                     .microbatches = static_cast<int>(m),
                                     .chunks = static_cast<int>(v)});
  plan.split_backward = o.pp.schedule == Schedule::kZbH1;
  plan.chunks.clear();
  for (int c = 0; c < v; ++c) {
    const int vs = plan.schedule.virtual_stage(stage, c);
    std::int64_t first = 0;
    for (int k = 0; k < vs; ++k) first += plan.partition[static_cast<std::size_t>(k)];
    plan.chunks.push_back({.virtual_stage = vs,
                           .first_block = first,
                           .last_block = first + plan.partition[static_cast<std::size_t>(vs)]});
  }
}

}  // namespace ndmesh::parallel
