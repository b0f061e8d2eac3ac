// Error types and check macros shared by every layer.
//
// Every failure the library reports is an exception derived from ndmesh::Error; the
// library never calls exit(). Messages start with the component in brackets and quote
// the offending values and the fix, e.g.
//   [mesh] tp*pp*dp = 2*2*3 = 12 but the world has 8 ranks; use --world 12 or dp=2
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/core.h>

namespace ndmesh {

/// Base of every exception ndmesh throws. what() is the full message, including the
/// leading "[component] ".
class Error : public std::runtime_error {
 public:
  Error(std::string_view component, const std::string& message)
      : std::runtime_error(fmt::format("[{}] {}", component, message)), component_(component) {}

  /// The component that raised the error ("mesh", "config", "comm", ...).
  const std::string& component() const noexcept { return component_; }

 private:
  std::string component_;
};

/// Bad user input: flags, config files, environment variables. CLIs exit with code 2.
class ConfigError : public Error {
 public:
  using Error::Error;
};

/// A collective or point-to-point operation that did not complete in time.
class TimeoutError : public Error {
 public:
  using Error::Error;
};

/// Files that cannot be read, written, or that are corrupt.
class IoError : public Error {
 public:
  using Error::Error;
};

/// Throws E("[component] message") built with fmt.
template <typename E = Error, typename... Args>
[[noreturn]] void fail(std::string_view component, fmt::format_string<Args...> f, Args&&... args) {
  throw E(component, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace ndmesh

/// NDMESH_CHECK(cond, "mesh", "tp={} must be positive", tp): throws ndmesh::Error when
/// cond is false. The message should name the value and the fix.
#define NDMESH_CHECK(cond, component, ...)                 \
  do {                                                     \
    if (!(cond)) ::ndmesh::fail<>(component, __VA_ARGS__); \
  } while (false)

/// Like NDMESH_CHECK but throws ndmesh::ConfigError (bad user input).
#define NDMESH_CHECK_CONFIG(cond, component, ...)                               \
  do {                                                                          \
    if (!(cond)) ::ndmesh::fail<::ndmesh::ConfigError>(component, __VA_ARGS__); \
  } while (false)
