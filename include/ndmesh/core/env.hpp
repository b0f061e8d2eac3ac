// The one place that reads NDMESH_* environment variables.
//
// Every variable ndmesh understands is declared once in src/core/env.cpp with its type,
// default and documentation; `ndmesh env` prints the table. Reading an undeclared
// variable is a programming error; a malformed value is a ConfigError naming the
// variable, the value and what is expected.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ndmesh::env {

/// One documented environment variable.
struct Variable {
  std::string_view name;           ///< e.g. "NDMESH_TIMEOUT_S"
  std::string_view type;           ///< "seconds", "integer", "string", ...
  std::string_view default_value;  ///< as text, for documentation
  std::string_view doc;            ///< one line
};

/// Every NDMESH_* variable ndmesh reads.
const std::vector<Variable>& variables();

/// The raw value of a declared variable, or nullopt when unset or empty.
std::optional<std::string> raw(std::string_view name);

/// A declared integer variable in [min, max]; `fallback` when unset.
std::int64_t integer(std::string_view name, std::int64_t fallback, std::int64_t min, std::int64_t max);

/// A declared positive number of seconds; `fallback` when unset.
double seconds(std::string_view name, double fallback);

/// A declared positive number (below 1e7); `fallback` when unset.
double number(std::string_view name, double fallback);

/// A declared string variable; `fallback` when unset.
std::string string(std::string_view name, std::string_view fallback);

/// Checks every declared variable that is set (the same rules as the readers use), so a
/// typo such as NDMESH_LOG=verbose or NDMESH_TIMEOUT_S=5m is refused at start-up even by
/// commands that never read it. ConfigError naming the variable, the value and the fix.
void check_all();

}  // namespace ndmesh::env
