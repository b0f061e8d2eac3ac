// Context parallelism as a transformation of the plan: the batch layout already gives each
// cp rank its positions of every sequence (batch_source.cpp); here attention becomes the
// ring over the cp group, which is all that talks across cp.
#include "ndmesh/parallel/cp/ring_attention.hpp"
#include "ndmesh/parallel/parallelize.hpp"

namespace ndmesh::parallel {

void apply_context_parallel(ModelPlan& plan, ProcessGroups& groups, const TrainOptions& options) {
  const comm::Communicator& cp = groups.cp();
  // On CUDA the ring runs on the model's device buffers (kernels and device communicator).
  // The positions are the batch layout's (the model is given the same: build_chunks). Under
  // bf16 products the blocks keep q, k, v in bf16, so the ring moves them in bf16.
  if (cp.size() > 1)
    plan.ring = std::make_shared<RingAttention<float>>(cp, options.device, plan.batch.positions,
                                                       options.precision == Precision::kBf16);
}

}  // namespace ndmesh::parallel
