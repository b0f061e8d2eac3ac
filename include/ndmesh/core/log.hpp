// Rank-prefixed logging to stderr: "[rank 3] message". The rank is set once by whoever
// knows it (the launch or comm layer); before that, no prefix is printed.
#pragma once

#include <string_view>

#include <fmt/core.h>

namespace ndmesh::log {

enum class Level { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

/// Sets the rank shown in the prefix (-1: no prefix).
void set_rank(int rank);
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
