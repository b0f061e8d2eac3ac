#include "mesh_flags.hpp"

#include <fmt/format.h>

#include "ndmesh/core/error.hpp"
#include "ndmesh/core/strings.hpp"

namespace ndmesh::cli {

void MeshFlags::add_to(CLI::App& app) {
  static const std::map<std::string, std::string> kDocs = {
      {"dp", "data-parallel size"},   {"pp", "pipeline-parallel size"}, {"cp", "context-parallel size"},
      {"tp", "tensor-parallel size"}, {"ep", "expert-parallel size"},
  };
  for (const auto& name : standard_dims()) {
    size_options_[name] =
        app.add_option("--" + name, sizes_[name], kDocs.at(name) + " (default 1; -1 = infer from the world)")
            ->group("Layout");
  }
  order_opt_ =
      app.add_option("--order", order_, "dim order, outer to inner (default dp,pp,cp,tp)")->group("Layout");
  megatron_opt_ = app.add_option("--megatron-order", megatron_order_,
                                 "dim order fastest first, Megatron's convention, e.g. tp-cp-ep-dp-pp")
                      ->group("Layout");
  dims_opt_ = app.add_option("--dims", dims_, "custom dims outer to inner, e.g. pipe=2,tensor=2,data=4")
                  ->group("Layout");
  world_opt_ =
      app.add_option("--world", world_, "world size (default: the product of the sizes)")->group("Layout");
  rpn_opt_ =
      app.add_option("--ranks-per-node", ranks_per_node_, "ranks on each node, for the placement report")
          ->group("Layout");
  heavy_opt_ = app.add_option("--heavy-dims", heavy_,
                              "bandwidth-heavy dims to warn about when they cross nodes "
                              "(default tp)")
                   ->delimiter(',')
                   ->group("Layout");
  app.add_option("--groups", groups_,
                 "group kinds to show, comma-separated; a kind joins dims with '-' in any order "
                 "(e.g. tp,cp,dp-cp; default: every single dim)")
      ->group("Layout");
  app.add_option("--config", config_, "TOML config file ([parallel], [model], [training]); flags override it")
      ->check(CLI::ExistingFile)
      ->group("Layout");
  order_opt_->excludes(megatron_opt_);
  dims_opt_->excludes(order_opt_)->excludes(megatron_opt_);
}

bool MeshFlags::layout_given() const {
  for (const auto& [name, option] : size_options_)
    if (option->count()) return true;
  return order_opt_->count() || megatron_opt_->count() || dims_opt_->count() || !config_.empty();
}

MeshSetup MeshFlags::resolve(std::int64_t launched_world) const {
  ConfigFile file;
  if (!config_.empty()) file = load_config_file(config_);

  LayoutSpec layout = file.layout;
  if (!layout_given())
    for (const auto& [name, size] : default_sizes_) layout.sizes[name] = size;
  bool flags_spell_layout = order_opt_->count() || megatron_opt_->count() || dims_opt_->count();
  if (flags_spell_layout) layout.order.clear(), layout.megatron_order.clear(), layout.dims.clear();
  if (order_opt_->count()) layout.order = order_;
  if (megatron_opt_->count()) layout.megatron_order = megatron_order_;
  if (dims_opt_->count()) {
    layout.dims = dims_;
    layout.sizes.clear();  // --dims replaces the file's standard sizes
  }
  for (const auto& [name, option] : size_options_)
    if (option->count()) layout.sizes[name] = sizes_.at(name);

  std::int64_t folded_ep = 1;
  if (fold_ep_) {
    if (auto it = layout.sizes.find("ep"); it != layout.sizes.end()) {
      NDMESH_CHECK_CONFIG(it->second >= 1, "config", "--ep {} must be at least 1 (it folds into dp x cp)",
                          it->second);
      folded_ep = it->second;
      layout.sizes.erase(it);
    }
  }
  ParallelConfig config = file.parallel;
  config.dims = layout_dims(layout);
  config.folded_ep = folded_ep;
  if (world_opt_->count()) {
    NDMESH_CHECK_CONFIG(world_ >= 1, "config", "--world {} must be at least 1", world_);
    config.world = world_;
  }
  if (rpn_opt_->count()) {
    NDMESH_CHECK_CONFIG(ranks_per_node_ >= 1, "config", "--ranks-per-node {} must be at least 1",
                        ranks_per_node_);
    config.ranks_per_node = ranks_per_node_;
  }
  if (launched_world > 0) {
    NDMESH_CHECK_CONFIG(
        config.world == 0 || config.world == launched_world, "config",
        "--world {} but the job was launched with {} ranks; drop --world or relaunch with -n {}",
        config.world, launched_world, config.world);
    config.world = launched_world;
  }
  config = ndmesh::resolve(config);

  MeshSetup out;
  out.model = file.model;
  validate(config, out.model ? &*out.model : nullptr);
  out.config = config;
  out.mesh = config.mesh();

  // Group kinds: each comma-separated entry names dims joined by '-'.
  if (groups_.empty()) {
    for (int i = 0; i < out.mesh.ndims(); ++i) out.kinds.push_back(DimSet::single(i));
  } else {
    for (auto kind : split_list(groups_, ",")) {
      NDMESH_CHECK_CONFIG(!kind.empty(), "config", "--groups '{}' has an empty entry; e.g. --groups tp,dp-cp",
                          groups_);
      DimSet set = out.mesh.dims_of(kind);
      if (std::find(out.kinds.begin(), out.kinds.end(), set) == out.kinds.end()) out.kinds.push_back(set);
    }
  }

  // Heavy dims: the default (tp) is skipped when the mesh has no such dim; named ones (the
  // flag, or heavy_dims in the config file) must exist.
  bool flag_heavy = heavy_opt_->count() > 0;
  bool file_heavy = !flag_heavy && config.heavy_dims != ParallelConfig{}.heavy_dims;
  for (const auto& name : flag_heavy ? heavy_ : config.heavy_dims) {
    auto i = out.mesh.find(name);
    NDMESH_CHECK_CONFIG(i || !(flag_heavy || file_heavy), "config",
                        "{} names '{}' but the mesh {} has no such dim; use one of {}",
                        flag_heavy ? std::string("--heavy-dims") : fmt::format("{}: parallel.heavy_dims", config_),
                        name, out.mesh.to_string(), out.mesh.order_string());
    if (i) out.heavy.push_back(DimSet::single(*i));
  }
  return out;
}

std::string crossing_warning(const Mesh& mesh, const GroupPlacement& p) {
  const std::string name = mesh.key_name(p.dims);
  std::vector<std::string> names;
  for (const auto& d : mesh.dims())
    if (d.name != name) names.push_back(d.name);
  names.push_back(name);
  return fmt::format(
      "{} groups cross node boundaries ({} of {} groups, up to {} nodes each): {} traffic will use the inter-node "
      "network; put {} innermost, e.g. --order {}",
      name, p.groups_crossing, p.groups, p.max_nodes_spanned, name, name, fmt::join(names, ","));
}

}  // namespace ndmesh::cli
