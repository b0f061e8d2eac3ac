// The device as the last transformation of the plan: the chunks are built where they run.
// On CUDA each process takes one GPU (its local rank modulo the GPUs it sees, with one
// compute stream). Several GPU ranks communicate through a device communicator
// (comm::gpu_communicator): NCCL, or the CPU backend with device buffers staged through pinned
// host memory. Every strategy runs on the device: ring attention (cp) on the device
// communicator of the cp group, the split backward (zb-h1) with its deferred gradients in
// device memory.
#include "backends/staged/staged_backend.hpp"
#include "ndmesh/launch/launch_env.hpp"
#include "ndmesh/parallel/parallelize.hpp"

namespace ndmesh::parallel {

namespace {
int local_rank() { return static_cast<int>(LaunchEnv::detect().local_rank.value_or(0)); }
}  // namespace

comm::Communicator device_communicator(const comm::Communicator& world, Device device) {
  if (device == Device::kCpu) return world;
  // Before any group exists: a rank without a GPU ends with its own line, never with a peer's
  // store or group gone.
  ops::init_device(device, local_rank());
  if (world.size() <= 1) return world;
  return comm::gpu_communicator(world);
}

void apply_device(ModelPlan& plan, ProcessGroups& groups, const TrainOptions& o) {
  (void)groups;
  plan.device = o.device;
  ops::init_device(o.device, local_rank());
}

}  // namespace ndmesh::parallel
