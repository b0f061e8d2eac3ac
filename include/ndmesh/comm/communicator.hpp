// Communicator: a cheap value handle over a backend communicator (MPI now; one folder
// per backend under src/backends/), with collectives, point-to-point, async work and
// split.
//
// Counts are elements: every operation takes typed spans of float, double, int32 or
// int64. Every blocking or awaited operation honours a timeout (Options::timeout_s;
// default NDMESH_TIMEOUT_S, the same for every group): a blocking call is watched by a
// watchdog thread, an awaited one polls the backend's nonblocking call against its
// deadline, and on expiry the process prints
//   [comm] all_reduce on group tp (ranks 0,1) timed out after 30 s
// and aborts the whole job with a non-zero exit, because a peer that never arrives
// leaves the collective in a state no rank can recover from. The one exception is the
// in-process backend of the tests (comm/inproc.hpp: ranks are threads of one process),
// where the same message ends the job as a TimeoutError on every rank instead, and a
// group made by connect_store_group(), whose failures stay inside it: there the line is
// thrown as a TimeoutError on this rank and the group is aborted (see abort()).
//
// Collective calls must be made by every member of the group in the same order, with
// the same counts; buffers passed to an *_async call must stay alive until its Work is
// complete.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ndmesh/core/dtype.hpp"
#include "ndmesh/core/error.hpp"
#include "ndmesh/launch/launch_env.hpp"
#include "ndmesh/launch/store.hpp"

namespace ndmesh::comm {

class Communicator;

namespace detail {
class CommImpl;
class WorkImpl;
struct WorkState;
/// A handle over a backend communicator (what a backend's world maker returns).
Communicator make_communicator(std::shared_ptr<CommImpl> impl, std::string name);
std::shared_ptr<CommImpl> impl_of(const Communicator& c);
/// What runs when an operation completes: an in-place reduce_scatter moves its result
/// block to where the caller expects it, then avg divides the summed elements by the size.
struct Finish {
  ElementSpan data;
  int divisor = 0;                ///< 0: nothing to divide
  const void* move_from = nullptr;  ///< copy data.bytes() from here to data.data first
  void operator()() const;
};
}  // namespace detail

/// Reduction applied by all_reduce and reduce_scatter.
enum class ReduceOp { kSum, kAvg, kMax, kMin };

/// "sum", "avg", "max", "min".
std::string_view reduce_op_name(ReduceOp op);

/// Options of every operation; fields that do not apply are ignored.
struct Options {
  ReduceOp op = ReduceOp::kSum;  ///< all_reduce, reduce_scatter (avg needs a floating type)
  double timeout_s = 0;          ///< 0: NDMESH_TIMEOUT_S (default 300 s)
  int tag = 0;                   ///< send / recv: messages match on (peer, tag), in order
};

/// The default timeout of every communication: NDMESH_TIMEOUT_S, else 300 s.
double default_timeout_s();

/// Exit status of a job aborted by a communication timeout (as coreutils' timeout).
inline constexpr int kTimeoutExitCode = 124;

/// A communication that did not complete within its timeout, on a job whose ranks are
/// threads of this process (comm/inproc.hpp); what() is the line other backends print
/// before they abort the job ("[comm] recv from rank 1 (world 1) on group pp (ranks 0,1)
/// timed out after 0.2 s"). Every rank of that job gets it.
class TimeoutError : public Error {
 public:
  using Error::Error;
};

/// An in-process job (comm/inproc.hpp) ended by a failure on another rank: what() names
/// that rank and its error. Thrown by every later operation of the job's other ranks.
class JobAborted : public Error {
 public:
  using Error::Error;
};

/// An operation on a communicator ended by Communicator::abort(): what() is the reason
/// given there. Thrown by the aborted rank's operations in flight and later ones, and, where
/// the backend lets them notice (gloo, inproc), by the other members' operations with it.
class Aborted : public Error {
 public:
  using Error::Error;
};

/// An operation in flight. Copies share the same operation. wait() returns when it is
/// complete (or aborts the job at the timeout); test() polls without blocking and
/// allocates nothing. An unfinished Work is waited for when its last copy goes away.
class Work {
 public:
  /// A completed no-op.
  Work() = default;
  /// Blocks until complete; on timeout prints the message and aborts the job.
  void wait();
  /// True once complete (runs the completion step, e.g. the division of avg, once).
  bool test();
  /// True when this Work was complete at the last wait() or test().
  bool done() const;

 private:
  friend class Communicator;
  friend void wait_all(std::span<Work> works);

  /// Waits until at least one Work of `works` is complete (at once if one already is, or if
  /// `works` is empty), polling like wait_all; each honours its own timeout.
  void wait_any(std::span<Work> works);
  friend void wait_any(std::span<Work> works);
  explicit Work(std::shared_ptr<detail::WorkState> state) : state_(std::move(state)) {}
  std::shared_ptr<detail::WorkState> state_;
};

/// Waits until every Work of `works` is complete, polling all of them in turn (so that
/// operations on several groups progress together); each honours its own timeout.
void wait_all(std::span<Work> works);

/// Waits until at least one Work of `works` is complete (at once if one already is, or if
/// `works` is empty), polling like wait_all; each honours its own timeout.
void wait_any(std::span<Work> works);

/// A group of ranks that communicate. Cheap to copy; copies share the backend
/// communicator, which is freed when the last copy goes away.
class Communicator {
 public:
  /// The empty handle: no group (what split() returns to a rank without a color).
  Communicator() = default;

  /// The world of every process of the job, created on first call by the backend named
  /// by NDMESH_BACKEND (default: "mpi" under an MPI launcher, "gloo" under torchrun, "self",
  /// a world of one without an engine, for a process that nothing launched). Checks the
  /// launcher first (LaunchEnv): a process started by torchrun gets a ConfigError saying how
  /// to launch instead, and a launcher world size that differs from the engine's is a
  /// ConfigError naming the variables.
  static Communicator world();

  /// False for the empty handle.
  bool valid() const { return impl_ != nullptr; }
  explicit operator bool() const { return valid(); }
  /// This process's rank in the group; -1 for the empty handle.
  int rank() const;
  /// Number of members; 0 for the empty handle.
  int size() const;
  /// Name shown in messages ("world", "tp", "dp-cp").
  const std::string& name() const { return name_; }
  /// The same communicator under another name (shares the backend communicator).
  Communicator named(std::string name) const;
  /// World ranks of the members, in group-rank order.
  const std::vector<std::int64_t>& members() const;
  /// "ranks 0,1" (abbreviated for large groups), for messages.
  std::string members_string() const;
  /// "<op> on group <name> (ranks ...) timed out after <t> s", with "; the group spans
  /// nodes node0,node1" when the members sit on several nodes: the line every timeout
  /// prints (the watchdog's too), so that a fault between hosts names them.
  std::string timeout_line(std::string_view op, double timeout_s) const;
  /// Name of the backend ("mpi", "gloo", "inproc", "self").
  std::string_view backend() const;
  /// Empty when several threads may call operations of this communicator at once (MPI
  /// initialised with MPI_THREAD_MULTIPLE); otherwise why not ("MPI provides
  /// MPI_THREAD_SERIALIZED ..."), for the one line of whoever would have used a thread.
  std::string thread_limit() const;

  /// Splits the group: members with the same color form one new group, ordered by key
  /// (ties by rank). A member passing no color (nullopt) gets the empty handle. Every
  /// member must call it. `name` names the new group in messages; opts.timeout_s bounds
  /// the wait for the other members.
  Communicator split(std::optional<std::int64_t> color, std::int64_t key, std::string name = "",
                     const Options& opts = {}) const;
  /// The same members in the same order, as a new communicator whose messages never
  /// match this one's (MPI_Comm_dup): a subsystem that sends point-to-point messages
  /// (pipeline executor, ring attention, all-reduce algorithms) works on its own
  /// duplicate, so its tags cannot collide with another's on a shared group (see
  /// comm/tags.hpp). Collective over the group; `name` names it in messages (default:
  /// this one's name).
  Communicator dup(std::string name = "", const Options& opts = {}) const;

  /// Connects this rank with `peers` for point-to-point messages in both directions, before
  /// the first one. Every rank named must call it naming this one (the pipeline executor:
  /// each stage its neighbours). NCCL needs it where two ranks first meet asymmetrically:
  /// its first send/recv group with a peer exchanges the connection details of every
  /// direction in that group and expects the peer's group to mirror them (a stage that
  /// sends and receives in one group, its neighbour only receiving, fails with "Message
  /// truncated" in NCCL's bootstrap; NVIDIA/nccl#1279). Other backends connect on demand:
  /// nothing happens there. opts.timeout_s bounds the wait for the peers.
  void connect_peers(std::span<const int> peers, const Options& opts = {}) const;

  /// Waits until every member has arrived.
  void barrier(const Options& opts = {}) const { barrier_impl(opts, true); }
  Work barrier_async(const Options& opts = {}) const { return barrier_impl(opts, false); }

  /// Copies `data` of group rank `root` to every member.
  template <Element T>
  void broadcast(std::span<T> data, int root, const Options& opts = {}) const {
    broadcast_impl(ElementSpan::of(data), root, opts, true);
  }
  template <Element T>
  Work broadcast_async(std::span<T> data, int root, const Options& opts = {}) const {
    return broadcast_impl(ElementSpan::of(data), root, opts, false);
  }

  /// In place: every member ends with the reduction (opts.op) of all members' `data`.
  template <Element T>
  void all_reduce(std::span<T> data, const Options& opts = {}) const {
    all_reduce_impl(ElementSpan::of(data), opts, true);
  }
  template <Element T>
  Work all_reduce_async(std::span<T> data, const Options& opts = {}) const {
    return all_reduce_impl(ElementSpan::of(data), opts, false);
  }

  /// `in` holds size() blocks of out.size() elements; member i receives in `out` the
  /// reduction of every member's block i.
  template <Element T>
  void reduce_scatter(std::span<const T> in, std::span<T> out, const Options& opts = {}) const {
    reduce_scatter_impl(in_view(in), ElementSpan::of(out), opts, true);
  }
  template <Element T>
  Work reduce_scatter_async(std::span<const T> in, std::span<T> out, const Options& opts = {}) const {
    return reduce_scatter_impl(in_view(in), ElementSpan::of(out), opts, false);
  }

  /// In place: `data` holds size() equal blocks; afterwards block rank() holds the
  /// reduction of every member's block rank() (the other blocks are left unspecified).
  /// Nothing of `data` may be touched until the Work completes.
  template <Element T>
  void reduce_scatter_in_place(std::span<T> data, const Options& opts = {}) const {
    reduce_scatter_in_place_impl(ElementSpan::of(data), opts, true);
  }
  template <Element T>
  Work reduce_scatter_in_place_async(std::span<T> data, const Options& opts = {}) const {
    return reduce_scatter_in_place_impl(ElementSpan::of(data), opts, false);
  }

  /// In place: `data` holds size() equal blocks; block rank() is this member's input and
  /// afterwards every block j holds member j's. Nothing of `data` may be touched until
  /// the Work completes.
  template <Element T>
  void all_gather_in_place(std::span<T> data, const Options& opts = {}) const {
    all_gather_in_place_impl(ElementSpan::of(data), opts, true);
  }
  template <Element T>
  Work all_gather_in_place_async(std::span<T> data, const Options& opts = {}) const {
    return all_gather_in_place_impl(ElementSpan::of(data), opts, false);
  }

  /// `out` (size() * in.size() elements) receives every member's `in`, in rank order.
  template <Element T>
  void all_gather(std::span<const T> in, std::span<T> out, const Options& opts = {}) const {
    all_gather_impl(in_view(in), ElementSpan::of(out), opts, true);
  }
  template <Element T>
  Work all_gather_async(std::span<const T> in, std::span<T> out, const Options& opts = {}) const {
    return all_gather_impl(in_view(in), ElementSpan::of(out), opts, false);
  }

  /// `in` and `out` hold size() equal blocks; block j of `in` goes to member j, which
  /// stores it as block i (this member's rank) of its `out`.
  template <Element T>
  void all_to_all(std::span<const T> in, std::span<T> out, const Options& opts = {}) const {
    all_to_all_impl(in_view(in), ElementSpan::of(out), opts, true);
  }
  template <Element T>
  Work all_to_all_async(std::span<const T> in, std::span<T> out, const Options& opts = {}) const {
    return all_to_all_impl(in_view(in), ElementSpan::of(out), opts, false);
  }

  /// All-to-all with per-peer counts (MPI_Alltoallv): `in` holds size() blocks back to
  /// back, block j of send_counts[j] elements going to member j, which stores it as block i
  /// (this member's rank) of its `out`, whose blocks hold recv_counts[i] elements back to
  /// back. send_counts[j] here must equal recv_counts[i] on member j (a mismatch is an
  /// Error where the backend can see it, else undefined); counts may be zero. Every backend
  /// has it; one without it refuses in one line naming the backend.
  template <Element T>
  void all_to_all_v(std::span<const T> in, std::span<const std::int64_t> send_counts, std::span<T> out,
                    std::span<const std::int64_t> recv_counts, const Options& opts = {}) const {
    all_to_all_v_impl(in_view(in), send_counts, ElementSpan::of(out), recv_counts, opts, true);
  }
  /// The counts are copied before it returns; the buffers must stay alive until the Work completes.
  template <Element T>
  Work all_to_all_v_async(std::span<const T> in, std::span<const std::int64_t> send_counts, std::span<T> out,
                          std::span<const std::int64_t> recv_counts, const Options& opts = {}) const {
    return all_to_all_v_impl(in_view(in), send_counts, ElementSpan::of(out), recv_counts, opts, false);
  }

  /// Sends `data` to group rank `peer`; matched by a recv from this rank with the same tag.
  template <Element T>
  void send(std::span<const T> data, int peer, const Options& opts = {}) const {
    send_impl(in_view(data), peer, opts, true);
  }
  template <Element T>
  Work send_async(std::span<const T> data, int peer, const Options& opts = {}) const {
    return send_impl(in_view(data), peer, opts, false);
  }

  /// Receives exactly data.size() elements from group rank `peer` (an Error when the
  /// message holds another count).
  template <Element T>
  void recv(std::span<T> data, int peer, const Options& opts = {}) const {
    recv_impl(ElementSpan::of(data), peer, opts, true);
  }
  template <Element T>
  Work recv_async(std::span<T> data, int peer, const Options& opts = {}) const {
    return recv_impl(ElementSpan::of(data), peer, opts, false);
  }

  /// Ends every process of the job with exit status `code` at once (the peers are not
  /// left waiting for this rank until their timeout). Never returns.
  [[noreturn]] void abort_job(int code) const;
  /// Prints "[component] message" as an error line, then ends the job like abort_job().
  /// On an in-process job (comm/inproc.hpp) it throws instead: TimeoutError for
  /// kTimeoutExitCode, else JobAborted, and the other ranks' operations throw too.
  [[noreturn]] void abort_job(int code, std::string_view component, const std::string& message) const;

  /// Ends this communicator on this rank, for good: every operation of it in flight on any
  /// thread and every later one throws comm::Aborted naming `reason` (a TimeoutError for a
  /// timeout of a connect_store_group() group). Not collective; callable from any thread
  /// (a watcher that learned that a member is gone). What else ends at once depends on the
  /// backend: gloo closes this rank's connections of the group, so the members' operations
  /// with it fail at once too; inproc ends the group's operations on every member; a staged
  /// group (comm/staged.hpp) ends its host group the same way, as its backend can; MPI and
  /// NCCL (here) cannot cancel an operation in flight, which completes or times out as
  /// before. Groups split or duplicated from this one are not ended.
  void abort(const std::string& reason) const;

  /// A group of this process alone, made without communication (not collective).
  Communicator self(std::string name = "self") const;

  /// The members on this process's node (a shared-memory split), named "node".
  Communicator split_node() const;

 private:
  friend Communicator detail::make_communicator(std::shared_ptr<detail::CommImpl> impl, std::string name);
  friend std::shared_ptr<detail::CommImpl> detail::impl_of(const Communicator& c);
  Communicator(std::shared_ptr<detail::CommImpl> impl, std::string name)
      : impl_(std::move(impl)), name_(std::move(name)) {}
  // A read-only span as the backend's ElementSpan (the backend never writes to it).
  template <Element T>
  static ElementSpan in_view(std::span<const T> s) {
    return ElementSpan::of(s);
  }
  const detail::CommImpl& require(std::string_view op) const;
  // Runs a backend operation: blocking ones under the watchdog (then `finish`),
  // nonblocking ones wrapped in a Work that polls them against the deadline.
  template <typename Start>
  Work run(const char* op, int peer, const Options& opts, bool blocking, const Start& start,
           detail::Finish finish = {}) const;
  Work barrier_impl(const Options& opts, bool blocking) const;
  Work broadcast_impl(ElementSpan data, int root, const Options& opts, bool blocking) const;
  Work all_reduce_impl(ElementSpan data, const Options& opts, bool blocking) const;
  Work reduce_scatter_impl(ElementSpan in, ElementSpan out, const Options& opts, bool blocking) const;
  Work all_gather_impl(ElementSpan in, ElementSpan out, const Options& opts, bool blocking) const;
  Work reduce_scatter_in_place_impl(ElementSpan data, const Options& opts, bool blocking) const;
  Work all_gather_in_place_impl(ElementSpan data, const Options& opts, bool blocking) const;
  Work all_to_all_impl(ElementSpan in, ElementSpan out, const Options& opts, bool blocking) const;
  Work all_to_all_v_impl(ElementSpan in, std::span<const std::int64_t> send_counts, ElementSpan out,
                         std::span<const std::int64_t> recv_counts, const Options& opts, bool blocking) const;
  Work send_impl(ElementSpan data, int peer, const Options& opts, bool blocking) const;
  Work recv_impl(ElementSpan data, int peer, const Options& opts, bool blocking) const;

  std::shared_ptr<detail::CommImpl> impl_;
  std::string name_;
};

/// Options of connect_store_group().
struct StoreGroupOptions {
  /// The group's name in messages (its timeout line).
  std::string name = "store-group";
  /// A host the other members reach this one through (the store's host): this process
  /// listens on its address toward it.
  std::string toward = "127.0.0.1";
  /// Bounds the meeting and every operation called without Options::timeout_s; 0:
  /// NDMESH_TIMEOUT_S.
  double timeout_s = 0;
};

/// A group of `size` processes that meet under `store`'s prefix (one no other group uses:
/// e.g. one per membership generation), this process as `rank`; its members are numbered
/// 0..size-1 in messages. It needs no job world and a process may be in several. Unlike the
/// job's groups its failures stay inside it: a peer that is gone or a timeout throws on
/// this rank (an Error, a TimeoutError naming the group) and aborts the group, the process
/// goes on (elastic replicas: docs/elastic.md). Gloo over TCP; a ConfigError when ndmesh is
/// built without Gloo. An Error when the members do not all meet within the timeout.
Communicator connect_store_group(const launch::Store& store, int rank, int size, const StoreGroupOptions& options = {});

/// The LaunchEnv of this process with the values the launcher did not give (local rank,
/// local world size, node rank) filled from the engine: a shared-memory split of
/// `world`, then a split of the node leaders. Collective over `world`.
LaunchEnv resolve_launch_env(const Communicator& world);

namespace testing {
/// Caps the elements one backend call may carry (default: the backend's limit, INT_MAX
/// for MPI), so tests can exercise the chunking of large counts with small buffers.
/// 0 restores the default.
void set_max_count_per_call(std::size_t count);

/// The algorithms of the Gloo backend's reduce_scatter: kAuto (the default) picks one by
/// input size, as bench/bench_reduce_scatter.sh measured; the others force one, so that
/// the benchmark compares them in one run and the tests check each. kAllReduce: an
/// all-reduce of the whole input and a copy of this rank's block; kHalvingDoubling:
/// Gloo's ReduceScatterHalvingDoubling; kRing: ring_reduce_scatter (comm/allreduce.hpp).
/// Reductions other than sum always take kAllReduce. Other backends ignore it.
enum class GlooReduceScatter { kAuto, kAllReduce, kHalvingDoubling, kRing };
void set_gloo_reduce_scatter(GlooReduceScatter algorithm);
}  // namespace testing

}  // namespace ndmesh::comm
