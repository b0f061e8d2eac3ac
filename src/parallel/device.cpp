// The device as the last transformation of the plan: the chunks are built where they run.
// On CUDA each process takes one GPU (its local rank modulo the GPUs it sees, with one
// compute stream). What a GPU run supports so far is one rank with the whole model: the
// collectives of every other strategy run on host buffers (issue 25 brings them to the GPU
// with NCCL), so those layouts are refused here with one line each.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ndmesh/core/error.hpp"
#include "ndmesh/launch/launch_env.hpp"
#include "ndmesh/parallel/parallelize.hpp"

namespace ndmesh::parallel {

void apply_device(ModelPlan& plan, ProcessGroups& groups, const TrainOptions& o) {
  plan.device = o.device;
  if (o.device == Device::kCpu) return;
  std::vector<std::string> problems;
  if (groups.world().size() > 1)
    problems.push_back(fmt::format("--device cuda on {} ranks: training on several GPUs (NCCL, or ranks sharing a GPU) "
                                   "is not available yet; run one rank with --device cuda, or use --device cpu",
                                   groups.world().size()));
  if (plan.attention) problems.push_back("--device cuda with --cp > 1: ring attention runs on the CPU only for now");
  if (plan.split_backward)
    problems.push_back("--device cuda with --schedule zb-h1: the split backward runs on the CPU only for now; use "
                       "--schedule 1f1b");
  if (!problems.empty()) fail<ConfigError>("train", "{}", fmt::join(problems, "; "));
  cuda::init(static_cast<int>(LaunchEnv::detect().local_rank.value_or(0)));
}

}  // namespace ndmesh::parallel
