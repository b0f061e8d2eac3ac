// The Communicator handle: argument checks, avg, timeouts and messages shared by every
// backend. Blocking operations run the backend's blocking call under the watchdog
// (watchdog.hpp). A Work polls its backend requests: while waiting it yields for the
// first 50 ms (each poll drives the engine's progress, which multi-round nonblocking
// collectives need) and then sleeps with a growing pause of at most 1 ms, so that ranks
// oversubscribed on few cores let their peers run; a backend without an engine to drive
// (in-process ranks) sleeps until an operation completes instead. Past the deadline it
// prints the one-line message and aborts the job.
#include "ndmesh/comm/communicator.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "backends/inproc/inproc_backend.hpp"
#include "backends/mpi/mpi_backend.hpp"
#ifdef NDMESH_HAVE_GLOO
#include "backends/gloo/gloo_backend.hpp"
#endif
#include "comm/backend.hpp"
#include "comm/watchdog.hpp"
#include "ndmesh/core/env.hpp"
#include "ndmesh/core/error.hpp"
#include "ndmesh/core/log.hpp"
#include "ndmesh/launch/notify.hpp"

namespace ndmesh::comm {

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAvg:
      return "avg";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kMin:
      return "min";
  }
  return "?";
}

namespace {
std::atomic<std::size_t> g_count_cap{0};
std::atomic<testing::GlooReduceScatter> g_gloo_reduce_scatter{testing::GlooReduceScatter::kAuto};
thread_local detail::CallSite t_call;
thread_local double t_default_timeout = 0;  // the ranks of an in-process job
}  // namespace

double default_timeout_s() {
  if (t_default_timeout > 0) return t_default_timeout;
  static const double kTimeout = env::seconds("NDMESH_TIMEOUT_S", 300);  // read once: it is per job
  return kTimeout;
}

namespace testing {
void set_max_count_per_call(std::size_t count) { g_count_cap.store(count); }
void set_gloo_reduce_scatter(GlooReduceScatter algorithm) { g_gloo_reduce_scatter.store(algorithm); }
}  // namespace testing

namespace detail {

std::unique_ptr<WorkImpl> CommImpl::all_to_all_v(ElementSpan, std::span<const std::int64_t>, ElementSpan,
                                                 std::span<const std::int64_t>, bool) {
  fail<>("comm", "all_to_all_v is not supported by the {} backend; use the mpi, gloo, nccl or inproc backend",
         backend());
}

void Finish::operator()() const {
  if (move_from != nullptr) std::memmove(data.data, move_from, data.bytes());
  if (divisor == 0) return;
  if (data.dtype == DType::kFloat32) {
    auto* p = static_cast<float*>(data.data);
    for (std::size_t i = 0; i < data.count; ++i) p[i] /= static_cast<float>(divisor);
  } else if (data.dtype == DType::kFloat64) {
    auto* p = static_cast<double*>(data.data);
    for (std::size_t i = 0; i < data.count; ++i) p[i] /= static_cast<double>(divisor);
  }
}

void set_thread_default_timeout(double seconds) { t_default_timeout = seconds; }

bool AbortState::record(std::string_view component, const std::string& why, bool timed_out) {
  std::lock_guard lock(mutex_);
  if (set_.load(std::memory_order_relaxed)) return false;
  component_ = component;
  why_ = why;
  timed_out_ = timed_out;
  set_.store(true, std::memory_order_release);
  return true;
}

void AbortState::throw_if_set() const {
  if (!set()) return;
  std::lock_guard lock(mutex_);
  if (timed_out_) throw TimeoutError(component_, why_);
  throw Aborted(component_, why_);
}

std::string AbortState::component() const {
  std::lock_guard lock(mutex_);
  return component_;
}

bool AbortState::timed_out() const {
  std::lock_guard lock(mutex_);
  return timed_out_;
}

Communicator make_communicator(std::shared_ptr<CommImpl> impl, std::string name) {
  return Communicator(std::move(impl), std::move(name));
}

testing::GlooReduceScatter gloo_reduce_scatter() { return g_gloo_reduce_scatter.load(); }
std::shared_ptr<CommImpl> impl_of(const Communicator& c) { return c.impl_; }

const CallSite& current_call() { return t_call; }

std::size_t count_limit(std::size_t backend_limit) {
  std::size_t cap = g_count_cap.load();
  return cap == 0 ? backend_limit : std::min(cap, backend_limit);
}

void check_block_count(std::string_view op, std::size_t count, std::size_t backend_limit) {
  std::size_t limit = count_limit(backend_limit);
  NDMESH_CHECK(count <= limit, "comm",
               "{} of {} elements per rank exceeds the {} elements one call can carry; split the buffer into several "
               "calls",
               op, count, limit);
}

// What a Work needs to poll, finish and report its operation.
struct WorkState {
  std::unique_ptr<WorkImpl> impl;
  Finish finish;
  std::shared_ptr<CommImpl> comm;
  const char* op = "";  // "all_reduce"
  int peer = -1;        // send / recv
  std::string group;    // "tp"
  double timeout_s = 0;
  bool done = false;

  bool poll() {
    if (done) return true;
    if (impl && !impl->test()) return false;
    done = true;
    impl.reset();
    finish();
    return true;
  }

  void wait() {
    WorkState* self = this;
    wait_states(std::span<WorkState*>(&self, 1));
  }

  // Polls every state until all are done (until one is, with `any`): yields for the first
  // 50 ms, then sleeps with a growing pause of at most 1 ms; a state past its own
  // deadline aborts the job.
  static void wait_states(std::span<WorkState*> states, bool any = false) {
    using Clock = std::chrono::steady_clock;
    auto all_done = [&] {
      bool done = !any, one = false;
      for (WorkState* s : states) {
        const bool d = s->poll();
        done = done && d;
        one = one || d;
      }
      return any ? one || states.empty() : done;
    };
    if (all_done()) return;
    auto start = Clock::now();
    auto pause = std::chrono::microseconds(20);
    while (!all_done()) {
      auto now = Clock::now();
      for (WorkState* s : states) {
        if (!s->done && now - start >= std::chrono::duration<double>(s->timeout_s))
          detail::expire(s->op, peer_detail(s->op, *s->comm, s->peer), s->group, *s->comm, s->timeout_s);
      }
      if (states.front()->comm->wait_for_progress(std::chrono::milliseconds(1))) {
        // The backend slept until something completed (in-process ranks, no engine to drive).
      } else if (now - start < std::chrono::milliseconds(50)) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(pause);
        pause = std::min(pause * 2, std::chrono::microseconds(1000));
      }
    }
  }

  ~WorkState() {
    if (done) return;
    try {
      wait();
    } catch (const TimeoutError&) {
      // An in-process job that ended: its error reaches the caller elsewhere.
    } catch (const JobAborted&) {
    } catch (const std::exception& e) {
      log::error("{} (while finishing an unwaited {} on group {})", e.what(), op, group);
    }
  }
};

}  // namespace detail

void Work::wait() {
  if (state_) state_->wait();
}

bool Work::test() { return !state_ || state_->poll(); }

bool Work::done() const { return !state_ || state_->done; }

void wait_any(std::span<Work> works) {
  std::vector<detail::WorkState*> states;
  states.reserve(works.size());
  for (Work& w : works) {
    if (!w.state_ || w.state_->done) return;
    states.push_back(w.state_.get());
  }
  detail::WorkState::wait_states(std::span<detail::WorkState*>(states), true);
}

void wait_all(std::span<Work> works) {
  // Small fixed-size batches: no allocation for the usual handful of outstanding works.
  constexpr std::size_t kBatch = 64;
  std::array<detail::WorkState*, kBatch> batch{};
  for (std::size_t i = 0; i < works.size(); i += kBatch) {
    std::size_t n = 0;
    for (std::size_t j = i; j < std::min(works.size(), i + kBatch); ++j)
      if (works[j].state_ && !works[j].state_->done) batch[n++] = works[j].state_.get();
    detail::WorkState::wait_states(std::span<detail::WorkState*>(batch.data(), n));
  }
}

namespace {

// The store of a launch without MPI (torchrun), kept for the whole process: rank 0's
// server must outlive every group's rendezvous, and backends bootstrap through it.
launch::JobStore& job_store_slot() {
  static auto* job = new launch::JobStore;  // never destroyed: peers may still read it at exit
  return *job;
}

// The world of a store launch: every rank meets at MASTER_ADDR:MASTER_PORT first.
std::shared_ptr<detail::CommImpl> make_store_world(const LaunchEnv& launch, std::string_view name) {
  NDMESH_CHECK_CONFIG(
      launch.launcher == Launcher::kTorchrun, "comm",
      "NDMESH_BACKEND={} needs a launch without MPI: RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT "
      "set by torchrun (or your launcher); under {} unset NDMESH_BACKEND (mpi is used)",
      name, launcher_name(launch.launcher));
  launch.require_store();
  // One NDMESH_INIT_TIMEOUT_S bounds the whole start-up: the store's connection, every
  // rank's arrival and the backend's world.
  const double init_timeout_s = env::seconds("NDMESH_INIT_TIMEOUT_S", default_timeout_s());
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                             std::chrono::duration<double>(init_timeout_s));
  job_store_slot() = launch::rendezvous(launch, init_timeout_s);
#ifdef NDMESH_HAVE_GLOO
  return gloo::make_world(job_store_slot(), launch, deadline, init_timeout_s);
#else
  fail<ConfigError>(
      "comm",
      "NDMESH_BACKEND=gloo: this ndmesh was built without Gloo (Debian: apt-get install libgloo-dev, "
      "then rebuild); or launch with mpirun -np {}",
      launch.world_size);
#endif
}

// True for a process that nothing launched: no launcher's rank variables and no MPI
// process manager's (LaunchEnv::process_manager). It is alone, and needs no engine.
bool alone(const LaunchEnv& launch) {
  return launch.launcher == Launcher::kNone && launch.process_manager.empty();
}

// The backend named by NDMESH_BACKEND; by default gloo under a launch without MPI
// (torchrun), self for a process that nothing launched (a world of one: no MPI_Init,
// which as a singleton costs 0.3 s and forks Open MPI's daemon), mpi otherwise.
std::shared_ptr<detail::CommImpl> make_backend_world(const LaunchEnv& launch) {
  const std::string_view fallback = launch.launcher == Launcher::kTorchrun ? "gloo" : alone(launch) ? "self" : "mpi";
  std::string name = env::string("NDMESH_BACKEND", std::string(fallback));
  // NCCL carries the device buffers of a GPU run (parallel::device_communicator) over the
  // default CPU backend, which is the world: its bootstrap and the path of host buffers.
  if (name == "nccl") name = fallback;
  if (name == "self") {
    NDMESH_CHECK_CONFIG(alone(launch), "comm",
                        "NDMESH_BACKEND=self is a process alone, but this one was started by {} ({}): unset "
                        "NDMESH_BACKEND to join the job's other ranks",
                        launch.launcher == Launcher::kNone ? "an MPI process manager" : launcher_name(launch.launcher),
                        launch.launcher == Launcher::kNone ? launch.process_manager
                                                           : fmt::format("{}", fmt::join(launch.sources, " ")));
    return inproc::make_self_world();
  }
  if (name == "mpi") {
    launch.require_mpi_world();  // before MPI_Init: torchrun would give N worlds of one
    return mpi::make_world();
  }
  if (name == "gloo") return make_store_world(launch, name);
  // A new backend adds a folder src/backends/<name>/ and one line here.
  fail<ConfigError>("comm", "NDMESH_BACKEND='{}' is not built into this ndmesh; available: mpi, gloo, nccl, self",
                    name);
}

}  // namespace

namespace detail {
const launch::Store* job_store() {
  return job_store_slot().store.valid() ? &job_store_slot().store : nullptr;
}
}  // namespace detail

Communicator Communicator::world() {
  static const Communicator kWorld = [] {
    LaunchEnv launch = LaunchEnv::detect();
    auto impl = make_backend_world(launch);
    if (launch.launcher != Launcher::kNone &&
        (launch.world_size != impl->size() || launch.rank != impl->rank()))
      fail<ConfigError>(
          "comm",
          "the launcher says rank {} of {} ({}) but the {} world has rank {} of {}; the program was not "
          "started through the MPI launcher's process manager: use mpirun -np {}, srun --mpi=pmix or "
          "ndmesh launch -n {}",
          launch.rank, launch.world_size, fmt::join(launch.sources, " "), impl->backend(), impl->rank(),
          impl->size(), launch.world_size, launch.world_size);
    log::set_rank(impl->rank());
    return Communicator(std::move(impl), "world");
  }();
  return kWorld;
}

const detail::CommImpl& Communicator::require(std::string_view op) const {
  NDMESH_CHECK(impl_ != nullptr, "comm",
               "{} on an empty communicator: this rank is in no group of the split that made it", op);
  impl_->abort_state().throw_if_set();
  return *impl_;
}

void Communicator::abort(const std::string& reason) const {
  if (impl_) impl_->abort("comm", fmt::format("group {} was aborted: {}", name_, reason), false);
}

Communicator connect_store_group(const launch::Store& store, int rank, int size, const StoreGroupOptions& options) {
  NDMESH_CHECK(size >= 1 && rank >= 0 && rank < size, "comm",
               "connect_store_group: rank {} of {} members (ranks are 0..size-1)", rank, size);
#ifdef NDMESH_HAVE_GLOO
  const double timeout_s = options.timeout_s > 0 ? options.timeout_s : default_timeout_s();
  return detail::make_communicator(gloo::make_store_group(store, rank, size, options.toward, timeout_s),
                                   options.name);
#else
  (void)store, (void)options;
  fail<ConfigError>("comm",
                    "group {}: this ndmesh was built without Gloo, which groups over a store need (Debian: "
                    "apt-get install libgloo-dev, then rebuild)",
                    options.name);
#endif
}

int Communicator::rank() const { return impl_ ? impl_->rank() : -1; }
int Communicator::size() const { return impl_ ? impl_->size() : 0; }

Communicator Communicator::named(std::string name) const { return Communicator(impl_, std::move(name)); }

const std::vector<std::int64_t>& Communicator::members() const {
  static const std::vector<std::int64_t> kNone;
  return impl_ ? impl_->members() : kNone;
}

std::string Communicator::members_string() const { return detail::members_string(members()); }

std::string Communicator::timeout_line(std::string_view op, double timeout_s) const {
  if (!impl_) return fmt::format("{} on group {} (no members) timed out after {:g} s", op, name_, timeout_s);
  return detail::timeout_message(op, "", name_, *impl_, timeout_s);
}

std::string_view Communicator::backend() const { return impl_ ? impl_->backend() : std::string_view("none"); }

std::string Communicator::thread_limit() const { return impl_ ? impl_->thread_limit() : std::string(); }

Communicator Communicator::split(std::optional<std::int64_t> color, std::int64_t key, std::string name,
                                 const Options& opts) const {
  require("split");
  std::shared_ptr<detail::CommImpl> child;
  {
    detail::WatchScope watch("split", *impl_, name_,
                             opts.timeout_s > 0 ? opts.timeout_s : default_timeout_s());
    child = impl_->split(color, key);
  }
  if (!child) return Communicator();
  return Communicator(std::move(child), name.empty() ? name_ + "/split" : std::move(name));
}

void Communicator::connect_peers(std::span<const int> peers, const Options& opts) const {
  require("connect_peers");
  for (int p : peers)
    NDMESH_CHECK(p >= 0 && p < size() && p != rank(), "comm",
                 "connect_peers on group {}: peer {} is not another rank of its {} (name ranks 0 to {} but "
                 "this one, {})",
                 name_, p, size(), size() - 1, rank());
  run("connect_peers", -1, opts, true, [&](detail::CommImpl& c, bool b) { return c.connect_peers(peers, b); });
}

Communicator Communicator::dup(std::string name, const Options& opts) const {
  require("dup");
  std::shared_ptr<detail::CommImpl> copy;
  {
    detail::WatchScope watch("dup", *impl_, name_, opts.timeout_s > 0 ? opts.timeout_s : default_timeout_s());
    copy = impl_->dup();
  }
  return Communicator(std::move(copy), name.empty() ? name_ : std::move(name));
}

void Communicator::abort_job(int code, std::string_view component, const std::string& message) const {
  if (impl_ && impl_->interrupt(component, message, code == kTimeoutExitCode)) {
    if (code == kTimeoutExitCode) throw TimeoutError(component, message);
    throw JobAborted(component, message);
  }
  log::error("[{}] {}", component, message);
  // Under ndmesh launch the supervisor prints the line again (mpirun drops the ranks' output
  // when it kills them) and ends the job even when mpirun waits for an unreachable node.
  if (impl_)
    detail::notify_launcher_of(*impl_, component, message);
  else
    notify_launcher(fmt::format("[{}] {}", component, message));
  abort_job(code);
}

void Communicator::abort_job(int code) const {
  std::fflush(stdout);
  std::fflush(stderr);
  if (impl_) impl_->abort_job(code);
  std::_Exit(code);
}

Communicator Communicator::self(std::string name) const {
  require("self");
  return Communicator(impl_->self(), std::move(name));
}

Communicator Communicator::split_node() const {
  require("split_node");
  detail::WatchScope watch("split_node", *impl_, name_, default_timeout_s());
  return Communicator(impl_->split_node(), "node");
}

template <typename Start>
Work Communicator::run(const char* op, int peer, const Options& opts, bool blocking, const Start& start,
                       detail::Finish finish) const {
  const double own = impl_->default_timeout_s();
  double timeout = opts.timeout_s > 0 ? opts.timeout_s : own > 0 ? own : default_timeout_s();
  struct Site {
    explicit Site(detail::CallSite s) { t_call = s; }
    ~Site() { t_call = {}; }
  } site({.op = op, .group = &name_, .timeout_s = timeout});
  if (blocking) {
    {
      detail::WatchScope watch(op, *impl_, name_, timeout, peer);
      start(*impl_, true);
    }
    finish();
    return Work();
  }
  auto state = std::make_shared<detail::WorkState>();
  state->impl = start(*impl_, false);
  state->finish = finish;
  state->comm = impl_;
  state->op = op;
  state->peer = peer;
  state->group = name_;
  state->timeout_s = timeout;
  return Work(std::move(state));
}

namespace {

bool is_floating(DType t) { return t == DType::kFloat32 || t == DType::kFloat64; }

// The avg of a sum: finish divides by the group size.
detail::Finish divide_by(ElementSpan data, int n) { return {.data = data, .divisor = n}; }

// Out-of-place block collectives need disjoint buffers (MPI leaves overlap undefined).
void check_disjoint(std::string_view op, std::string_view instead, ElementSpan in, ElementSpan out,
                    const std::string& group) {
  auto a = reinterpret_cast<std::uintptr_t>(in.data), b = reinterpret_cast<std::uintptr_t>(out.data);
  bool overlap = in.bytes() > 0 && out.bytes() > 0 && a < b + out.bytes() && b < a + in.bytes();
  NDMESH_CHECK(!overlap, "comm", "{} on group {}: the input and output buffers overlap; use {}", op, group,
               instead);
}

void check_reduce_op(std::string_view op_name, ReduceOp op, DType t) {
  NDMESH_CHECK(op != ReduceOp::kAvg || is_floating(t), "comm",
               "{} with op avg on {} elements: avg needs float32 or float64 (use sum and divide)", op_name,
               dtype_name(t));
}

}  // namespace

Work Communicator::barrier_impl(const Options& opts, bool blocking) const {
  require("barrier");
  return run("barrier", -1, opts, blocking, [](detail::CommImpl& c, bool b) { return c.barrier(b); });
}

Work Communicator::broadcast_impl(ElementSpan data, int root, const Options& opts, bool blocking) const {
  require("broadcast");
  NDMESH_CHECK(root >= 0 && root < size(), "comm", "broadcast root {} is not a rank of group {} (size {})",
               root, name_, size());
  return run("broadcast", -1, opts, blocking,
             [&](detail::CommImpl& c, bool b) { return c.broadcast(data, root, b); });
}

Work Communicator::all_reduce_impl(ElementSpan data, const Options& opts, bool blocking) const {
  require("all_reduce");
  check_reduce_op("all_reduce", opts.op, data.dtype);
  if (impl_->handles_device(data.data))  // device memory: the backend averages
    return run("all_reduce", -1, opts, blocking,
               [&](detail::CommImpl& c, bool b) { return c.all_reduce(data, opts.op, b); });
  bool avg = opts.op == ReduceOp::kAvg;
  ReduceOp op = avg ? ReduceOp::kSum : opts.op;
  return run(
      "all_reduce", -1, opts, blocking,
      [&](detail::CommImpl& c, bool b) { return c.all_reduce(data, op, b); },
      avg ? divide_by(data, size()) : detail::Finish{});
}

Work Communicator::reduce_scatter_impl(ElementSpan in, ElementSpan out, const Options& opts,
                                       bool blocking) const {
  require("reduce_scatter");
  check_reduce_op("reduce_scatter", opts.op, in.dtype);
  check_disjoint("reduce_scatter", "reduce_scatter_in_place", in, out, name_);
  NDMESH_CHECK(in.count == out.count * static_cast<std::size_t>(size()), "comm",
               "reduce_scatter on group {}: input has {} elements but must hold size {} x output {} = {}",
               name_, in.count, size(), out.count, out.count * static_cast<std::size_t>(size()));
  if (impl_->handles_device(in.data))
    return run("reduce_scatter", -1, opts, blocking,
               [&](detail::CommImpl& c, bool b) { return c.reduce_scatter(in, out, opts.op, b); });
  bool avg = opts.op == ReduceOp::kAvg;
  ReduceOp op = avg ? ReduceOp::kSum : opts.op;
  return run(
      "reduce_scatter", -1, opts, blocking,
      [&](detail::CommImpl& c, bool b) { return c.reduce_scatter(in, out, op, b); },
      avg ? divide_by(out, size()) : detail::Finish{});
}

Work Communicator::reduce_scatter_in_place_impl(ElementSpan data, const Options& opts, bool blocking) const {
  require("reduce_scatter_in_place");
  check_reduce_op("reduce_scatter_in_place", opts.op, data.dtype);
  const auto p = static_cast<std::size_t>(size());
  NDMESH_CHECK(data.count % p == 0, "comm",
               "reduce_scatter_in_place on group {}: {} elements are not {} equal blocks", name_, data.count,
               size());
  const std::size_t n = data.count / p;
  // The engine leaves the result at the start of the buffer; the finish step moves it to
  // this rank's block.
  ElementSpan mine{static_cast<char*>(data.data) + static_cast<std::size_t>(rank()) * n * dtype_size(data.dtype),
                   n, data.dtype};
  ElementSpan first{data.data, n, data.dtype};
  if (impl_->handles_device(data.data))  // the backend reduces into this rank's block in place
    return run("reduce_scatter_in_place", -1, opts, blocking,
               [&](detail::CommImpl& c, bool b) { return c.reduce_scatter(data, mine, opts.op, b); });
  bool avg = opts.op == ReduceOp::kAvg;
  ReduceOp op = avg ? ReduceOp::kSum : opts.op;
  detail::Finish finish{.data = mine, .divisor = avg ? size() : 0, .move_from = rank() == 0 ? nullptr : first.data};
  return run(
      "reduce_scatter_in_place", -1, opts, blocking,
      [&](detail::CommImpl& c, bool b) { return c.reduce_scatter(data, first, op, b); }, finish);
}

Work Communicator::all_gather_in_place_impl(ElementSpan data, const Options& opts, bool blocking) const {
  require("all_gather_in_place");
  const auto p = static_cast<std::size_t>(size());
  NDMESH_CHECK(data.count % p == 0, "comm", "all_gather_in_place on group {}: {} elements are not {} equal blocks",
               name_, data.count, size());
  const std::size_t n = data.count / p;
  ElementSpan mine{static_cast<char*>(data.data) + static_cast<std::size_t>(rank()) * n * dtype_size(data.dtype),
                   n, data.dtype};
  return run("all_gather_in_place", -1, opts, blocking,
             [&](detail::CommImpl& c, bool b) { return c.all_gather(mine, data, b); });
}

Work Communicator::all_gather_impl(ElementSpan in, ElementSpan out, const Options& opts,
                                   bool blocking) const {
  require("all_gather");
  check_disjoint("all_gather", "all_gather_in_place", in, out, name_);
  NDMESH_CHECK(out.count == in.count * static_cast<std::size_t>(size()), "comm",
               "all_gather on group {}: output has {} elements but must hold size {} x input {} = {}", name_,
               out.count, size(), in.count, in.count * static_cast<std::size_t>(size()));
  return run("all_gather", -1, opts, blocking,
             [&](detail::CommImpl& c, bool b) { return c.all_gather(in, out, b); });
}

Work Communicator::all_to_all_impl(ElementSpan in, ElementSpan out, const Options& opts,
                                   bool blocking) const {
  require("all_to_all");
  check_disjoint("all_to_all", "a separate output buffer", in, out, name_);
  NDMESH_CHECK(
      in.count == out.count && in.count % static_cast<std::size_t>(size()) == 0, "comm",
      "all_to_all on group {}: input ({}) and output ({}) must have the same count, a multiple of the "
      "group size {}",
      name_, in.count, out.count, size());
  return run("all_to_all", -1, opts, blocking,
             [&](detail::CommImpl& c, bool b) { return c.all_to_all(in, out, b); });
}

Work Communicator::all_to_all_v_impl(ElementSpan in, std::span<const std::int64_t> send_counts, ElementSpan out,
                                     std::span<const std::int64_t> recv_counts, const Options& opts,
                                     bool blocking) const {
  require("all_to_all_v");
  check_disjoint("all_to_all_v", "a separate output buffer", in, out, name_);
  NDMESH_CHECK(in.dtype == out.dtype, "comm", "all_to_all_v on group {}: input is {} but output is {}", name_,
               dtype_name(in.dtype), dtype_name(out.dtype));
  auto total = [&](std::span<const std::int64_t> counts, std::string_view what, std::size_t want) {
    NDMESH_CHECK(counts.size() == static_cast<std::size_t>(size()), "comm",
                 "all_to_all_v on group {}: {} {} counts given, the group has {} members", name_, counts.size(),
                 what, size());
    std::size_t sum = 0;
    for (std::int64_t c : counts) {
      NDMESH_CHECK(c >= 0, "comm", "all_to_all_v on group {}: a {} count is {}; counts must be >= 0", name_,
                   what, c);
      sum += static_cast<std::size_t>(c);
    }
    NDMESH_CHECK(sum == want, "comm", "all_to_all_v on group {}: the {} counts sum to {} but the buffer holds {}",
                 name_, what, sum, want);
  };
  total(send_counts, "send", in.count);
  total(recv_counts, "recv", out.count);
  return run("all_to_all_v", -1, opts, blocking, [&](detail::CommImpl& c, bool b) {
    return c.all_to_all_v(in, send_counts, out, recv_counts, b);
  });
}

Work Communicator::send_impl(ElementSpan data, int peer, const Options& opts, bool blocking) const {
  require("send");
  NDMESH_CHECK(peer >= 0 && peer < size(), "comm", "send to rank {}: not a rank of group {} (size {})", peer,
               name_, size());
  return run("send", peer, opts, blocking,
             [&](detail::CommImpl& c, bool b) { return c.send(data, peer, opts.tag, b); });
}

Work Communicator::recv_impl(ElementSpan data, int peer, const Options& opts, bool blocking) const {
  require("recv");
  NDMESH_CHECK(peer >= 0 && peer < size(), "comm", "recv from rank {}: not a rank of group {} (size {})",
               peer, name_, size());
  return run("recv", peer, opts, blocking,
             [&](detail::CommImpl& c, bool b) { return c.recv(data, peer, opts.tag, b); });
}

LaunchEnv resolve_launch_env(const Communicator& world) {
  LaunchEnv env = LaunchEnv::detect();
  if (env.launcher == Launcher::kNone) {
    env.rank = world.rank();
    env.world_size = world.size();
  }
  Communicator node = world.split_node();
  // The engine's answer is the truth for what the launcher left out.
  if (!env.local_rank) env.local_rank = node.rank();
  if (!env.local_world_size) env.local_world_size = node.size();
  if (!env.node_rank) {
    // Node leaders (local rank 0) number the nodes in world-rank order; each tells its node.
    Communicator leaders = world.split(node.rank() == 0 ? std::optional<std::int64_t>(0) : std::nullopt,
                                       world.rank(), "node-leaders");
    std::int64_t index = leaders ? leaders.rank() : 0;
    node.broadcast(std::span<std::int64_t>(&index, 1), 0);
    env.node_rank = index;
  }
  return env;
}

}  // namespace ndmesh::comm
