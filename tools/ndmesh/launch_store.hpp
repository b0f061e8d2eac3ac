// `ndmesh launch --store`: N local ranks with torchrun's variables, no mpirun.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ndmesh::cli {

/// Starts `n` processes of `program` with torchrun's variables (rank 0 serves the store at
/// 127.0.0.1 on a port this launcher holds for the job, so no other program takes it in
/// between; the ranks use Gloo), prefixing their output lines with "[rank] " when `tag`;
/// returns the first non-zero exit status, else 0. Each rank is the leader of its own
/// process group, which is what gets signalled (a rank started through `bash -c` or a
/// Python wrapper leaves no child behind), and dies with the launcher (parent-death
/// signal). When a rank fails, the others get SIGTERM; SIGINT, SIGTERM and SIGHUP sent to
/// the launcher are passed on to every rank (then the status is 128 + the signal); ranks
/// still there `grace_s` later get SIGKILL, as does a second such signal at once. With
/// `dry_run`, prints the equivalent shell lines instead.
int launch_store(std::int64_t n, const std::vector<std::string>& program, bool tag, bool dry_run, double grace_s);

}  // namespace ndmesh::cli
