// All-reduce algorithms written once over the Communicator's point-to-point (seed 002's
// ring, tree, hierarchical and adaptive), usable on any group, next to the engine's own
// MPI_Allreduce.
//
// Every algorithm is a per-rank program of steps; a step posts nonblocking sends and
// receives, and once they have all completed applies its local reductions. A
// PendingAllReduce advances the program as far as it can without blocking whenever it is
// polled (Open MPI moves data only inside MPI calls), so a caller overlapping compute
// polls it between layers and waits at the end.
//  - ring: reduce-scatter then all-gather, p-1 steps each, over chunks of n/p elements
//    (the bandwidth-optimal 2(p-1)/p n per rank); chunk sizes differ by at most one.
//  - tree: binary-tree reduce to group rank 0, then broadcast down the same tree
//    (2 log2 p latency steps: for small messages); each 256 KiB segment goes down as soon
//    as it is reduced.
//  - hierarchical: inter-node traffic once per node, in three parts that run side by side
//    on segments (pipelined). On nodes of equal size: ring reduce-scatter inside each node,
//    ring all-reduce across nodes of the chunk each local rank then holds (every local
//    rank at once, with its peers of the same local rank), ring all-gather inside the
//    node (4 MiB segments). Otherwise: tree reduce inside each node to its first rank, ring
//    all-reduce across the node leaders, tree broadcast inside the node (2 MiB segments).
//  - adaptive: tree below 64 KiB; above it hierarchical when the group spans nodes and has
//    more than one rank per node, else ring (a documented table, see allreduce.cpp).
// Only sums are supported. Every rank ends with identical values: each element's final
// value is computed on one rank and copied. Integers are exact.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "ndmesh/comm/communicator.hpp"
#include "ndmesh/comm/tags.hpp"

namespace ndmesh::comm {

/// Which all-reduce to run.
enum class AllReduceAlgorithm { kMpi, kRing, kTree, kHierarchical, kAdaptive };

/// "mpi", "ring", "tree", "hierarchical", "adaptive".
std::string_view algorithm_name(AllReduceAlgorithm a);
/// Parses an algorithm name; ConfigError naming `flag`, the value and the valid names.
AllReduceAlgorithm parse_algorithm(std::string_view name, std::string_view flag = "--allreduce");

namespace detail {
struct AllReduceProgram;
struct ScratchPool;
}

/// One all-reduce in flight. `data` belongs to the operation until done() is true or
/// wait() returns; then it holds the sum over the group.
class PendingAllReduce {
 public:
  PendingAllReduce();
  PendingAllReduce(PendingAllReduce&&) noexcept;
  PendingAllReduce& operator=(PendingAllReduce&&) noexcept;
  ~PendingAllReduce();

  /// Advances without blocking; true once complete.
  bool test();
  /// Blocks until complete (each transfer honours the communicator's timeout).
  void wait();
  /// True once complete.
  bool done() const;

 private:
  friend class AllReducer;
  explicit PendingAllReduce(std::unique_ptr<detail::AllReduceProgram> program);
  std::unique_ptr<detail::AllReduceProgram> program_;
  Work mpi_;  // the engine's all-reduce (AllReduceAlgorithm::kMpi)
};

/// Options of an AllReducer.
struct AllReducerOptions {
  AllReduceAlgorithm algorithm = AllReduceAlgorithm::kMpi;
  /// For hierarchical (and adaptive): ranks per node, counting world ranks from 0
  /// (simulated nodes); 0: the real nodes (a shared-memory split).
  std::int64_t ranks_per_node = 0;
  /// First tag of the point-to-point messages, on the reducer's own duplicate of the
  /// group (comm/tags.hpp); all-reduces in flight at once use the next ones.
  int tag = tags::kAllReduceFirst;
};

/// All-reduces (sums) over one group with a chosen algorithm. Construction is collective
/// over the group for every algorithm but kMpi: the algorithms send on their own duplicate
/// of the group (and hierarchical and adaptive split it into node sub-groups). Copies share
/// that communicator and its tag sequence. The reducer must outlive the PendingAllReduce
/// it starts (they use its communicators).
class AllReducer {
 public:
  AllReducer() = default;
  AllReducer(Communicator group, AllReducerOptions options = {});

  /// Starts summing `data` over the group (every member calls with the same count).
  template <Element T>
  PendingAllReduce start(std::span<T> data) {
    return start_impl(ElementSpan::of(data));
  }
  /// Blocking form.
  template <Element T>
  void all_reduce(std::span<T> data) {
    start(data).wait();
  }

  /// The algorithm a message of `bytes` runs with (resolves adaptive).
  AllReduceAlgorithm choose(std::size_t bytes) const;
  const Communicator& group() const { return group_; }
  /// True when the group's ranks sit on more than one node.
  bool spans_nodes() const { return nodes_ > 1; }

 private:
  PendingAllReduce start_impl(ElementSpan data);

  Communicator group_;
  AllReducerOptions options_;
  Communicator intra_;    // the members on this rank's node
  Communicator leaders_;  // the first member of each node (empty handle elsewhere)
  // Nodes of equal size only: the members of the same local rank on every node, and a
  // second communicator of the node (the all-gather's).
  Communicator cross_, gather_;
  std::int64_t nodes_ = 1;
  std::shared_ptr<detail::ScratchPool> pool_;  // scratch buffers reused across calls
};

/// Ring reduce-scatter (sum) in place: `data` holds group.size() equal blocks; afterwards
/// block group.rank() holds the sum of every member's block (the other blocks are left
/// unspecified). The ring's reduce-scatter half over the group's point-to-point, p-1 steps
/// in which each rank sends and receives one block: (p-1)/p of the data per rank, half of
/// what an all-reduce moves. Blocking; every member calls it. It sends with `tag` on
/// `group` itself, so the caller gives it a communicator that carries no other messages of
/// that tag (the Gloo backend's reduce_scatter runs it on a duplicate of its own).
void ring_reduce_scatter(const Communicator& group, ElementSpan data, int tag = tags::kReduceScatter);

}  // namespace ndmesh::comm
