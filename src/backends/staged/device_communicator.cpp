// The device communicator of a multi-rank GPU run (staged_backend.hpp): the staged backend or
// NCCL, whichever this build and NDMESH_BACKEND give.
#include <string>

#include "backends/staged/staged_backend.hpp"
#include "comm/backend.hpp"
#include "ndmesh/core/env.hpp"
#include "ndmesh/core/error.hpp"
#if NDMESH_WITH_NCCL
#include "backends/nccl/nccl_backend.hpp"
#endif

namespace ndmesh::comm {

Communicator gpu_communicator(const Communicator& world) {
  // NDMESH_BACKEND names the CPU backend; naming mpi or gloo on a GPU run stages through it.
  const std::string backend = env::string("NDMESH_BACKEND", "");
  if (backend == "mpi" || backend == "gloo") return staged(world, staging::cuda_memory());
#if NDMESH_WITH_NCCL
  return detail::make_communicator(nccl::wrap(detail::impl_of(world)), world.name());
#else
  fail<ConfigError>("train",
                    "--device cuda on {} ranks: this ndmesh was built without NCCL (nccl.h and libnccl were not "
                    "found); rebuild where NCCL is installed, or set NDMESH_BACKEND={} to stage device buffers "
                    "through host memory",
                    world.size(), world.backend() == "mpi" ? "mpi" : "gloo");
#endif
}

}  // namespace ndmesh::comm
