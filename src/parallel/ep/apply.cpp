// Expert parallelism as a transformation of the plan: `--ep N` folds into dp x cp (as in
// Megatron-core and torchtitan): each dp-cp group is cut into expert groups of N consecutive
// members (ProcessGroups::expert), which exchange the MoE layers' tokens; each member runs
// E/N of the experts (nn::Moe). The members at the same place of every expert group hold the
// same experts (the expert-data-parallel group, ProcessGroups::expert_data); a rank stores
// only its experts (ModelPlan::shard_experts) and their gradients are summed over that group.
#include <fmt/format.h>

#include "ndmesh/core/error.hpp"
#include "ndmesh/parallel/parallelize.hpp"

namespace ndmesh::parallel {

void apply_expert_parallel(ModelPlan& plan, ProcessGroups& groups, const TrainOptions& o) {
  NDMESH_CHECK_CONFIG(o.ep >= 1, "train", "--ep={} must be at least 1", o.ep);
  if (o.model.experts > 0 && o.ep == 1 && (groups.cp().size() > 1 || groups.tp().size() > 1)) {
    // No expert parallelism, but the MoE layers sum over cp and tp (the layer's EpComm).
    plan.ep = std::make_shared<CommunicatorEpComm>(groups.expert(1), groups.cp(), groups.tp(), plan.ep_stats);
    return;
  }
  if (o.ep == 1) return;
  NDMESH_CHECK_CONFIG(
      o.model.experts > 0, "train",
      "--ep={} needs a mixture of experts (--experts N, or --model moe-tiny); a dense model has no "
      "experts to shard: use --ep 1",
      o.ep);
  const std::int64_t dp_cp = groups.dp().size() * groups.cp().size();
  NDMESH_CHECK_CONFIG(
      dp_cp % o.ep == 0, "train",
      "--ep={} must divide dp*cp = {} (expert parallelism folds into dp x cp); use --ep {} or a "
      "multiple of it as --dp",
      o.ep, dp_cp, dp_cp);
  NDMESH_CHECK_CONFIG(o.model.experts % o.ep == 0, "train", "--experts={} is not divisible by --ep={}",
                      o.model.experts, o.ep);
  plan.ep =
      std::make_shared<CommunicatorEpComm>(groups.expert(o.ep), groups.cp(), groups.tp(), plan.ep_stats);
  plan.expert_data = groups.expert_data(o.ep);  // made with the expert group, so that every rank splits alike
  // A rank stores only its experts (their gradients summed over expert_data: GradSync; under
  // ZeRO-3 sharded over edp and gathered per MoE block), except where the parameters' shard goes
  // to files (--offload optimizer+params streams the gatherer's shard alone): every rank then
  // stores every expert, gathered with its block as the dense parameters are.
  plan.shard_experts = !(o.dp.zero == 3 && o.offload.what == Offload::kOptimizerParams);
}

}  // namespace ndmesh::parallel
