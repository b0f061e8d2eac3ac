// The coordinator's rules of elastic data parallelism, without sockets or clocks: who is
// alive (heartbeats within a timeout), when a membership generation may form (the quorum),
// and what each step attempt decides (commit or abort). The coordinator
// (elastic/coordinator.hpp) feeds it what it reads from the store and publishes what it
// returns; the unit tests drive it with a fake clock.
//
// Replicas are data-parallel copies of the model, each one launcher job; a replica is known
// by its id (stable across restarts) and its incarnation (the join that started this
// process of it). A generation is a numbered member list; a step attempt is (generation,
// step). An attempt commits only when every member voted ok; any other outcome aborts it and
// the step is redone under the next generation.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace ndmesh::elastic {

/// A member of a generation: which replica, which process of it, and the committed steps
/// its state holds.
struct Member {
  int replica = 0;
  std::int64_t incarnation = 0;
  std::int64_t step = 0;
  bool operator==(const Member&) const = default;
};

/// A membership generation: every step attempt of it runs on these replicas, in this order
/// (a replica's share of the global batch is its position).
struct Generation {
  std::int64_t id = 0;
  std::int64_t step = 0;  ///< committed steps when it formed: its first attempt computes step + 1
  std::vector<Member> members;
  int root = 0;       ///< a member whose state is at `step` (the donor when some member is behind)
  bool heal = false;  ///< some member is behind `step`
  /// Member position of (replica, incarnation); nullopt when not a member.
  std::optional<int> position(int replica, std::int64_t incarnation) const;
  /// One line: "ID STEP ROOT HEAL R:INC:STEP,..." (the store value).
  std::string encode() const;
  /// The inverse of encode(); Error when malformed.
  static Generation decode(const std::string& text);
};

/// The outcome of the step attempt (generation, step).
struct Decision {
  std::int64_t generation = 0;
  std::int64_t step = 0;  ///< committed steps before the attempt (it computed step + 1)
  bool commit = false;
  std::int64_t next_generation = 0;  ///< where the next attempt runs (== generation: unchanged)
  /// "COMMIT NEXT" (the store value) and back.
  std::string encode() const;
  static Decision decode(std::int64_t generation, std::int64_t step, const std::string& text);
};

/// What survives a restart of the coordinator (its --state-file).
struct PersistedState {
  std::int64_t generation = 0;  ///< the last generation formed
  std::int64_t committed = 0;   ///< committed steps
  std::set<int> heard;          ///< every replica id ever seen (the quorum's denominator)
  /// JSON text and back; Error naming what is wrong.
  std::string to_json() const;
  static PersistedState from_json(const std::string& text);
};

/// The rules. Times are seconds on any monotonic clock.
class Quorum {
 public:
  Quorum(int min_replicas, double heartbeat_timeout_s, PersistedState state = {});

  /// A replica process announced itself (a new incarnation replaces the previous one; a
  /// member replaced that way has failed). Counts as a heartbeat.
  void join(int replica, std::int64_t incarnation, std::int64_t step, double now);
  /// Replica `replica` is alive at `now`.
  void heartbeat(int replica, double now);
  /// A vote of the attempt (generation, step). A vote on the attempt a fenced replica
  /// missed lifts its fence (it is alive and has left that attempt); votes of any other
  /// attempt are ignored.
  void vote(std::int64_t generation, std::int64_t step, int replica, bool ok, double now);
  /// A replica left out because it did not vote on an attempt, and that attempt: it is no
  /// candidate for a generation until it votes there (late: it was slow or stopped) or a new
  /// process of it joins (it was dying while its heartbeat still ran).
  struct Fenced {
    int replica = 0;
    std::int64_t generation = 0, step = 0;
  };
  std::vector<Fenced> fenced() const;

  /// What happened since the last call, in order: the decision of the running attempt, if
  /// it is decided now, then a new generation, if one formed. The caller persists state()
  /// before it publishes them.
  struct Events {
    std::optional<Decision> decision;
    std::optional<Generation> generation;
  };
  Events tick(double now);

  const PersistedState& state() const { return state_; }
  /// The running generation, if one is formed.
  const std::optional<Generation>& current() const { return current_; }
  /// Replicas alive at the last tick.
  std::vector<int> alive() const;
  /// True when `count` live replicas form a quorum: at least min_replicas and more than
  /// half of every replica ever heard from.
  bool quorum(std::size_t count) const;

 private:
  struct Replica {
    std::int64_t incarnation = 0;
    std::int64_t step = 0;
    double last_seen = 0;
    bool alive = true;
    bool fenced = false;  // missed the vote of attempt (fenced_generation, fenced_step)
    std::int64_t fenced_generation = 0, fenced_step = 0;
  };
  std::optional<Generation> form(double now);

  int min_replicas_;
  double timeout_s_;
  PersistedState state_;
  std::map<int, Replica> replicas_;
  std::optional<Generation> current_;
  bool forming_ = true;        // the next generation is to be formed (no attempt running)
  std::map<int, bool> votes_;  // of the running attempt, by replica
  std::optional<double> first_failure_;
};

}  // namespace ndmesh::elastic
