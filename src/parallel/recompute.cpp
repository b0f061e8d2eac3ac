// Activation recompute as a transformation of the plan (nn::Recompute says what each mode
// keeps and recomputes; the losses are the same bit for bit in every mode).
#include "ndmesh/core/error.hpp"
#include "ndmesh/parallel/parallelize.hpp"

namespace ndmesh::parallel {

void apply_recompute(ModelPlan& plan, const TrainOptions& o) {
  // A split backward defers the weight gradients, which read the block's activations after
  // the next block has recomputed into the shared workspace.
  // (training_problems() refuses it for ndmesh train; parallelize() checked the run.)
  NDMESH_CHECK(!plan.split_backward || o.recompute == nn::Recompute::kNone, "train",
               "--recompute={} with --schedule zb-h1: check the run with training_problems() first",
               recompute_name(o.recompute));
  plan.recompute = o.recompute;
}

}  // namespace ndmesh::parallel
