// The world of a process that no launcher started: one rank, no engine (no MPI_Init, no
// store), on the in-process backend (ndmesh/comm/inproc.hpp), whose semantics it has.
#pragma once

#include <memory>

#include "comm/backend.hpp"

namespace ndmesh::comm::inproc {

/// A world of one rank, this process, named "self" (Communicator::backend()): every
/// collective returns its input, a message to rank 0 meets its receive, a wait that nothing
/// can complete times out; abort_job(code) ends the process with `code`, as MPI_Abort would.
std::shared_ptr<detail::CommImpl> make_self_world();

}  // namespace ndmesh::comm::inproc
