// Views of a Mesh in the vocabulary of the systems ndmesh replaces (docs/mesh.md):
// every answer comes from the Mesh, so these views add names, not layout logic. Dims a
// mesh lacks behave as size 1 (rank 0, group of one).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "ndmesh/mesh/mesh.hpp"

namespace ndmesh {

/// Seed 000's ParallelConfig: sizes and ranks of tp, pp, dp (and cp), global rank, world
/// size and local rank.
class ParallelConfigView {
 public:
  /// `local_rank` comes from the launcher (LaunchEnv), never from an assumed device count.
  ParallelConfigView(const Mesh& mesh, std::int64_t global_rank, std::int64_t local_rank);

  std::int64_t global_rank() const { return rank_; }
  std::int64_t world_size() const { return mesh_.world_size(); }
  std::int64_t get_local_rank() const { return local_rank_; }
  std::int64_t tp() const { return mesh_.size_of("tp"); }
  std::int64_t pp() const { return mesh_.size_of("pp"); }
  std::int64_t dp() const { return mesh_.size_of("dp"); }
  std::int64_t cp() const { return mesh_.size_of("cp"); }
  std::int64_t tp_rank() const { return mesh_.coord_of(rank_, "tp"); }
  std::int64_t pp_rank() const { return mesh_.coord_of(rank_, "pp"); }
  std::int64_t dp_rank() const { return mesh_.coord_of(rank_, "dp"); }
  std::int64_t cp_rank() const { return mesh_.coord_of(rank_, "cp"); }

  /// "ParallelConfig(global_rank=0, world_size=4, tp=2[rank=0], pp=1[rank=0], dp=2[rank=0])";
  /// a "cp=..[rank=..]" part follows tp only when cp > 1.
  std::string to_string() const;

 private:
  Mesh mesh_;
  std::int64_t rank_;
  std::int64_t local_rank_;
};

/// Seed 001's ProcessGroupManager, layout answers only (the communicators live in
/// ndmesh::ProcessGroups): ranks, group members, first/last ranks, ring and pipeline
/// neighbours over the standard dims dp, pp, cp, tp.
class GroupManagerView {
 public:
  GroupManagerView(const Mesh& mesh, std::int64_t global_rank);

  std::int64_t global_rank() const { return rank_; }
  std::int64_t world_size() const { return mesh_.world_size(); }
  std::int64_t dp_rank() const { return mesh_.coord_of(rank_, "dp"); }
  std::int64_t pp_rank() const { return mesh_.coord_of(rank_, "pp"); }
  std::int64_t cp_rank() const { return mesh_.coord_of(rank_, "cp"); }
  std::int64_t tp_rank() const { return mesh_.coord_of(rank_, "tp"); }

  /// Members of this rank's group along the named dims (e.g. "tp", "cp-dp"); dims the
  /// mesh lacks are skipped.
  GroupView group_ids(std::string_view dims) const;
  GroupView tp_group_ids() const { return group_ids("tp"); }
  GroupView cp_group_ids() const { return group_ids("cp"); }
  GroupView pp_group_ids() const { return group_ids("pp"); }
  GroupView dp_group_ids() const { return group_ids("dp"); }
  GroupView cp_dp_group_ids() const { return group_ids("cp-dp"); }
  GroupView pp_dp_group_ids() const { return group_ids("pp-dp"); }

  std::int64_t tp_world_size() const { return mesh_.size_of("tp"); }
  std::int64_t cp_world_size() const { return mesh_.size_of("cp"); }
  std::int64_t pp_world_size() const { return mesh_.size_of("pp"); }
  std::int64_t dp_world_size() const { return mesh_.size_of("dp"); }
  std::int64_t cp_dp_world_size() const { return cp_world_size() * dp_world_size(); }

  std::int64_t tp_first_rank() const { return tp_group_ids().front(); }
  std::int64_t tp_last_rank() const { return tp_group_ids().back(); }
  std::int64_t cp_first_rank() const { return cp_group_ids().front(); }
  std::int64_t cp_last_rank() const { return cp_group_ids().back(); }
  std::int64_t pp_first_rank() const { return pp_group_ids().front(); }
  std::int64_t pp_last_rank() const { return pp_group_ids().back(); }
  std::int64_t dp_first_rank() const { return dp_group_ids().front(); }
  std::int64_t dp_last_rank() const { return dp_group_ids().back(); }

  /// Ring neighbours along cp (wrap around): where ring attention sends and receives.
  std::int64_t cp_send_rank() const;
  std::int64_t cp_recv_rank() const;
  /// Pipeline neighbours along pp: nullopt at the ends.
  std::optional<std::int64_t> pp_next_rank() const;
  std::optional<std::int64_t> pp_prev_rank() const;
  bool pp_is_first_stage() const { return pp_rank() == 0; }
  bool pp_is_last_stage() const { return pp_rank() == pp_world_size() - 1; }

  /// "TP(2)-CP(1)-PP(1)-DP(2)-Rank(0)".
  std::string to_string() const;

 private:
  std::optional<std::int64_t> step(std::string_view dim, std::int64_t offset, Edge edge) const;
  Mesh mesh_;
  std::int64_t rank_;
};

/// Seed 002's RankMapping for 3D parallelism: the mesh (dp, tp, pp), pp fastest.
/// Heads and tails, group members and ids named like "dp_group_tp{t}_pp{p}", pipeline
/// neighbours, layers per stage. The local rank comes from ranks_per_node, not from an
/// assumed 8 devices per node.
class RankMapping3D {
 public:
  /// The seed's layout: Mesh {dp, tp, pp}.
  static Mesh layout(std::int64_t dp, std::int64_t tp, std::int64_t pp);

  RankMapping3D(const Mesh& mesh, std::int64_t global_rank, std::int64_t ranks_per_node);

  std::int64_t global_rank() const { return rank_; }
  std::int64_t world_size() const { return mesh_.world_size(); }
  std::int64_t local_rank() const { return local_rank_; }
  std::int64_t dp_rank() const { return mesh_.coord_of(rank_, "dp"); }
  std::int64_t tp_rank() const { return mesh_.coord_of(rank_, "tp"); }
  std::int64_t pp_rank() const { return mesh_.coord_of(rank_, "pp"); }

  /// The rank at the given coordinates (seed 002's from_3d_coords).
  std::int64_t from_3d_coords(std::int64_t dp_rank, std::int64_t tp_rank, std::int64_t pp_rank) const;

  bool is_dp_head() const { return dp_rank() == 0; }
  bool is_tp_head() const { return tp_rank() == 0; }
  bool is_pp_head() const { return pp_rank() == 0; }
  bool is_pp_tail() const { return pp_rank() == mesh_.size_of("pp") - 1; }

  GroupView dp_group_ranks() const { return mesh_.group(rank_, mesh_.dims_of("dp")); }
  GroupView tp_group_ranks() const { return mesh_.group(rank_, mesh_.dims_of("tp")); }
  GroupView pp_group_ranks() const { return mesh_.group(rank_, mesh_.dims_of("pp")); }
  std::optional<std::int64_t> next_pp_rank() const;
  std::optional<std::int64_t> prev_pp_rank() const;

  /// "dp_group_tp{t}_pp{p}", "tp_group_dp{d}_pp{p}", "pp_group_dp{d}_tp{t}".
  std::string dp_group_id() const { return mesh_.group_label(rank_, mesh_.dims_of("dp")); }
  std::string tp_group_id() const { return mesh_.group_label(rank_, mesh_.dims_of("tp")); }
  std::string pp_group_id() const { return mesh_.group_label(rank_, mesh_.dims_of("pp")); }

  /// Layers on each pipeline stage; ConfigError when num_layers is not divisible by pp.
  std::int64_t layers_per_stage(std::int64_t num_layers) const;

 private:
  Mesh mesh_;
  std::int64_t rank_;
  std::int64_t local_rank_;
};

}  // namespace ndmesh
