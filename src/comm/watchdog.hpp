// The watchdog: one background thread that bounds the blocking operations of every
// thread. A blocking operation arms its thread's slot (a generation counter and what
// the operation is) for its duration; the watchdog wakes every few milliseconds, and a
// slot that stays armed with the same generation for longer than its timeout gets the
// timeout line printed and the job aborted. Arming costs a few plain stores, so a
// blocking call keeps the speed of the engine's blocking collective.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "comm/backend.hpp"

namespace ndmesh::comm::detail {

/// Watches the calling thread's blocking operation while in scope. `op` must be a
/// string literal; `comm` and `group` must outlive the scope.
class WatchScope {
 public:
  WatchScope(const char* op, const CommImpl& comm, const std::string& group, double timeout_s, int peer = -1);
  ~WatchScope();
  WatchScope(const WatchScope&) = delete;
  WatchScope& operator=(const WatchScope&) = delete;

 private:
  void* slot_;
};

/// Prints "[comm] <op><detail> on group <group> (ranks ...) timed out after <t> s" and
/// aborts the job with kTimeoutExitCode; on an in-process job (CommImpl::interrupt)
/// throws that message as a TimeoutError instead.
[[noreturn]] void expire(std::string_view op, std::string_view detail, std::string_view group, CommImpl& comm,
                         double timeout_s);

/// " to rank 3 (world 5)" for send, " from rank ..." for recv, empty otherwise.
std::string peer_detail(std::string_view op, const CommImpl& comm, int peer);

/// Sends "[rank <world rank>] [<component>] <message>" to a supervising `ndmesh launch`
/// (notify_launcher): the one form of every line a rank ends the job with.
void notify_launcher_of(const CommImpl& comm, std::string_view component, std::string_view message);

/// "ranks 0,1", abbreviated past 16 members.
std::string members_string(const std::vector<std::int64_t>& members);

/// Every timeout line: "<op><detail> on group <group> (ranks ...) timed out after <t> s",
/// then "; the group spans nodes node0,node1" when the members sit on several nodes the
/// backend knows (abbreviated past 8 nodes).
std::string timeout_message(std::string_view op, std::string_view detail, std::string_view group,
                            const CommImpl& comm, double timeout_s);

}  // namespace ndmesh::comm::detail
