// The in-process backend: the ranks of a job are threads of this process, behind the same
// Communicator as MPI's (like Gloo's and PyTorch's in-process test groups). It exists for
// tests of multi-rank components (gradient reducers, the pipeline executor, ring
// attention, the all-reduce algorithms): a job of a few ranks starts in microseconds, runs
// under a debugger or a sanitizer in one process, and a failing comparison names the rank
// and the tensor. The mpirun tests stay the end-to-end layer.
//
// Semantics (those of MPI where a caller can tell the difference):
//  - Point-to-point messages match on (communicator, source, tag) in posting order. A send
//    completes only once the receive has taken its data (rendezvous, as MPI does for
//    large messages: a program that relies on buffered small sends deadlocks here, and
//    may under MPI). A receive of another element count or type is an Error.
//  - Collectives match by their position on the communicator; the last member to arrive
//    computes the result for every member (reductions in rank order, so every member gets
//    the same bits). Members that call different collectives, counts, types, roots or
//    reductions at the same position all get an Error naming both calls (MPI would hang
//    or corrupt memory).
//  - split, dup, self and split_node (nodes of JobOptions::ranks_per_node ranks) as in MPI.
//  - Timeouts: every operation honours its timeout (JobOptions::timeout_s is the ranks'
//    NDMESH_TIMEOUT_S). On expiry the job ends as a comm::TimeoutError carrying the line
//    MPI jobs print before they abort ("[comm] recv from rank 1 (world 1) on group pp
//    (ranks 0,1) timed out after 0.2 s"), thrown by every rank's operation in flight or
//    started later: a hang is a test failure in one process, not a killed job.
//  - A rank whose body throws ends the job the same way (the others' operations throw
//    comm::JobAborted naming it); a rank whose body returns while another still waits for
//    it (a send it never made, a collective it skipped) fails that wait at once with an
//    Error naming the rank, instead of at the timeout.
//  - Log lines written by a rank's thread start with "[rank r]".
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "ndmesh/comm/communicator.hpp"

namespace ndmesh::comm::inproc {

/// Options of an in-process job.
struct JobOptions {
  /// The default timeout of every operation of the ranks (NDMESH_TIMEOUT_S's role); 0:
  /// NDMESH_TIMEOUT_S. Tests of hangs pass a fraction of a second.
  double timeout_s = 30;
  /// split_node() groups consecutive ranks into nodes of this many; 0: one node.
  std::int64_t ranks_per_node = 0;
  /// Point-to-point messages match in issue order per peer and communicator, their tags
  /// ignored: NCCL's semantics (it has no tags), for tests of what runs on its device
  /// communicators. A send and a receive of different sizes that meet fail the receive.
  bool tagless = false;
};

/// The in-process twin of connect_store_group(): `size` ranks of the job of `member` (any
/// communicator of it) meet under `key` (one no other group uses), this one as `rank`, and
/// get a group named `name` whose failures stay inside it: a timeout (`timeout_s` is its
/// operations' default; 0: the job's), a member that returned from its body or abort()
/// ends the group's operations with an exception on its members, never the job. Blocks
/// until every member arrived; a TimeoutError after `timeout_s` (or the job's timeout).
Communicator connect_group(const Communicator& member, const std::string& key, int rank, int size,
                           const std::string& name, double timeout_s = 0);

/// Runs `body(world)` on `ranks` threads, thread r as rank r of a new job whose world
/// communicator ("world", backend "inproc") it receives. Returns when every thread has
/// returned. When a rank threw, the job was ended for the others (see above) and the
/// exception of the rank that ended the job is rethrown here (a TimeoutError, an
/// Error, or whatever the body threw, e.g. an exception of a failed test helper).
void run(int ranks, const std::function<void(const Communicator& world)>& body,
         const JobOptions& options = {});

}  // namespace ndmesh::comm::inproc
