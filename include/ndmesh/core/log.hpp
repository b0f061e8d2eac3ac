// Rank-prefixed logging to stderr: "[rank 3] message". The rank is set once by whoever
// knows it (the launch or comm layer); before that, no prefix is printed. A thread can
// carry its own rank (the ranks of an in-process job are threads of one process, see
// comm/inproc.hpp), which then wins over the process's.
#pragma once

#include <string_view>

#include <fmt/core.h>

namespace ndmesh::log {

enum class Level { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

/// Sets the rank shown in the prefix (-1: no prefix).
void set_rank(int rank);
/// Sets the rank shown in the prefix of lines written by the calling thread (-1: no
/// prefix); kProcessRank goes back to the process's rank.
inline constexpr int kProcessRank = -2;
void set_thread_rank(int rank);
/// The rank the calling thread prefixes its lines with (-1: none): its own, else the
/// process's. A thread started on behalf of a rank passes it on with set_thread_rank().
int current_rank();
/// The current threshold, from NDMESH_LOG on first use.
Level level();
/// Writes one line to stderr with the rank prefix, if `lvl` passes the threshold.
void write(Level lvl, std::string_view message);

template <typename... Args>
void info(fmt::format_string<Args...> f, Args&&... args) {
  if (level() >= Level::kInfo) write(Level::kInfo, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void warn(fmt::format_string<Args...> f, Args&&... args) {
  if (level() >= Level::kWarn) write(Level::kWarn, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void error(fmt::format_string<Args...> f, Args&&... args) {
  write(Level::kError, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void debug(fmt::format_string<Args...> f, Args&&... args) {
  if (level() >= Level::kDebug) write(Level::kDebug, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace ndmesh::log
