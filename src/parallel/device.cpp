// The device as the last transformation of the plan: the chunks are built where they run.
// On CUDA each process takes one GPU (its local rank modulo the GPUs it sees, with one
// compute stream). Several GPU ranks communicate through a device communicator
// (device_communicator): NCCL, or the CPU backend with device buffers staged through pinned
// host memory. Every strategy runs on the device: ring attention (cp) on the device
// communicator of the cp group, the split backward (zb-h1) with its deferred gradients in
// device memory.
#include <fmt/format.h>

#include "comm/backend.hpp"
#include "ndmesh/core/env.hpp"
#include "ndmesh/core/error.hpp"
#include "ndmesh/launch/launch_env.hpp"
#include "ndmesh/parallel/parallelize.hpp"
#if NDMESH_WITH_CUDA
#include "backends/staged/staged_backend.hpp"
#endif
#if NDMESH_WITH_NCCL
#include "backends/nccl/nccl_backend.hpp"
#endif

namespace ndmesh::parallel {

comm::Communicator device_communicator(const comm::Communicator& world, Device device) {
  if (device == Device::kCpu) return world;
  // Before any group exists: a rank without a GPU ends with its own line, never with a peer's
  // store or group gone.
  cuda::init(static_cast<int>(LaunchEnv::detect().local_rank.value_or(0)));
  if (world.size() <= 1) return world;
#if NDMESH_WITH_CUDA
  // NDMESH_BACKEND names the CPU backend; naming mpi or gloo on a GPU run stages through it.
  const std::string backend = env::string("NDMESH_BACKEND", "");
  if (backend == "mpi" || backend == "gloo")
    return comm::staged(world, comm::staging::cuda_memory());
#if NDMESH_WITH_NCCL
  return comm::detail::make_communicator(comm::nccl::wrap(comm::detail::impl_of(world)), world.name());
#else
  fail<ConfigError>("train",
                    "--device cuda on {} ranks: this ndmesh was built without NCCL (nccl.h and libnccl were not "
                    "found); rebuild where NCCL is installed, or set NDMESH_BACKEND={} to stage device buffers "
                    "through host memory",
                    world.size(), world.backend() == "mpi" ? "mpi" : "gloo");
#endif
#else
  return world;  // not reached: cuda::init said why CUDA cannot run
#endif
}

void apply_device(ModelPlan& plan, ProcessGroups& groups, const TrainOptions& o) {
  (void)groups;
  plan.device = o.device;
  if (o.device == Device::kCpu) return;
  cuda::init(static_cast<int>(LaunchEnv::detect().local_rank.value_or(0)));
}

}  // namespace ndmesh::parallel
