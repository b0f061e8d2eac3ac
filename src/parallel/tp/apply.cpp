// Tensor parallelism as a transformation of the plan: every layer splits over the mesh's tp
// group (Megatron's column- and row-parallel linears, the vocabulary-parallel embedding,
// head and loss live in the nn layers; see nn/tp.hpp), optionally sequence parallel.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ndmesh/core/error.hpp"
#include "ndmesh/parallel/parallelize.hpp"

namespace ndmesh::parallel {

void apply_tensor_parallel(ModelPlan& plan, ProcessGroups& groups, const TrainOptions& o) {
  const comm::Communicator& tp = groups.tp();
  NDMESH_CHECK_CONFIG(!o.sequence_parallel || tp.size() > 1, "train",
                      "--sequence-parallel needs --tp > 1 (it splits the tokens of the norms over tp); add --tp 2 "
                      "or leave it out");
  if (auto problems = model::gpt_tp_problems(plan.spec, tp.size(), o.sequence_parallel, plan.batch.micro_tokens());
      !problems.empty())
    fail<ConfigError>("train", "{}", fmt::join(problems, "; "));
  plan.tp = make_tp_context<float>(tp, o.sequence_parallel, plan.tp_stats);
}

}  // namespace ndmesh::parallel
