// Data parallelism as a transformation of the plan: parameters are replicated over dp and
// cp, so their gradients are summed over the dp-cp group (the gradient group); ZeRO cuts
// the flat buffers into equal shards of that group, so they are padded to its size.
#include "ndmesh/parallel/parallelize.hpp"

namespace ndmesh::parallel {

void apply_data_parallel(ModelPlan& plan, ProcessGroups& groups, const TrainOptions& o) {
  plan.grad_group = plan.batch.cp_size > 1 ? groups.cp_dp() : groups.dp();
  plan.pad_to = o.dp.zero > 0 ? plan.grad_group.size() : 1;
  plan.pad_units = o.dp.zero == 3 && plan.grad_group.size() > 1;
}

}  // namespace ndmesh::parallel
