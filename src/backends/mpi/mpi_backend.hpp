// The MPI backend (Open MPI, MPICH): nonblocking MPI calls polled by the caller.
#pragma once

#include <memory>

#include "comm/backend.hpp"

namespace ndmesh::comm::mpi {

/// Initialises MPI on first call (finalised at exit) and returns MPI_COMM_WORLD.
std::shared_ptr<detail::CommImpl> make_world();

}  // namespace ndmesh::comm::mpi
