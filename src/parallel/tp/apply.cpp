// Tensor parallelism as a transformation of the plan: every layer splits over the mesh's tp
// group (Megatron's column- and row-parallel linears, the vocabulary-parallel embedding,
// head and loss live in the nn layers; see nn/tp.hpp), optionally sequence parallel.
#include "ndmesh/parallel/parallelize.hpp"

namespace ndmesh::parallel {

void apply_tensor_parallel(ModelPlan& plan, ProcessGroups& groups, const TrainOptions& o) {
  // The tp rules (sequence parallelism needs tp; tp divides heads, ffn, vocabulary and the
  // micro-batch's rows) were checked by parallelize() (training_problems) and the model
  // checks its own split when it is built.
  plan.tp = make_tp_context<float>(groups.tp(), o.sequence_parallel, plan.tp_stats);
}

}  // namespace ndmesh::parallel
