// The job's rendezvous over its TCP store. Keys live under "ndmesh/<job id>/attempt_<n>/"
// (TORCHELASTIC_RUN_ID, TORCHELASTIC_RESTART_COUNT), so a restarted elastic job never
// reads its previous attempt's keys, and two jobs that reach one store never mix. Rank 0 publishes its
// WORLD_SIZE; every rank claims "rank/<r>" (a second claim means two processes got the same RANK), compares
// its WORLD_SIZE with rank 0's, then counts itself in "arrived" and polls until the count reaches the world
// size. A rank that fails these checks publishes "failed" with its message, so that the others stop waiting
// at once and repeat it instead of timing out.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include <fmt/format.h>

#include "ndmesh/core/error.hpp"
#include "ndmesh/core/log.hpp"
#include "ndmesh/launch/store.hpp"

namespace ndmesh::launch {
namespace {

// Prints one line and ends the process with 124, as the MPI start-up guard does.
[[noreturn]] void end_startup(const std::string& line) {
  log::error("{}", line);
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(124);
}

std::string rank_list(const std::vector<std::int64_t>& ranks) {
  if (ranks.size() <= 16) return fmt::format("{}", fmt::join(ranks, ","));
  return fmt::format("{},{},{},...,{} ({} ranks)", ranks[0], ranks[1], ranks[2], ranks.back(), ranks.size());
}

}  // namespace

std::string job_key_prefix(const LaunchEnv& env) {
  return fmt::format("ndmesh/{}/attempt_{}/", env.run_id, env.restart_count);
}

JobStore rendezvous(const LaunchEnv& env, double timeout_s) {
  env.require_store();
  NDMESH_CHECK(env.has_store(), "launch", "rendezvous without a store launch ({})", env.describe());
  const std::string& host = *env.master_addr;
  const int port = static_cast<int>(*env.master_port);
  // One timeout for all of it: connecting, then every rank's arrival.
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto deadline =
      start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  JobStore job;
  job.agent_store = env.agent_store;
  if (env.rank == 0 && !env.agent_store) job.server = std::make_shared<StoreServer>(host, port);
  Store root = [&] {
    try {
      return Store::connect(host, port, timeout_s);
    } catch (const ConfigError&) {
      throw;
    } catch (const Error& e) {
      end_startup(fmt::format("[launch] rank {}: {} (MASTER_ADDR={} MASTER_PORT={}{})", env.rank, e.what(),
                              host, port,
                              env.agent_store ? ", served by the launcher's agent" : ", served by rank 0"));
    }
  }();
  job.store = root.prefixed(job_key_prefix(env));
  const Store& s = job.store;

  // Every rank that stops at start-up counts itself in "gave_up"; rank 0, when it serves
  // the store, keeps it up until every rank that reached it has done so (at most 2 s), so
  // that none of them finds the store gone and reports that instead of the cause.
  auto leave = [&] {
    try {
      s.add("gave_up", 1);
      if (!job.server) return;
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
      while (std::chrono::steady_clock::now() < until) {
        std::int64_t reached = 0;
        for (std::int64_t r = 0; r < env.world_size; ++r)
          reached += s.check({fmt::format("rank/{}", r)}) ? 1 : 0;
        if (s.add("gave_up", 0) >= reached) return;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    } catch (const Error&) {
      // the store is gone already: nothing to wait for
    }
  };
  auto give_up = [&](const std::string& message) {
    s.set("failed", message);
    leave();
    throw ConfigError("launch", message);
  };
  if (env.rank == 0) s.set("world_size", std::to_string(env.world_size));
  if (s.add(fmt::format("rank/{}", env.rank), 1) > 1)
    give_up(fmt::format(
        "RANK={} is used by two processes of the job (WORLD_SIZE={}); every process needs its own "
        "RANK in [0, WORLD_SIZE)",
        env.rank, env.world_size));

  auto failed_elsewhere = [&] {
    if (!s.check({"failed"})) return;
    std::string message = fmt::format("another rank failed at start-up: {}", s.get("failed"));
    leave();
    throw ConfigError("launch", message);
  };
  auto missing_ranks = [&] {
    std::vector<std::int64_t> missing;
    for (std::int64_t r = 0; r < env.world_size; ++r)
      if (!s.check({fmt::format("rank/{}", r)})) missing.push_back(r);
    return missing;
  };
  auto timed_out = [&] {
    auto missing = missing_ranks();
    leave();
    end_startup(fmt::format(
        "[launch] rank {}: rank{} {} of WORLD_SIZE={} did not arrive at the store at {}:{} within {:g} s "
        "(NDMESH_INIT_TIMEOUT_S); check that every rank was started with the same MASTER_ADDR and "
        "MASTER_PORT",
        env.rank, missing.size() == 1 ? "" : "s", rank_list(missing), env.world_size, host, port, timeout_s));
  };

  // Rank 0's WORLD_SIZE, polled so that a failure elsewhere is seen meanwhile.
  auto pause = std::chrono::milliseconds(1);
  while (!s.check({"world_size"})) {
    failed_elsewhere();
    if (Clock::now() >= deadline) timed_out();
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
  }
  const std::string theirs = s.get("world_size");
  if (theirs != std::to_string(env.world_size))
    give_up(fmt::format(
        "WORLD_SIZE={} on rank {} but rank 0 has WORLD_SIZE={}; every process of the job must get "
        "the same WORLD_SIZE",
        env.world_size, env.rank, theirs));

  s.add("arrived", 1);
  pause = std::chrono::milliseconds(1);
  while (s.add("arrived", 0) < env.world_size) {
    failed_elsewhere();
    if (Clock::now() >= deadline) timed_out();
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
  }
  failed_elsewhere();
  log::debug("[launch] rank {}: {} ranks met at {} (c10d protocol {}) in {:.3f} s", env.rank, env.world_size,
             s.address(), s.generation(), std::chrono::duration<double>(Clock::now() - start).count());
  return job;
}

}  // namespace ndmesh::launch
