// Error types and check macros shared by every layer.
//
// The error contract:
//   - Every failure the library reports is an exception derived from ndmesh::Error, and
//     the library never calls exit(). Messages start with the component in brackets and
//     quote the offending values and the fix, e.g.
//       [mesh] tp*pp*dp = 2*2*3 = 12 but the world has 8 ranks; use --world 12 or dp=2
//   - ConfigError: bad user input (flags, config files, environment variables). The CLI
//     prints one line and exits with 2.
//   - IoError: a file that cannot be read or written, or is corrupt. Exit 1.
//   - InternalError: a broken invariant, i.e. a bug in ndmesh or in the code calling it
//     (NDMESH_CHECK). The CLI prints "internal error" and exits with 1.
//   - Error itself: other run-time failures (an MPI call that fails, a process that
//     cannot be started). Exit 1.
//   - The one exception to "never exits": a communication that does not complete within
//     NDMESH_TIMEOUT_S aborts the whole job (exit 124, see comm/communicator.hpp) after
//     printing one line naming the operation and the group. This is by design: a peer that
//     never arrives leaves MPI in a state no rank can recover from (the other ranks are
//     blocked inside MPI), so there is nothing a catch block could do; throwing would only
//     turn one hung rank into a hung job. The only TimeoutError (comm/communicator.hpp)
//     is that of the in-process backend used by tests, where every rank is a thread of
//     one process and all of them can be woken with it.
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

/// A programming error: an invariant of ndmesh or a precondition of its API does not
/// hold. Never caused by user input; NDMESH_CHECK throws it.
class InternalError : public Error {
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

/// NDMESH_CHECK(cond, "nn", "tp={} must be positive", tp): throws ndmesh::InternalError
/// when cond is false (a programming error, not bad input). The message should name the
/// values.
#define NDMESH_CHECK(cond, component, ...)                                        \
  do {                                                                            \
    if (!(cond)) ::ndmesh::fail<::ndmesh::InternalError>(component, __VA_ARGS__); \
  } while (false)

/// Like NDMESH_CHECK but throws ndmesh::ConfigError (bad user input).
#define NDMESH_CHECK_CONFIG(cond, component, ...)                               \
  do {                                                                          \
    if (!(cond)) ::ndmesh::fail<::ndmesh::ConfigError>(component, __VA_ARGS__); \
  } while (false)
