// The NCCL device communicator: several GPU ranks, one GPU each (docs/comm.md, "On GPUs").
#pragma once

#include <memory>

#include "comm/backend.hpp"

namespace ndmesh::comm::nccl {

/// A communicator with the members of `cpu` (the bootstrap: MPI or Gloo) whose operations on
/// device buffers run on NCCL, stream-ordered; host buffers go to `cpu`. The NCCL
/// communicator is made here (with more than one member), from a unique id that rank 0 shares
/// over the job's store (or `cpu` under MPI). Its splits and duplicates are NCCL too.
std::shared_ptr<detail::CommImpl> wrap(std::shared_ptr<detail::CommImpl> cpu);

/// "2.28.9": the NCCL library loaded.
std::string version();

}  // namespace ndmesh::comm::nccl
