#include "ndmesh/elastic/coordinator.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ndmesh/core/error.hpp"
#include "ndmesh/core/log.hpp"
#include "ndmesh/elastic/quorum.hpp"
#include "ndmesh/launch/store.hpp"

namespace ndmesh::elastic {

double heartbeat_period_s(double timeout_s) { return std::min(0.1, timeout_s / 10); }

namespace {

PersistedState load_state(const std::string& path) {
  if (path.empty() || !std::filesystem::exists(path)) return {};
  std::ifstream in(path);
  NDMESH_CHECK_CONFIG(in.good(), "coordinator", "--state-file={}: cannot read it; check its permissions",
                      path);
  std::stringstream text;
  text << in.rdbuf();
  try {
    return PersistedState::from_json(text.str());
  } catch (const ConfigError& e) {
    fail<ConfigError>("coordinator", "--state-file={}: {}", path, e.what());
  }
}

// Written to a temporary sibling and renamed over the file: a crash leaves the old or the new.
void save_state(const std::string& path, const PersistedState& s) {
  if (path.empty()) return;
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << s.to_json() << "\n";
    out.flush();
    NDMESH_CHECK(out.good(), "coordinator", "cannot write the state file {}", tmp);
  }
  std::filesystem::rename(tmp, path);
}

}  // namespace

void run_coordinator(const CoordinatorOptions& o, const std::atomic<bool>& stop,
                     const std::function<void(const std::string&, int)>& listening) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  auto now = [&] { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  Quorum q(o.min_replicas, o.heartbeat_timeout_s, load_state(o.state_file));
  if (q.state().generation > 0)
    log::info("[coordinator] resumed from {}: generation {}, {} committed steps, replicas heard from {}",
              o.state_file, q.state().generation, q.state().committed, fmt::join(q.state().heard, ","));
  std::unique_ptr<launch::StoreServer> served;
  try {
    served = std::make_unique<launch::StoreServer>(o.host, o.port, "--port");
  } catch (const ConfigError& e) {
    // The store names its launch variable; the coordinator's is --host.
    if (std::string(e.what()).find("MASTER_ADDR") == std::string::npos) throw;
    fail<ConfigError>(
        "coordinator",
        "--host={} is not an address of this host (or does not resolve); pass one of its addresses "
        "or names, e.g. 127.0.0.1 (this machine only) or the name other nodes reach it by",
        o.host);
  }
  const launch::StoreServer& server = *served;
  const launch::Store store = launch::Store::connect(o.host, server.port(), 30).prefixed("elastic/");
  listening(o.host, server.port());

  std::int64_t next_join = 1;
  std::map<int, std::int64_t> beats;  // last heartbeat counter seen per replica
  std::int64_t lost_told = 0;         // the last generation announced to have lost a member
  while (!stop.load()) {
    // New replica processes.
    while (store.check({fmt::format("join/{}", next_join)})) {
      std::istringstream in(store.get(fmt::format("join/{}", next_join)));
      int replica = -1;
      std::int64_t step = -1;
      in >> replica >> step;
      if (!in.fail() && replica >= 0 && step >= 0) {
        q.join(replica, next_join, step, now());
        beats[replica] = -1;
        log::info("[coordinator] replica {} joined (incarnation {}) at step {}", replica, next_join, step);
      }
      ++next_join;
    }
    const double t = now();
    for (auto& [replica, seen] : beats) {
      const std::int64_t count = store.add(fmt::format("hb/{}", replica), 0);
      if (count != seen) {
        seen = count;
        q.heartbeat(replica, t);
      }
    }
    if (const auto& g = q.current()) {
      for (const Member& m : g->members) {
        const std::string key = fmt::format("vote/{}/{}/{}", g->id, q.state().committed, m.replica);
        if (store.check({key})) q.vote(g->id, q.state().committed, m.replica, store.get(key) == "1", t);
      }
    }
    for (const Quorum::Fenced& f : q.fenced()) {  // late votes of fenced replicas
      const std::string key = fmt::format("vote/{}/{}/{}", f.generation, f.step, f.replica);
      if (store.check({key})) q.vote(f.generation, f.step, f.replica, store.get(key) == "1", t);
    }
    const Quorum::Events ev = q.tick(now());
    if (ev.decision || ev.generation) save_state(o.state_file, q.state());
    if (ev.decision) {
      const Decision& d = *ev.decision;
      store.set(fmt::format("dec/{}/{}", d.generation, d.step), d.encode());
      if (!d.commit || d.next_generation != d.generation)
        log::info("[coordinator] step {} of generation {}: {}; next generation {}", d.step + 1, d.generation,
                  d.commit ? "committed" : "aborted (redone)", d.next_generation);
    }
    // A member silent past the heartbeat timeout: the others may wait for it in their
    // reduction, which then cannot finish; they watch for this key and end it at once.
    if (const auto& g = q.current(); g && g->id != lost_told) {
      const std::vector<int> alive = q.alive();
      for (const Member& m : g->members) {
        if (std::find(alive.begin(), alive.end(), m.replica) != alive.end()) continue;
        store.set(fmt::format("lost/{}", g->id), std::to_string(m.replica));
        lost_told = g->id;
        log::info("[coordinator] generation {}: replica {} is silent past the heartbeat timeout", g->id, m.replica);
        break;
      }
    }
    if (ev.generation) {
      const Generation& g = *ev.generation;
      store.set(fmt::format("gen/{}", g.id), g.encode());
      store.set("latest", std::to_string(g.id));
      std::vector<std::string> who;
      for (const Member& m : g.members) who.push_back(fmt::format("{}@{}", m.replica, m.step));
      log::info(
          "[coordinator] generation {}: replicas {} from step {}{}", g.id, fmt::join(who, ","), g.step + 1,
          g.heal ? fmt::format(" (behind replicas heal from replica {})", g.members[g.root].replica) : "");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace ndmesh::elastic
