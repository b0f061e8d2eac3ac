// `ndmesh train`'s flags, bound onto the library's run options (train/options.hpp). Shared
// with the Python module, whose ndmesh.train(**options) takes the same flags as keyword
// arguments (--eval-every as eval_every) through this same binding.
#pragma once

#include <memory>

#include <CLI/CLI.hpp>

#include "mesh_flags.hpp"
#include "ndmesh/train/options.hpp"

namespace ndmesh::cli {

/// What ndmesh train's flags set.
struct TrainFlags {
  train::RunOptions options;
  MeshFlags layout;  ///< --dp --tp ... --config (resolved per world size by options.layout)
};

/// Adds every flag of ndmesh train to `app`, bound to `flags` (kept alive by the bindings).
void add_train_flags(CLI::App& app, const std::shared_ptr<TrainFlags>& flags);

/// The run options once `app` is parsed: the layout flags as options.layout (every rank
/// data-parallel when none is given), --config as options.config_path.
train::RunOptions parsed_train_options(const std::shared_ptr<TrainFlags>& flags);

}  // namespace ndmesh::cli
