// The layout flags shared by every subcommand that needs a mesh (mesh, check, ...):
//   --tp --pp --dp --cp --ep  with  --order (outer to inner) | --megatron-order (fastest
//   first) | --dims name=size,... ; --world, --ranks-per-node, --heavy-dims, --groups,
//   --config file.toml. Flags override the config file.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "ndmesh/config/config.hpp"
#include "ndmesh/mesh/mesh.hpp"

namespace ndmesh::cli {

/// What the layout flags resolve to.
struct MeshSetup {
  ParallelConfig config;           ///< resolved: no -1 sizes, world set
  Mesh mesh;                       ///< config.mesh()
  std::optional<ModelSpec> model;  ///< from --config [model], when present
  std::vector<DimSet> kinds;       ///< the group kinds of --groups (default: each dim)
  std::vector<DimSet> heavy;       ///< bandwidth-heavy dims present in the mesh
};

/// The warning for a bandwidth-heavy kind whose groups cross nodes (`placement` from the
/// mesh's arithmetic for --ranks-per-node, or measured on the launcher's real nodes).
std::string crossing_warning(const Mesh& mesh, const GroupPlacement& placement);

/// Binds the layout flags to a CLI11 app and resolves them.
class MeshFlags {
 public:
  /// Adds the flags to `app`.
  void add_to(CLI::App& app);

  /// Merges the config file and the flags, infers a -1 size, and validates everything
  /// (throws one ConfigError listing every problem). `launched_world` is the world size
  /// of a running job (0 when there is none): it then must agree with --world.
  MeshSetup resolve(std::int64_t launched_world = 0) const;

  /// True when any layout flag (a size, --order, --megatron-order, --dims, --config) was given.
  bool layout_given() const;
  /// The --config file, or empty.
  const std::string& config_path() const { return config_; }
  /// Sizes used when no layout flag is given (e.g. `ndmesh train` under mpirun: dp = -1,
  /// all ranks data-parallel).
  void set_default_sizes(std::map<std::string, std::int64_t> sizes) { default_sizes_ = std::move(sizes); }
  /// --ep folds into dp x cp (ParallelConfig::folded_ep) instead of being a dim of its own:
  /// `ndmesh train` (expert parallelism of a MoE model) and `ndmesh mesh --fold-ep`.
  void set_fold_ep(bool fold) { fold_ep_ = fold; }

 private:
  std::map<std::string, std::int64_t> sizes_;
  std::map<std::string, CLI::Option*> size_options_;
  std::map<std::string, std::int64_t> default_sizes_;
  std::string order_, megatron_order_, dims_, config_, groups_;
  std::vector<std::string> heavy_;
  std::int64_t world_ = 0, ranks_per_node_ = 0;
  bool fold_ep_ = false;
  CLI::Option* order_opt_ = nullptr;
  CLI::Option* megatron_opt_ = nullptr;
  CLI::Option* dims_opt_ = nullptr;
  CLI::Option* world_opt_ = nullptr;
  CLI::Option* rpn_opt_ = nullptr;
  CLI::Option* heavy_opt_ = nullptr;
};

}  // namespace ndmesh::cli
