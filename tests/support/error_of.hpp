// The message of the error a call throws, for tests that check what an error says.
#pragma once

#include <string>

#include "ndmesh/core/error.hpp"

namespace ndmesh::testing_support {

/// The message of the E that `f()` throws, or "(no error)" when it throws none (a test that
/// looks for a text in it then fails). An exception of another type goes through and fails
/// the test.
template <typename E = ConfigError, typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace ndmesh::testing_support
