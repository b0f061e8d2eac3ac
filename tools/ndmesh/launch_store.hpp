// `ndmesh launch --store`: N local ranks with torchrun's variables, no mpirun.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ndmesh::cli {

/// Starts `n` processes of `program` with torchrun's variables (rank 0 serves the store at
/// 127.0.0.1 on a free port; the ranks use Gloo), prefixing their output lines with
/// "[rank] " when `tag`; returns the first non-zero exit status (the others are then
/// sent SIGTERM), else 0. With `dry_run`, prints the equivalent shell lines instead.
int launch_store(std::int64_t n, const std::vector<std::string>& program, bool tag, bool dry_run);

}  // namespace ndmesh::cli
