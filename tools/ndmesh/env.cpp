// `ndmesh env`: the NDMESH_* environment variables, their values and documentation.
#include <fmt/core.h>

#include "ndmesh/core/env.hpp"
#include "subcommand.hpp"

namespace {

ndmesh::cli::Action setup(CLI::App& app) {
  app.footer("Every variable is read in one place (src/core/env.cpp) and validated on use.");
  return [] {
    for (const auto& v : ndmesh::env::variables()) {
      auto value = ndmesh::env::raw(v.name);
      fmt::print("{:<18} {:<8} {}\n{:<18} default: {}; now: {}\n", v.name, v.type, v.doc, "", v.default_value,
                 value ? *value : "(unset)");
    }
    return 0;
  };
}

const ndmesh::cli::Subcommand kEnv{"env", "List the NDMESH_* environment variables", setup};

}  // namespace
