#include "ndmesh/elastic/quorum.hpp"

#include <algorithm>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ndmesh/core/error.hpp"

namespace ndmesh::elastic {

namespace {
// A member that failed its vote is waited for this long at most before the attempt aborts,
// so that the other members' votes (and with them, their liveness) arrive first.
constexpr double kVoteGraceS = 1.0;
}  // namespace

std::optional<int> Generation::position(int replica, std::int64_t incarnation) const {
  for (std::size_t i = 0; i < members.size(); ++i)
    if (members[i].replica == replica && members[i].incarnation == incarnation) return static_cast<int>(i);
  return std::nullopt;
}

std::string Generation::encode() const {
  std::string m;
  for (const Member& x : members)
    m += fmt::format("{}{}:{}:{}", m.empty() ? "" : ",", x.replica, x.incarnation, x.step);
  return fmt::format("{} {} {} {} {}", id, step, root, heal ? 1 : 0, m);
}

Generation Generation::decode(const std::string& text) {
  Generation g;
  std::istringstream in(text);
  int heal = 0;
  std::string members;
  in >> g.id >> g.step >> g.root >> heal >> members;
  NDMESH_CHECK(!in.fail() && !members.empty(), "elastic", "malformed generation record '{}'", text);
  g.heal = heal != 0;
  std::istringstream list(members);
  std::string item;
  while (std::getline(list, item, ',')) {
    Member x;
    char c1 = 0, c2 = 0;
    std::istringstream one(item);
    one >> x.replica >> c1 >> x.incarnation >> c2 >> x.step;
    NDMESH_CHECK(!one.fail() && c1 == ':' && c2 == ':', "elastic", "malformed member '{}' in '{}'", item,
                 text);
    g.members.push_back(x);
  }
  NDMESH_CHECK(g.root >= 0 && g.root < static_cast<int>(g.members.size()), "elastic",
               "generation record '{}' names root {} of {} members", text, g.root, g.members.size());
  return g;
}

std::string Decision::encode() const { return fmt::format("{} {}", commit ? 1 : 0, next_generation); }

Decision Decision::decode(std::int64_t generation, std::int64_t step, const std::string& text) {
  Decision d{.generation = generation, .step = step};
  int commit = 0;
  std::istringstream in(text);
  in >> commit >> d.next_generation;
  NDMESH_CHECK(!in.fail(), "elastic", "malformed decision '{}'", text);
  d.commit = commit != 0;
  return d;
}

std::string PersistedState::to_json() const {
  nlohmann::ordered_json j;
  j["generation"] = generation;
  j["committed"] = committed;
  j["heard"] = std::vector<int>(heard.begin(), heard.end());
  return j.dump();
}

PersistedState PersistedState::from_json(const std::string& text) {
  PersistedState s;
  try {
    const auto j = nlohmann::json::parse(text);
    s.generation = j.at("generation").get<std::int64_t>();
    s.committed = j.at("committed").get<std::int64_t>();
    for (int r : j.at("heard").get<std::vector<int>>()) s.heard.insert(r);
  } catch (const nlohmann::json::exception& e) {
    fail<ConfigError>("elastic", "the coordinator's state is not valid ({}); remove the file to start afresh",
                      e.what());
  }
  NDMESH_CHECK_CONFIG(
      s.generation >= 0 && s.committed >= 0, "elastic",
      "the coordinator's state has a negative generation or step; remove the file to start afresh");
  return s;
}

Quorum::Quorum(int min_replicas, double heartbeat_timeout_s, PersistedState state)
    : min_replicas_(min_replicas), timeout_s_(heartbeat_timeout_s), state_(std::move(state)) {}

void Quorum::join(int replica, std::int64_t incarnation, std::int64_t step, double now) {
  Replica& r = replicas_[replica];
  r.incarnation = incarnation;
  r.step = step;
  r.last_seen = now;
  r.alive = true;
  r.fenced = false;
  state_.heard.insert(replica);
}

void Quorum::heartbeat(int replica, double now) {
  auto it = replicas_.find(replica);
  if (it != replicas_.end()) it->second.last_seen = std::max(it->second.last_seen, now);
}

std::vector<Quorum::Fenced> Quorum::fenced() const {
  std::vector<Fenced> out;
  for (const auto& [id, r] : replicas_)
    if (r.fenced) out.push_back({id, r.fenced_generation, r.fenced_step});
  return out;
}

void Quorum::vote(std::int64_t generation, std::int64_t step, int replica, bool ok, double now) {
  if (auto it = replicas_.find(replica); it != replicas_.end() && it->second.fenced &&
                                         it->second.fenced_generation == generation &&
                                         it->second.fenced_step == step) {
    it->second.fenced = false;
    heartbeat(replica, now);
    return;
  }
  if (!current_ || forming_ || generation != current_->id || step != state_.committed) return;
  bool member = false;
  for (const Member& m : current_->members) member = member || m.replica == replica;
  if (!member || votes_.count(replica) != 0) return;
  votes_[replica] = ok;
  heartbeat(replica, now);
  if (!ok && !first_failure_) first_failure_ = now;
}

std::vector<int> Quorum::alive() const {
  std::vector<int> out;
  for (const auto& [id, r] : replicas_)
    if (r.alive) out.push_back(id);
  return out;
}

bool Quorum::quorum(std::size_t count) const {
  return count >= static_cast<std::size_t>(std::max(1, min_replicas_)) && 2 * count > state_.heard.size();
}

std::optional<Generation> Quorum::form(double) {
  const std::int64_t next = state_.generation + 1;
  Generation g;
  for (const auto& [id, r] : replicas_)
    if (r.alive && !r.fenced) g.members.push_back({id, r.incarnation, r.step});
  if (g.members.empty() || !quorum(g.members.size())) return std::nullopt;
  // The committed steps: those of the state when some member holds them. After a restart
  // of the coordinator that lost a commit nobody applied, the most any member holds.
  std::int64_t most = 0;
  bool at_committed = false;
  for (const Member& m : g.members) {
    most = std::max(most, m.step);
    at_committed = at_committed || m.step == state_.committed;
  }
  g.step = at_committed ? state_.committed : most;
  for (std::size_t i = 0; i < g.members.size(); ++i)
    if (g.members[i].step == g.step) {
      g.root = static_cast<int>(i);
      break;
    }
  for (const Member& m : g.members) g.heal = g.heal || m.step != g.step;
  g.id = next;
  state_.generation = next;
  state_.committed = g.step;
  return g;
}

Quorum::Events Quorum::tick(double now) {
  for (auto& [id, r] : replicas_) r.alive = now - r.last_seen <= timeout_s_;
  Events ev;
  if (current_ && !forming_) {
    bool all_ok = true, any_failed = false, all_heard = true;
    for (const Member& m : current_->members) {
      const Replica& r = replicas_.at(m.replica);
      const bool failed = r.incarnation != m.incarnation || !r.alive;
      auto v = votes_.find(m.replica);
      const bool voted = v != votes_.end();
      all_ok = all_ok && voted && v->second && !failed;
      any_failed = any_failed || failed || (voted && !v->second);
      all_heard = all_heard && (voted || failed);
    }
    Decision d{.generation = current_->id, .step = state_.committed};
    if (all_ok) {
      d.commit = true;
      ++state_.committed;
      for (Member& m : current_->members) {
        m.step = state_.committed;
        replicas_.at(m.replica).step = state_.committed;
      }
      // Replicas waiting to join start a generation at this step boundary.
      bool joiners = false;
      for (const auto& [id, r] : replicas_) {
        bool member = false;
        for (const Member& m : current_->members) member = member || m.replica == id;
        joiners = joiners || (r.alive && !r.fenced && !member);
      }
      d.next_generation = joiners ? state_.generation + 1 : current_->id;
      forming_ = joiners;
      ev.decision = d;
    } else if (any_failed && (all_heard || (first_failure_ && now - *first_failure_ >= kVoteGraceS))) {
      // Members alive that did not vote are fenced: no candidates until they vote late on
      // this attempt (then they were slow or stopped) or a new process of theirs joins (this
      // one was dying while its heartbeat still ran).
      for (const Member& m : current_->members) {
        Replica& r = replicas_.at(m.replica);
        if (votes_.count(m.replica) == 0 && r.incarnation == m.incarnation && r.alive) {
          r.fenced = true;
          r.fenced_generation = current_->id;
          r.fenced_step = state_.committed;
        }
      }
      d.commit = false;
      d.next_generation = state_.generation + 1;
      forming_ = true;
      ev.decision = d;
    }
    if (ev.decision) {
      votes_.clear();
      first_failure_.reset();
    }
  }
  if (forming_) {
    if (auto g = form(now)) {
      current_ = *g;
      forming_ = false;
      votes_.clear();
      first_failure_.reset();
      ev.generation = std::move(g);
    }
  }
  return ev;
}

}  // namespace ndmesh::elastic
