#include "ndmesh/elastic/replica.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <mutex>
#include <optional>
#include <sstream>
#include <vector>

#include <fmt/format.h>

#include "ndmesh/core/env.hpp"
#include "ndmesh/core/error.hpp"
#include "ndmesh/core/log.hpp"
#include "ndmesh/elastic/coordinator.hpp"
#include "ndmesh/launch/route.hpp"
#include "ndmesh/parallel/state_dict.hpp"
#include "ndmesh/tensor/ops.hpp"

namespace ndmesh::elastic {

namespace {

using Clock = std::chrono::steady_clock;

std::chrono::milliseconds ms(double s) {
  return std::chrono::milliseconds(static_cast<std::int64_t>(s * 1000));
}

// A rank that fails the test switch's point ends here, as a killed process does.
struct KillPoint {
  int replica = -1, rank = -1;
  std::int64_t step = -1;
  std::string point;
};

KillPoint parse_kill(const std::string& text) {
  KillPoint k;
  if (text.empty()) return k;
  std::string rest = text;
  for (char& c : rest)
    if (c == ':') c = ' ';
  std::istringstream in(rest);
  in >> k.replica >> k.rank >> k.step >> k.point;
  if (in.fail() || (k.point != "reduce" && k.point != "vote" && k.point != "update"))
    fail<ConfigError>("elastic",
                      "NDMESH_TEST_ELASTIC_KILL={} is not REPLICA:RANK:STEP:POINT with POINT reduce, vote or "
                      "update; e.g. 1:0:3:reduce",
                      text);
  return k;
}

}  // namespace

// While a reduction runs, watches the coordinator for word that a member of the reducing
// generation fell silent past the heartbeat timeout (a lost node, a partition), or for a
// newer generation: that member will never send. Aborting the generation's communicator
// ends the wait at once with an error (the attempt fails and is redone under the new
// generation) instead of at the reduction timeout.
class ElasticReplica::SupersededWatch {
 public:
  explicit SupersededWatch(ElasticReplica& r) {
    thread_ = std::thread([&r, this, generation = r.gen_.id, cross = r.cross_] {
      std::unique_lock lock(m_);
      while (!done_) {
        lock.unlock();
        try {
          if (!r.watch_store_.valid())
            r.watch_store_ = launch::Store::connect(r.options_.host, r.options_.port, 1).prefixed("elastic/");
          if (r.watch_store_.check({fmt::format("lost/{}", generation)}) ||
              (r.watch_store_.check({"latest"}) && std::stoll(r.watch_store_.get("latest")) > generation)) {
            log::info("[elastic] replica {} rank {}: generation {} lost a member; its reduction is aborted",
                      r.options_.replica, r.world_.rank(), generation);
            cross.abort(fmt::format("generation {} lost a member (the coordinator heard no heartbeat)", generation));
            return;
          }
        } catch (const Error&) {
          r.watch_store_ = launch::Store();
        }
        lock.lock();
        cv_.wait_for(lock, std::chrono::milliseconds(20), [this] { return done_; });
      }
    });
  }
  ~SupersededWatch() {
    {
      std::lock_guard lock(m_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  SupersededWatch(const SupersededWatch&) = delete;
  SupersededWatch& operator=(const SupersededWatch&) = delete;

 private:
  std::mutex m_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

std::pair<std::string, int> parse_address(const std::string& text, std::string_view what) {
  const auto colon = text.rfind(':');
  int port = -1;
  if (colon != std::string::npos && colon > 0) {
    try {
      std::size_t used = 0;
      port = std::stoi(text.substr(colon + 1), &used);
      if (used != text.size() - colon - 1) port = -1;
    } catch (const std::exception&) {
      port = -1;
    }
  }
  if (port <= 0 || port > 65535)
    fail<ConfigError>("elastic",
                      "{}={} is not HOST:PORT; pass the address 'ndmesh coordinator' printed, e.g. "
                      "127.0.0.1:29400",
                      what, text);
  return {text.substr(0, colon), port};
}

ElasticReplica::ElasticReplica(ReplicaOptions options, parallel::Trainer& trainer,
                               const comm::Communicator& world)
    : options_(std::move(options)), trainer_(trainer), world_(world), leader_(world.rank() == 0) {
  const KillPoint k = parse_kill(env::string("NDMESH_TEST_ELASTIC_KILL", ""));
  kill_ = k.point.empty() ? "" : env::string("NDMESH_TEST_ELASTIC_KILL", "");
  if (leader_) {
    store_ = connect_or_stop();
    heartbeat_ = std::thread([this] {
      launch::Store hb;
      const auto period = ms(heartbeat_period_s(options_.heartbeat_timeout_s));
      while (!stop_.load()) {
        try {
          if (!hb.valid()) hb = launch::Store::connect(options_.host, options_.port, 1).prefixed("elastic/");
          hb.add(fmt::format("hb/{}", options_.replica), 1);
        } catch (const Error&) {
          hb = launch::Store();
        }
        std::this_thread::sleep_for(period);
      }
    });
  }
  join();
}

ElasticReplica::~ElasticReplica() {
  trainer_.grad_sync().set_replicas({});  // the trainer may outlive this
  stop_.store(true);
  if (heartbeat_.joinable()) heartbeat_.join();
}

launch::Store ElasticReplica::connect_or_stop() {
  const auto deadline = Clock::now() + ms(options_.reconnect_s);
  std::string why;
  while (Clock::now() < deadline) {
    try {
      return launch::Store::connect(options_.host, options_.port, 1).prefixed("elastic/");
    } catch (const Error& e) {
      why = e.what();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  world_.abort_job(
      1, "elastic",
      fmt::format("the coordinator at {}:{} is gone (no answer for {:g} s: {}); replica {} stops",
                  options_.host, options_.port, options_.reconnect_s, why, options_.replica));
}

std::string ElasticReplica::share_text(const std::string& text) const {
  std::int64_t n = static_cast<std::int64_t>(text.size());
  world_.broadcast(std::span<std::int64_t>(&n, 1), 0);
  std::vector<std::int64_t> bytes(static_cast<std::size_t>(n));
  if (leader_)
    for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<unsigned char>(text[i]);
  if (n > 0) world_.broadcast(std::span<std::int64_t>(bytes), 0);
  std::string out(bytes.size(), '\0');
  for (std::size_t i = 0; i < bytes.size(); ++i) out[i] = static_cast<char>(bytes[i]);
  return out;
}

template <typename F>
std::string ElasticReplica::leader_text(F&& f) {
  std::string text;
  if (leader_) {
    try {
      text = f();
    } catch (const Error& e) {
      log::warn("[elastic] replica {}: lost the coordinator at {}:{} ({}); reconnecting", options_.replica,
                options_.host, options_.port, e.what());
      store_ = connect_or_stop();
      text = "rejoin";
    }
  }
  return share_text(text);
}

void ElasticReplica::join() {
  for (;;) {
    const std::string k = leader_text([&] {
      const std::int64_t inc = store_.add("join_seq", 1);
      store_.set(fmt::format("join/{}", inc), fmt::format("{} {}", options_.replica, trainer_.steps_done()));
      return std::to_string(inc);
    });
    if (k == "rejoin") continue;
    incarnation_ = std::stoll(k);
    if (await_membership(0)) return;
    if (finished_) return;
  }
}

bool ElasticReplica::await_membership(std::int64_t from) {
  const std::string text = leader_text([&] {
    std::int64_t g = from;
    if (g == 0) g = store_.check({"latest"}) ? std::stoll(store_.get("latest")) : 1;
    for (;;) {
      if (store_.check({"finished"})) return std::string("finished");
      const std::string key = fmt::format("gen/{}", g);
      if (store_.check({key})) {
        const std::string t = store_.get(key);
        if (Generation::decode(t).position(options_.replica, incarnation_)) return t;
        ++g;
        continue;
      }
      // A restarted coordinator numbers on from its state: generations before its first
      // never appear in its store.
      if (store_.check({"latest"})) g = std::max<std::int64_t>(g, std::stoll(store_.get("latest")));
      if (store_.check({fmt::format("gen/{}", g)})) continue;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  });
  if (text == "rejoin") return false;
  if (text == "finished") {
    finished_ = true;
    return true;
  }
  gen_ = Generation::decode(text);
  position_ = *gen_.position(options_.replica, incarnation_);
  attempt_step_ = gen_.step;
  healed_ = false;
  return true;
}

void ElasticReplica::build_context() {
  cross_ = comm::Communicator();
  ctx_generation_ = -1;
  if (gen_.members.size() < 2) {
    ctx_generation_ = gen_.id;
    return;
  }
  // This rank's counterparts in the generation's replicas, over the coordinator's store
  // under the generation's prefix: a new communicator per membership.
  const launch::Store store = launch::Store::connect(options_.host, options_.port, options_.reduce_timeout_s)
                                  .prefixed(fmt::format("elastic/ctx/{}/{}/", gen_.id, world_.rank()));
  const comm::StoreGroupOptions group{.name = fmt::format("replicas-g{}-r{}", gen_.id, world_.rank()),
                                     .toward = options_.host,
                                     .timeout_s = options_.reduce_timeout_s};
  const int size = static_cast<int>(gen_.members.size());
  cross_ = options_.connect_group ? options_.connect_group(store, position_, size, group)
                                  : comm::connect_store_group(store, position_, size, group);
  ctx_generation_ = gen_.id;
}

void ElasticReplica::heal() {
  // Through the state dict, as a checkpoint load: the donor's entries (parameters and
  // moments of each logical slice) go to this rank's counterparts, which commit them.
  const bool donor = position_ == gen_.root;
  const std::unique_ptr<parallel::StateDict> state = trainer_.state_dict(donor);
  for (parallel::StateEntry& e : state->entries()) {
    const auto n = static_cast<std::size_t>(e.view->numel);
    for (float* x : {e.params, e.m, e.v}) cross_.broadcast(std::span<float>(x, n), gen_.root);
  }
  std::int64_t counters[2] = {trainer_.steps_done(), trainer_.optimizer().steps()};
  cross_.broadcast(std::span<std::int64_t>(counters, 2), gen_.root);
  NDMESH_CHECK(counters[0] == gen_.step, "elastic",
               "the donor holds step {} but generation {} starts at step {}", counters[0], gen_.id,
               gen_.step);
  if (donor) return;
  state->commit();
  trainer_.set_progress(counters[0], counters[1]);
}

void ElasticReplica::maybe_kill(std::string_view point) const {
  if (kill_.empty()) return;
  const KillPoint k = parse_kill(kill_);
  if (k.replica == options_.replica && k.rank == world_.rank() && k.step == attempt_step_ + 1 &&
      k.point == point) {
    fmt::print(stderr, "ndmesh: [elastic] test: replica {} rank {} kills itself at step {} ({})\n", k.replica,
               k.rank, k.step, point);
    std::fflush(stderr);
    ::kill(::getpid(), SIGKILL);
  }
}

std::uint64_t ElasticReplica::hash_params() const {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a
  const auto hash = [&h](const float* p, std::int64_t n) {
    const auto* b = reinterpret_cast<const unsigned char*>(p);
    for (std::size_t i = 0; i < static_cast<std::size_t>(n) * sizeof(float); ++i) h = (h ^ b[i]) * 1099511628211ull;
  };
  std::vector<float> host;  // on a device: a segment's copy
  const parallel::GradSync& sync = trainer_.grad_sync();
  for (std::size_t c = 0; c < trainer_.chunks().size(); ++c) {
    const model::Model& chunk = *trainer_.chunks()[c];
    const auto p = chunk.params().params();
    // The parameters this rank holds: all of them, or under ZeRO-3 its blocks (the rest is
    // freed; on a GPU unmapped).
    std::vector<nn::Segment> held{{.offset = 0, .count = static_cast<std::int64_t>(p.size())}};
    if (sync.zero() == 3) held = sync.reducer(c).shard();
    for (const nn::Segment& seg : held) {
      if (chunk.device() == Device::kCpu) {
        hash(p.data() + seg.offset, seg.count);
        continue;
      }
      host.resize(static_cast<std::size_t>(seg.count));
      ops::copy_to_host(host.data(), p.data() + seg.offset, seg.count, chunk.device());
      hash(host.data(), seg.count);
    }
  }
  std::vector<std::int64_t> all(static_cast<std::size_t>(world_.size()));
  const std::int64_t mine = static_cast<std::int64_t>(h);
  world_.all_gather(std::span<const std::int64_t>(&mine, 1), std::span<std::int64_t>(all));
  std::uint64_t out = 1469598103934665603ull;
  for (std::int64_t x : all) out = (out ^ static_cast<std::uint64_t>(x)) * 1099511628211ull;
  return out;
}

void ElasticReplica::finish() {
  if (leader_) {
    try {
      store_.set("finished", std::to_string(trainer_.steps_done()));
    } catch (const Error&) {
    }
  }
}

CommittedStep ElasticReplica::step() {
  for (;;) {
    if (finished_) return CommittedStep{.finished = true};
    // The attempt: generation's context, healing, this replica's share of the step.
    failed_ = false;
    why_.clear();
    parallel::StepStats stats;
    try {
      if (ctx_generation_ != gen_.id) build_context();
      if (gen_.heal && !healed_ && gen_.members.size() > 1) {
        heal();
        healed_ = true;
      }
    } catch (const std::exception& e) {
      failed_ = true;
      why_ = e.what();
    }
    std::int32_t ok = failed_ ? 0 : 1;
    world_.all_reduce(std::span<std::int32_t>(&ok, 1), {.op = comm::ReduceOp::kMin});
    if (ok == 1) {
      NDMESH_CHECK(trainer_.steps_done() == attempt_step_, "elastic",
                   "replica {} holds step {} but generation {} computes step {}", options_.replica,
                   trainer_.steps_done(), gen_.id, attempt_step_ + 1);
      try {
        trainer_.set_replica(position_, static_cast<std::int64_t>(gen_.members.size()));
      } catch (const ConfigError& e) {  // too few micro-batches for the replicas: bad flags
        world_.abort_job(2, e.component(), std::string(e.what()).substr(e.component().size() + 3));
      }
      // The sum over the replicas is the last level of the step's gradient reduction
      // (GradSync); while the step runs, a superseded generation aborts it.
      trainer_.grad_sync().set_replicas({.group = cross_, .on_start = [this] { maybe_kill("reduce"); }});
      {
        std::optional<SupersededWatch> watch;
        if (cross_.valid()) watch.emplace(*this);
        stats = trainer_.compute_step();
      }
      trainer_.grad_sync().set_replicas({});
      if (const std::string& why = trainer_.grad_sync().replica_failure(); !why.empty()) {
        failed_ = true;
        why_ = why;
      }
      ok = failed_ ? 0 : 1;
      world_.all_reduce(std::span<std::int32_t>(&ok, 1), {.op = comm::ReduceOp::kMin});
    }
    if (ok == 0 && !why_.empty())
      log::warn("[elastic] replica {} rank {}: step {} failed in generation {}: {}", options_.replica,
                world_.rank(), attempt_step_ + 1, gen_.id, why_);
    if (ok == 0) {  // this generation's communicator is suspect
      cross_ = comm::Communicator();
      ctx_generation_ = -1;
    }
    maybe_kill("vote");
    // The vote; the coordinator's decision.
    const std::string text = leader_text([&] {
      store_.set(fmt::format("vote/{}/{}/{}", gen_.id, attempt_step_, options_.replica), ok == 1 ? "1" : "0");
      const std::string key = fmt::format("dec/{}/{}", gen_.id, attempt_step_);
      while (!store_.check({key})) std::this_thread::sleep_for(std::chrono::milliseconds(2));
      return store_.get(key);
    });
    if (text == "rejoin") {
      cross_ = comm::Communicator();
      ctx_generation_ = -1;
      join();
      continue;
    }
    const Decision d = Decision::decode(gen_.id, attempt_step_, text);
    if (d.commit) {
      NDMESH_CHECK(ok == 1, "elastic", "the coordinator committed step {} that replica {} voted against",
                   attempt_step_ + 1, options_.replica);
      maybe_kill("update");
      trainer_.apply_step(stats);
      CommittedStep out{.stats = stats,
                        .generation = gen_.id,
                        .replicas = static_cast<int>(gen_.members.size()),
                        .param_hash = hash_params(),
                        .first_member = position_ == 0};
      ++attempt_step_;
      if (d.next_generation != gen_.id && !await_membership(d.next_generation)) join();
      return out;
    }
    if (!await_membership(d.next_generation)) join();
  }
}

}  // namespace ndmesh::elastic
