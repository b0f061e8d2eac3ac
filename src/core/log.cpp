#include "ndmesh/core/log.hpp"

#include <atomic>
#include <cstdio>
#include <string>

#include "ndmesh/core/env.hpp"
#include "ndmesh/core/error.hpp"

namespace ndmesh::log {
namespace {
std::atomic<int> g_rank{-1};
thread_local int t_rank = kProcessRank;

Level parse_level() {
  std::string name = env::string("NDMESH_LOG", "info");
  if (name == "error") return Level::kError;
  if (name == "warn") return Level::kWarn;
  if (name == "info") return Level::kInfo;
  if (name == "debug") return Level::kDebug;
  fail<ConfigError>("env", "NDMESH_LOG='{}' is not a log level; use error, warn, info or debug", name);
}
}  // namespace

void set_rank(int rank) { g_rank.store(rank); }
void set_thread_rank(int rank) { t_rank = rank; }
int current_rank() { return t_rank != kProcessRank ? t_rank : g_rank.load(); }

Level level() {
  static const Level kLevel = parse_level();
  return kLevel;
}

void write(Level lvl, std::string_view message) {
  static constexpr std::string_view kTags[] = {"error: ", "warning: ", "", ""};
  std::string line;
  int rank = current_rank();
  if (rank >= 0) line = fmt::format("[rank {}] ", rank);
  line += kTags[static_cast<int>(lvl)];
  line += message;
  line += '\n';
  std::fputs(line.c_str(), stderr);
}

}  // namespace ndmesh::log
