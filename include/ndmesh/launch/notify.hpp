// The line a rank sends to the `ndmesh launch` that supervises its job before it ends the
// job (a communication timeout), so that the launcher can end mpirun too when mpirun
// itself cannot: Open MPI's mpirun waits for the daemon of a node it can no longer reach.
// `ndmesh launch` creates a datagram socket and passes its path to every rank in
// NDMESH_LAUNCH_NOTIFY; the ranks on its node reach it (a node-local path), the others
// are ended by the launcher or by their own timeouts.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace ndmesh {

/// Sends `line` to the supervising `ndmesh launch` (NDMESH_LAUNCH_NOTIFY), if there is
/// one and this node can reach it. Best effort: never blocks, never throws.
void notify_launcher(std::string_view line) noexcept;

/// Largest line notify_launcher sends (longer lines are cut).
inline constexpr std::size_t kNotifyMaxBytes = 1024;

/// What a timeout line says when its group spans several nodes ("...; the group spans
/// nodes node0,node1"); the watchdog's formatter writes it, the launcher looks for it.
inline constexpr std::string_view kSpansNodes = "; the group spans ";

/// Of the lines the ranks sent, in arrival order, the one the launcher shows: the first
/// that names a group across nodes, else the first. When a link between nodes fails, the
/// ranks of one node that wait in a group within the node wait for a peer stuck across
/// the nodes, and may time out first; the line across nodes says where the fault is.
/// Empty when `lines` is.
std::string_view telling_report(const std::vector<std::string>& lines);

}  // namespace ndmesh
