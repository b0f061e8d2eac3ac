// Data parallelism as a transformation of the plan: parameters are replicated over dp and
// cp, so their gradients are summed over the dp-cp group (the gradient group); ZeRO cuts
// the flat buffers into equal shards of that group, so they are padded to its size.
#include "ndmesh/parallel/parallelize.hpp"

namespace ndmesh::parallel {

void apply_data_parallel(ModelPlan& plan, ProcessGroups& groups, const TrainOptions& o) {
  plan.grad_group = plan.batch.cp_size > 1 ? groups.cp_dp() : groups.dp();
  plan.store.pad_to = o.dp.zero > 0 ? plan.grad_group.size() : 1;
  // The experts a rank stores (ModelPlan::shard_experts) are sharded over the ranks that hold
  // the same experts.
  plan.store.expert_pad_to = o.dp.zero > 0 && plan.shard_experts ? plan.expert_data.size() : 1;
  // ZeRO 2 and 3 reduce-scatter unit by unit (GradReducer::per_unit): each unit's range is
  // padded to a multiple of the group too (each MoE block's stored experts to one of edp).
  plan.store.pad_units = plan.grad_group.size() > 1 && o.dp.zero >= 2;
  // ZeRO-3 frees units in place; on a GPU that takes mappable memory (ParamGatherer).
  plan.store.mappable_params = o.dp.zero == 3 && o.device == Device::kCuda;
  // A ZeRO-3 rank keeps its block of every unit (ParamGatherer::shard): the model writes
  // only those, so the full parameters are never resident, not even while it is built.
  if (o.dp.zero == 3 && plan.store.pad_units) {
    plan.store.keep_parts = plan.grad_group.size();
    plan.store.keep_part = plan.grad_group.rank();
    // The experts a rank stores likewise: one block of each MoE block's experts per member of
    // the expert-data-parallel group (GradSync gathers them over that group).
    if (plan.shard_experts && plan.expert_data.size() > 1) {
      plan.store.expert_keep_parts = plan.expert_data.size();
      plan.store.expert_keep_part = plan.expert_data.rank();
    }
  }
  // So does the per-unit gradient work space (GradReducer::own_workspace).
  plan.store.mappable_grads = plan.store.pad_units && o.device == Device::kCuda;
  // The next block's norm would read a block's bias after ZeRO 2/3 released its unit.
  plan.fuse_closing_add = !plan.store.pad_units;
}

}  // namespace ndmesh::parallel
