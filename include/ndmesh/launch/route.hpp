// The address of this host that peers on the far side of a route reach.
#pragma once

#include <string>
#include <string_view>

namespace ndmesh::launch {

/// This host's address on its route to `host` (found with a UDP connect, which sends
/// nothing): loopback jobs stay on 127.0.0.1 and a multi-node job uses the interface that
/// faces `host`. The errors name `host` as `named` (e.g. "MASTER_ADDR=node1") under
/// `component`: a host that does not resolve is a ConfigError ending with `fix`; no route
/// is an Error.
std::string local_address_toward(const std::string& host, std::string_view component, std::string_view named,
                                 std::string_view fix);

}  // namespace ndmesh::launch
