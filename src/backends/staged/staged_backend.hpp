// The staged device communicator: device buffers staged through pinned host memory over a
// CPU backend (MPI or Gloo). For several ranks sharing one GPU (NCCL refuses that) and for
// GPUs whose MPI is not CUDA-aware; slow (every operation waits for the compute stream and
// copies twice), and exact: the reduction is the CPU backend's.
#pragma once

#include <cstddef>
#include <memory>

#include "comm/backend.hpp"

namespace ndmesh::comm::staged {

/// A communicator with the members of `cpu` whose operations on device buffers stage them
/// through pinned host memory; host buffers go to `cpu` as they are. Its splits and
/// duplicates are staged too.
std::shared_ptr<detail::CommImpl> wrap(std::shared_ptr<detail::CommImpl> cpu);

/// True when `p` is CUDA device memory (cudaPointerGetAttributes); false for host memory,
/// nullptr, or where no driver answers.
bool is_device_pointer(const void* p);

}  // namespace ndmesh::comm::staged
