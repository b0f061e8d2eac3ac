// The Gloo backend (CPU, TCP): for jobs launched without MPI (torchrun, or any launcher
// that sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT). Groups rendezvous through
// the job's TCP store, each under its own key prefix.
#pragma once

#include <chrono>
#include <memory>

#include "comm/backend.hpp"
#include "ndmesh/launch/store.hpp"

namespace ndmesh::comm::gloo {

/// The world communicator of a store launch: a full mesh of TCP pairs between the
/// job's ranks, connected through `job.store`. Bounded by `deadline`, the end of the
/// start-up's one NDMESH_INIT_TIMEOUT_S (`timeout_s`, for the message): a rank that has
/// not published its address or connected by then is named in one line, and this process
/// exits with kTimeoutExitCode, as the rendezvous does.
std::shared_ptr<detail::CommImpl> make_world(const launch::JobStore& job, const LaunchEnv& env,
                                             std::chrono::steady_clock::time_point deadline,
                                             double timeout_s);

/// connect_store_group(): `size` processes meet under `store`'s prefix, each listening on its
/// address toward `toward`; `timeout_s` bounds the meeting and is the group's default
/// operation timeout. Its timeouts abort it (CommImpl::interrupt) instead of the job.
std::shared_ptr<detail::CommImpl> make_store_group(const launch::Store& store, int rank, int size,
                                                   const std::string& toward, double timeout_s);

}  // namespace ndmesh::comm::gloo
