// The staged device communicator: device buffers staged through pinned host memory over a
// CPU backend (MPI or Gloo). For several ranks sharing one GPU (NCCL refuses that) and for
// GPUs whose MPI is not CUDA-aware; slow (every operation waits for the compute stream and
// copies twice), and exact: the reduction is the CPU backend's.
#pragma once

#include <cstddef>
#include <memory>

#include "ndmesh/comm/staged.hpp"

namespace ndmesh::comm::staging {

/// CUDA's device memory for comm::staged (comm/staged.hpp): pinned host buffers, copies on
/// the compute stream.
std::shared_ptr<StagingMemory> cuda_memory();

/// True when `p` is CUDA device memory (cudaPointerGetAttributes); false for host memory,
/// nullptr, or where no driver answers.
bool is_device_pointer(const void* p);

}  // namespace ndmesh::comm::staging

namespace ndmesh::comm {

/// The communicator over the members of `world` (two or more) that the strategies of a GPU run
/// use (parallel::device_communicator; cuda::init first): staged through `world`'s CPU backend
/// when NDMESH_BACKEND names mpi or gloo, else NCCL, or a ConfigError with the fix where this
/// ndmesh was built without NCCL (device_communicator.cpp) or without CUDA (without_cuda.cpp).
Communicator gpu_communicator(const Communicator& world);

}  // namespace ndmesh::comm
