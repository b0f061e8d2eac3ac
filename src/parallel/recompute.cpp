// Activation recompute as a transformation of the plan (nn::Recompute says what each mode
// keeps and recomputes; the losses are the same bit for bit in every mode).
#include "ndmesh/core/error.hpp"
#include "ndmesh/parallel/parallelize.hpp"

namespace ndmesh::parallel {

void apply_recompute(ModelPlan& plan, const TrainOptions& o) {
  // A split backward defers the weight gradients, which read the block's activations after
  // the next block has recomputed into the shared workspace.
  NDMESH_CHECK_CONFIG(!plan.split_backward || o.recompute == nn::Recompute::kNone, "train",
                      "--recompute={} with --schedule zb-h1: recompute with a split backward is not implemented "
                      "yet; use --recompute none or --schedule 1f1b",
                      nn::recompute_name(o.recompute));
  plan.recompute = o.recompute;
}

}  // namespace ndmesh::parallel
