// The Gloo backend (CPU, TCP): for jobs launched without MPI (torchrun, or any launcher
// that sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT). Groups rendezvous through
// the job's TCP store, each under its own key prefix.
#pragma once

#include <memory>

#include "comm/backend.hpp"
#include "ndmesh/launch/store.hpp"

namespace ndmesh::comm::gloo {

/// The world communicator of a store launch: a full mesh of TCP pairs between the
/// job's ranks, connected through `job.store`.
std::shared_ptr<detail::CommImpl> make_world(const launch::JobStore& job, const LaunchEnv& env);

}  // namespace ndmesh::comm::gloo
