// MPI backend. MPI has no timeouts, so the caller bounds every operation: a blocking
// operation is the blocking MPI call (MPI_Allreduce, ...; Open MPI's tuned collectives
// are several times faster than its nonblocking ones) watched by the comm layer's
// watchdog thread, and an async one is the nonblocking call (MPI_Iallreduce, ...) whose
// requests the caller polls with MPI_Testall against its deadline. MPI counts are int, so operations whose
// buffer is one contiguous range (all_reduce, broadcast, send, recv) are cut into chunks of at most INT_MAX
// elements, issued in the same order on every rank; the block collectives (all_gather, reduce_scatter,
// all_to_all) refuse a per-rank block above the limit, all_to_all_v a buffer above it.
#include "backends/mpi/mpi_backend.hpp"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "ndmesh/core/env.hpp"
#include "ndmesh/core/error.hpp"

namespace ndmesh::comm::mpi {
namespace {

void check(int rc, std::string_view call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  fail<>("comm", "{} failed: {}", call, std::string_view(text, static_cast<std::size_t>(len)));
}

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::kFloat32:
      return MPI_FLOAT;
    case DType::kFloat64:
      return MPI_DOUBLE;
    case DType::kInt32:
      return MPI_INT32_T;
    case DType::kInt64:
      return MPI_INT64_T;
    case DType::kBFloat16:
      return MPI_UINT16_T;  // moved as 2-byte words; reductions use the ops below
  }
  return MPI_DATATYPE_NULL;
}

// Reductions of bfloat16 words: convert to float, combine, round back.
template <typename F>
void bf16_combine(void* in, void* inout, int* len, F f) {
  auto* a = static_cast<const BFloat16*>(in);
  auto* b = static_cast<BFloat16*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = BFloat16(f(static_cast<float>(a[i]), static_cast<float>(b[i])));
}
void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  bf16_combine(in, inout, len, [](float x, float y) { return x + y; });
}
void bf16_max(void* in, void* inout, int* len, MPI_Datatype*) {
  bf16_combine(in, inout, len, [](float x, float y) { return std::max(x, y); });
}
void bf16_min(void* in, void* inout, int* len, MPI_Datatype*) {
  bf16_combine(in, inout, len, [](float x, float y) { return std::min(x, y); });
}

// A received message must hold exactly the elements asked for.
void check_count(const MPI_Status& status, MPI_Datatype type, int expected, int peer) {
  int got = 0;
  MPI_Get_count(&status, type, &got);
  if (got != expected)
    fail<>("comm",
           "recv from group rank {} expected {} elements but the message held {}; send and recv counts "
           "must match",
           peer, expected, got);
}

MPI_Op bf16_op(ReduceOp op);

MPI_Op mpi_op(ReduceOp op, DType t) {
  if (t == DType::kBFloat16) return bf16_op(op);
  switch (op) {
    case ReduceOp::kSum:
      return MPI_SUM;
    case ReduceOp::kMax:
      return MPI_MAX;
    case ReduceOp::kMin:
      return MPI_MIN;
    case ReduceOp::kAvg:
      break;
  }
  fail<>("comm", "the MPI backend got reduce op {}; avg is a sum divided by the caller", reduce_op_name(op));
}

// Initialises MPI once and finalises it at exit, if ndmesh initialised it.
class Runtime {
  // Ends the process with kTimeoutExitCode and one line when MPI_Init has not returned
  // within `timeout_s`.
  class InitGuard {
   public:
    explicit InitGuard(double timeout_s)
        : thread_([this, timeout_s] {
            std::unique_lock lock(mutex_);
            if (cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), [this] { return done_; })) return;
            std::fprintf(stderr,
                         "ndmesh: [comm] MPI_Init did not complete within %g s (NDMESH_INIT_TIMEOUT_S, by default NDMESH_TIMEOUT_S): a rank of "
                         "the job never started or cannot reach the others; check the launcher's host list "
                         "and that every rank runs the same program\n",
                         timeout_s);
            std::fflush(stderr);
            std::_Exit(kTimeoutExitCode);
          }) {}
    ~InitGuard() {
      {
        std::lock_guard lock(mutex_);
        done_ = true;
      }
      cv_.notify_one();
      thread_.join();
    }
    InitGuard(const InitGuard&) = delete;
    InitGuard& operator=(const InitGuard&) = delete;

   private:
    std::mutex mutex_;
    std::condition_variable cv_;
    bool done_ = false;
    std::thread thread_;  // last: started after the members it uses
  };

 public:
  Runtime() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided = 0;
      // MULTIPLE so the watchdog thread may call MPI_Abort while this thread is blocked.
      // MPI_Init waits for the whole job to wire up; a rank that never starts would leave
      // the others there before any group exists for the watchdog to name, so a timer
      // bounds it: NDMESH_INIT_TIMEOUT_S, by default NDMESH_TIMEOUT_S (tests that shorten
      // the communication timeout to a few seconds keep a longer start-up bound, since
      // wiring up an oversubscribed, sanitized job can take that long).
      InitGuard guard(env::seconds("NDMESH_INIT_TIMEOUT_S", default_timeout_s()));
      check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
      owned_ = true;
      gather_hosts();  // under the same start-up bound: every rank is there
    }
    for (auto [fn, slot] : {std::pair{&bf16_sum, &bf16_ops_[0]}, std::pair{&bf16_max, &bf16_ops_[1]},
                            std::pair{&bf16_min, &bf16_ops_[2]}})
      check(MPI_Op_create(fn, 1, slot), "MPI_Op_create");
    // The level MPI really provides: it may give less than asked for, and a host that
    // initialised MPI first (mpi4py, a C++ program) chose its own.
    int level = 0;
    MPI_Query_thread(&level);
    abort_from_any_thread_ = level >= MPI_THREAD_MULTIPLE;
    if (level < MPI_THREAD_MULTIPLE)
      thread_limit_ = fmt::format("MPI provides {} ({})", level_name(level),
                                  owned_ ? "this MPI library offers no MPI_THREAD_MULTIPLE"
                                         : "MPI was initialised by the host program before ndmesh");
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  }
  ~Runtime() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owned_ && !finalized) MPI_Finalize();
  }
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  static Runtime& get() {
    static Runtime runtime;
    return runtime;
  }
  bool abort_from_any_thread() const { return abort_from_any_thread_; }
  /// Empty at MPI_THREAD_MULTIPLE; otherwise the level and why.
  const std::string& thread_limit() const { return thread_limit_; }
  /// The host name of each world rank (MPI_Get_processor_name), for messages.
  std::string_view host(std::int64_t world_rank) const {
    if (world_rank < 0 || static_cast<std::size_t>(world_rank) >= hosts_.size()) return {};
    return hosts_[static_cast<std::size_t>(world_rank)];
  }
  /// The user-defined bfloat16 sum, max and min.
  MPI_Op bf16(int i) const { return bf16_ops_[i]; }

 private:
  // One all-gather of the ranks' host names at start-up, so that a timeout can name the
  // nodes of a group when it can no longer communicate. Not when the host program
  // initialised MPI: nothing says that every rank enters ndmesh, so no names then.
  void gather_hosts() {
    int size = 0, len = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    std::vector<char> mine(MPI_MAX_PROCESSOR_NAME, '\0'),
        all(static_cast<std::size_t>(size) * MPI_MAX_PROCESSOR_NAME);
    MPI_Get_processor_name(mine.data(), &len);
    check(MPI_Allgather(mine.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all.data(), MPI_MAX_PROCESSOR_NAME,
                        MPI_CHAR, MPI_COMM_WORLD),
          "MPI_Allgather");
    for (int r = 0; r < size; ++r) {
      const char* name = all.data() + static_cast<std::size_t>(r) * MPI_MAX_PROCESSOR_NAME;
      hosts_.emplace_back(name, strnlen(name, MPI_MAX_PROCESSOR_NAME));
    }
  }

  std::vector<std::string> hosts_;
  MPI_Op bf16_ops_[3] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};
  bool owned_ = false;
  bool abort_from_any_thread_ = false;
  std::string thread_limit_;

  static const char* level_name(int level) {
    switch (level) {
      case MPI_THREAD_SINGLE:
        return "MPI_THREAD_SINGLE";
      case MPI_THREAD_FUNNELED:
        return "MPI_THREAD_FUNNELED";
      case MPI_THREAD_SERIALIZED:
        return "MPI_THREAD_SERIALIZED";
      default:
        return "MPI_THREAD_MULTIPLE";
    }
  }
};

MPI_Op bf16_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return Runtime::get().bf16(0);
    case ReduceOp::kMax:
      return Runtime::get().bf16(1);
    case ReduceOp::kMin:
      return Runtime::get().bf16(2);
    case ReduceOp::kAvg:
      break;
  }
  fail<>("comm", "the MPI backend got reduce op {}; avg is a sum divided by the caller", reduce_op_name(op));
}

bool mpi_alive() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  return !finalized;
}

class MpiWork final : public detail::WorkImpl {
 public:
  std::vector<MPI_Request> requests;
  // recv only: the elements each chunk must hold, checked on completion.
  std::vector<int> expected_counts;
  MPI_Datatype type = MPI_DATATYPE_NULL;
  int peer = -1;

  // all_to_all_v: the counts and displacements MPI reads until completion.
  std::vector<int> vcounts;

  // Polling allocates nothing: statuses are kept only for receives, sized when posted.
  std::vector<MPI_Status> statuses;

  bool test() override {
    if (requests.empty()) return true;
    int done = 0;
    const bool counted = !expected_counts.empty();
    if (counted) statuses.resize(requests.size());
    check(MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done,
                      counted ? statuses.data() : MPI_STATUSES_IGNORE),
          "MPI_Testall");
    if (!done) return false;
    for (std::size_t i = 0; i < expected_counts.size(); ++i)
      check_count(statuses[i], type, expected_counts[i], peer);
    requests.clear();
    return true;
  }

  ~MpiWork() override {
    // Only reached for completed work (the Communicator waits first) or at a failure;
    // freeing a request lets MPI finish it in the background.
    if (!mpi_alive()) return;
    for (auto& r : requests)
      if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
  }
};

class MpiComm final : public detail::CommImpl {
 public:
  // Takes ownership of `comm` unless it is MPI_COMM_WORLD.
  explicit MpiComm(MPI_Comm comm) : comm_(comm) {
    check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
    MPI_Group world_group, group;
    MPI_Comm_group(MPI_COMM_WORLD, &world_group);
    MPI_Comm_group(comm_, &group);
    std::vector<int> local(static_cast<std::size_t>(size_)), world(static_cast<std::size_t>(size_));
    for (int i = 0; i < size_; ++i) local[static_cast<std::size_t>(i)] = i;
    check(MPI_Group_translate_ranks(group, size_, local.data(), world_group, world.data()),
          "MPI_Group_translate_ranks");
    MPI_Group_free(&group);
    MPI_Group_free(&world_group);
    members_.assign(world.begin(), world.end());
  }
  ~MpiComm() override {
    if (comm_ != MPI_COMM_WORLD && comm_ != MPI_COMM_NULL && mpi_alive()) MPI_Comm_free(&comm_);
  }
  MpiComm(const MpiComm&) = delete;
  MpiComm& operator=(const MpiComm&) = delete;

  std::string_view backend() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::size_t max_count() const override { return static_cast<std::size_t>(INT_MAX); }
  std::string thread_limit() const override { return Runtime::get().thread_limit(); }
  std::string_view host_of(std::int64_t world_rank) const override { return Runtime::get().host(world_rank); }

  std::shared_ptr<detail::CommImpl> split(std::optional<std::int64_t> color, std::int64_t key) override {
    NDMESH_CHECK(!color || (*color >= 0 && *color <= INT_MAX), "comm",
                 "split color {} is outside [0, {}] (MPI colors are non-negative ints)", *color, INT_MAX);
    NDMESH_CHECK(key >= INT_MIN && key <= INT_MAX, "comm", "split key {} does not fit an MPI int", key);
    MPI_Comm out = MPI_COMM_NULL;
    check(
        MPI_Comm_split(comm_, color ? static_cast<int>(*color) : MPI_UNDEFINED, static_cast<int>(key), &out),
        "MPI_Comm_split");
    if (out == MPI_COMM_NULL) return nullptr;
    return std::make_shared<MpiComm>(out);
  }

  std::shared_ptr<detail::CommImpl> self() override {
    MPI_Comm out = MPI_COMM_NULL;
    check(MPI_Comm_dup(MPI_COMM_SELF, &out), "MPI_Comm_dup");
    return std::make_shared<MpiComm>(out);
  }

  std::shared_ptr<detail::CommImpl> split_node() override {
    MPI_Comm out = MPI_COMM_NULL;
    check(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &out),
          "MPI_Comm_split_type");
    return std::make_shared<MpiComm>(out);
  }

  std::unique_ptr<detail::WorkImpl> barrier(bool blocking) override {
    if (blocking) {
      check(MPI_Barrier(comm_), "MPI_Barrier");
      return nullptr;
    }
    auto work = std::make_unique<MpiWork>();
    work->requests.resize(1);
    check(MPI_Ibarrier(comm_, &work->requests[0]), "MPI_Ibarrier");
    return work;
  }

  std::unique_ptr<detail::WorkImpl> broadcast(ElementSpan data, int root, bool blocking) override {
    if (blocking) {
      for_chunks(data, [&](void* p, int n) {
        check(MPI_Bcast(p, n, mpi_type(data.dtype), root, comm_), "MPI_Bcast");
      });
      return nullptr;
    }
    auto work = std::make_unique<MpiWork>();
    for_chunks(data, [&](void* p, int n) {
      work->requests.emplace_back();
      check(MPI_Ibcast(p, n, mpi_type(data.dtype), root, comm_, &work->requests.back()), "MPI_Ibcast");
    });
    return work;
  }

  std::unique_ptr<detail::WorkImpl> all_reduce(ElementSpan data, ReduceOp op, bool blocking) override {
    if (blocking) {
      for_chunks(data, [&](void* p, int n) {
        check(MPI_Allreduce(MPI_IN_PLACE, p, n, mpi_type(data.dtype), mpi_op(op, data.dtype), comm_), "MPI_Allreduce");
      });
      return nullptr;
    }
    auto work = std::make_unique<MpiWork>();
    for_chunks(data, [&](void* p, int n) {
      work->requests.emplace_back();
      check(
          MPI_Iallreduce(MPI_IN_PLACE, p, n, mpi_type(data.dtype), mpi_op(op, data.dtype), comm_, &work->requests.back()),
          "MPI_Iallreduce");
    });
    return work;
  }

  std::unique_ptr<detail::WorkImpl> reduce_scatter(ElementSpan in, ElementSpan out, ReduceOp op,
                                                   bool blocking) override {
    int n = block_count("reduce_scatter", out.count);
    // In place: the input is the whole receive buffer and the result lands at its start.
    const void* send = in.data == out.data ? MPI_IN_PLACE : in.data;
    if (blocking) {
      check(MPI_Reduce_scatter_block(send, out.data, n, mpi_type(in.dtype), mpi_op(op, in.dtype), comm_),
            "MPI_Reduce_scatter_block");
      return nullptr;
    }
    auto work = std::make_unique<MpiWork>();
    work->requests.resize(1);
    check(MPI_Ireduce_scatter_block(send, out.data, n, mpi_type(in.dtype), mpi_op(op, in.dtype), comm_,
                                    &work->requests[0]),
          "MPI_Ireduce_scatter_block");
    return work;
  }

  std::unique_ptr<detail::WorkImpl> all_gather(ElementSpan in, ElementSpan out, bool blocking) override {
    int n = block_count("all_gather", in.count);
    // In place: this rank's block of the output is its input.
    const bool in_place = in.data == static_cast<char*>(out.data) + static_cast<std::size_t>(rank_) * in.bytes();
    const void* send = in_place ? MPI_IN_PLACE : in.data;
    const int send_n = in_place ? 0 : n;
    MPI_Datatype send_type = in_place ? MPI_DATATYPE_NULL : mpi_type(in.dtype);
    if (blocking) {
      check(MPI_Allgather(send, send_n, send_type, out.data, n, mpi_type(out.dtype), comm_), "MPI_Allgather");
      return nullptr;
    }
    auto work = std::make_unique<MpiWork>();
    work->requests.resize(1);
    check(MPI_Iallgather(send, send_n, send_type, out.data, n, mpi_type(out.dtype), comm_, &work->requests[0]),
          "MPI_Iallgather");
    return work;
  }

  std::unique_ptr<detail::WorkImpl> all_to_all(ElementSpan in, ElementSpan out, bool blocking) override {
    int n = block_count("all_to_all", in.count / static_cast<std::size_t>(size_));
    if (blocking) {
      check(MPI_Alltoall(in.data, n, mpi_type(in.dtype), out.data, n, mpi_type(out.dtype), comm_),
            "MPI_Alltoall");
      return nullptr;
    }
    auto work = std::make_unique<MpiWork>();
    work->requests.resize(1);
    check(MPI_Ialltoall(in.data, n, mpi_type(in.dtype), out.data, n, mpi_type(out.dtype), comm_,
                        &work->requests[0]),
          "MPI_Ialltoall");
    return work;
  }

  // MPI_Alltoallv: int counts and displacements, kept in the Work while it is in flight.
  std::unique_ptr<detail::WorkImpl> all_to_all_v(ElementSpan in, std::span<const std::int64_t> send_counts,
                                                 ElementSpan out, std::span<const std::int64_t> recv_counts,
                                                 bool blocking) override {
    auto work = std::make_unique<MpiWork>();
    auto& v = work->vcounts;  // send counts, send displacements, recv counts, recv displacements
    v.resize(4 * static_cast<std::size_t>(size_));
    int* sc = v.data();
    int* sd = sc + size_;
    int* rc = sd + size_;
    int* rd = rc + size_;
    block_count("all_to_all_v", in.count);
    block_count("all_to_all_v", out.count);
    for (int p = 0, s_at = 0, r_at = 0; p < size_; ++p) {
      sc[p] = static_cast<int>(send_counts[static_cast<std::size_t>(p)]);
      rc[p] = static_cast<int>(recv_counts[static_cast<std::size_t>(p)]);
      sd[p] = s_at;
      rd[p] = r_at;
      s_at += sc[p];
      r_at += rc[p];
    }
    if (blocking) {
      check(MPI_Alltoallv(in.data, sc, sd, mpi_type(in.dtype), out.data, rc, rd, mpi_type(out.dtype), comm_),
            "MPI_Alltoallv");
      return nullptr;
    }
    work->requests.resize(1);
    check(MPI_Ialltoallv(in.data, sc, sd, mpi_type(in.dtype), out.data, rc, rd, mpi_type(out.dtype), comm_,
                         &work->requests[0]),
          "MPI_Ialltoallv");
    return work;
  }

  std::unique_ptr<detail::WorkImpl> send(ElementSpan data, int peer, int tag, bool blocking) override {
    if (blocking) {
      bool sent = false;
      for_chunks(data, [&](void* p, int n) {
        check(MPI_Send(p, n, mpi_type(data.dtype), peer, tag, comm_), "MPI_Send");
        sent = true;
      });
      // an empty message still matches the peer's recv
      if (!sent) check(MPI_Send(data.data, 0, mpi_type(data.dtype), peer, tag, comm_), "MPI_Send");
      return nullptr;
    }
    auto work = std::make_unique<MpiWork>();
    for_chunks(data, [&](void* p, int n) {
      work->requests.emplace_back();
      check(MPI_Isend(p, n, mpi_type(data.dtype), peer, tag, comm_, &work->requests.back()), "MPI_Isend");
    });
    if (work->requests.empty()) {
      work->requests.emplace_back();
      check(MPI_Isend(data.data, 0, mpi_type(data.dtype), peer, tag, comm_, &work->requests.back()),
            "MPI_Isend");
    }
    return work;
  }

  std::unique_ptr<detail::WorkImpl> recv(ElementSpan data, int peer, int tag, bool blocking) override {
    MPI_Datatype type = mpi_type(data.dtype);
    if (blocking) {
      auto one = [&](void* p, int n) {
        MPI_Status status;
        check(MPI_Recv(p, n, type, peer, tag, comm_, &status), "MPI_Recv");
        check_count(status, type, n, peer);
      };
      for_chunks(data, one);
      if (data.count == 0) one(data.data, 0);
      return nullptr;
    }
    auto work = std::make_unique<MpiWork>();
    work->type = type;
    work->peer = peer;
    for_chunks(data, [&](void* p, int n) {
      work->requests.emplace_back();
      work->expected_counts.push_back(n);
      check(MPI_Irecv(p, n, type, peer, tag, comm_, &work->requests.back()), "MPI_Irecv");
    });
    if (work->requests.empty()) {
      work->requests.emplace_back();
      work->expected_counts.push_back(0);
      check(MPI_Irecv(data.data, 0, type, peer, tag, comm_, &work->requests.back()), "MPI_Irecv");
    }
    return work;
  }

  [[noreturn]] void abort_job(int code) override {
    int main_thread = 0;
    MPI_Is_thread_main(&main_thread);
    if (main_thread || Runtime::get().abort_from_any_thread()) MPI_Abort(MPI_COMM_WORLD, code);
    // Without MPI_THREAD_MULTIPLE another thread may not enter MPI: exit, and the launcher
    // ends the job because a rank died.
    std::_Exit(code);
  }

 private:
  // Calls f(pointer, count) for consecutive chunks of at most the count limit.
  template <typename F>
  void for_chunks(ElementSpan data, F&& f) const {
    std::size_t limit = detail::count_limit(static_cast<std::size_t>(INT_MAX));
    auto* base = static_cast<char*>(data.data);
    for (std::size_t off = 0; off < data.count; off += limit) {
      std::size_t n = std::min(limit, data.count - off);
      f(base + off * dtype_size(data.dtype), static_cast<int>(n));
    }
  }

  int block_count(std::string_view op, std::size_t count) const {
    detail::check_block_count(op, count, max_count());
    return static_cast<int>(count);
  }

  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace

std::shared_ptr<detail::CommImpl> make_world() {
  Runtime::get();
  return std::make_shared<MpiComm>(MPI_COMM_WORLD);
}

}  // namespace ndmesh::comm::mpi
