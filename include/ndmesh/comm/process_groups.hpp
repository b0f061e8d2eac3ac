// ProcessGroups: the communicators of a Mesh (the seeds' process-group manager).
//
// Built from a Mesh and the world communicator. Before anything is created, every rank
// compares a hash of its mesh (names, sizes, order) with all the others through a timed
// all_gather, so a rank started with other flags fails with a message naming the
// disagreeing ranks instead of hanging a split. Then each group kind (a single dim, or a
// subset such as dp-cp or pp-tp) costs one split of the world with the mesh's colors and
// keys, made on first use and cached; kinds with the same members (they differ only by
// dims of size 1) share one communicator. Layout answers (ranks, first/last, ring and
// pipeline neighbours) come from the mesh's seed views; this class adds communication.
//
// Creating groups is collective over the world: every rank must ask for the same kinds
// in the same order (or call create() with the same list). That, too, is checked by a
// timed all_gather before each split.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ndmesh/comm/communicator.hpp"
#include "ndmesh/mesh/mesh.hpp"
#include "ndmesh/mesh/seed_views.hpp"

namespace ndmesh {

/// The communicators of every group kind of a mesh, created on first use.
class ProcessGroups {
 public:
  /// Collective over `world`: checks that every rank has the same mesh (ConfigError
  /// naming the disagreeing ranks otherwise) and that the mesh has world.size() ranks.
  /// `opts.timeout_s` bounds the set-up collectives (0: NDMESH_TIMEOUT_S).
  ProcessGroups(const Mesh& mesh, comm::Communicator world, const comm::Options& opts = {})
      : ProcessGroups(mesh, std::move(world), {}, opts) {}
  /// Same, and creates the communicators of `kinds` right away: one agreement all_gather
  /// covers the mesh and the kinds, then one split per kind.
  ProcessGroups(const Mesh& mesh, comm::Communicator world, std::span<const DimSet> kinds,
                const comm::Options& opts = {});

  const Mesh& mesh() const { return mesh_; }
  const comm::Communicator& world() const { return world_; }
  /// This process's global rank.
  std::int64_t rank() const { return rank_; }

  /// This rank's communicator over `dims`, named by the mesh's key name ("dp-cp");
  /// its ranks are the mesh's keys. Created on first use (collective).
  const comm::Communicator& group(DimSet dims);
  /// Same, by spec ("tp", "dp-cp", "cp,dp"); ConfigError for unknown dims.
  const comm::Communicator& group(std::string_view spec) { return group(mesh_.dims_of(spec)); }
  /// Creates the communicators of every kind in `kinds` that does not exist yet, with
  /// one agreement check for the whole list (collective).
  void create(std::span<const DimSet> kinds);

  /// Seed 001's groups over the standard dims; dims the mesh lacks count as size 1.
  const comm::Communicator& tp() { return group(mesh_.dims_present("tp")); }
  const comm::Communicator& cp() { return group(mesh_.dims_present("cp")); }
  const comm::Communicator& pp() { return group(mesh_.dims_present("pp")); }
  const comm::Communicator& dp() { return group(mesh_.dims_present("dp")); }
  const comm::Communicator& cp_dp() { return group(mesh_.dims_present("cp-dp")); }
  const comm::Communicator& pp_dp() { return group(mesh_.dims_present("pp-dp")); }
  /// Seed 004's "model" group: pipeline and tensor dims together.
  const comm::Communicator& model() { return group(mesh_.dims_present("pp-tp")); }

  /// Megatron's embedding group: the first and the last rank of this rank's pipeline
  /// (the pp group), which both hold the token embedding when the head is tied to it;
  /// the empty handle on the ranks in between; one rank when pp = 1. Created on first
  /// use (collective over the world, like every group).
  const comm::Communicator& embedding();

  /// Expert parallelism folded into dp x cp (Mesh::fold_group): the expert group "ep" (the
  /// `ep` consecutive members of this rank's dp-cp group that exchange tokens) and the
  /// expert-data-parallel group "edp" (the members that hold the same experts). Created on
  /// first use (collective over the world); `ep` must be the same on every call.
  const comm::Communicator& expert(std::int64_t ep) { return folded(ep, Mesh::Fold::kInner); }
  const comm::Communicator& expert_data(std::int64_t ep) { return folded(ep, Mesh::Fold::kOuter); }

  /// Seed 001's layout answers (group ids, first/last ranks, cp_send_rank, pp_next_rank,
  /// is_first_stage, its string), from the mesh.
  const GroupManagerView& view() const { return view_; }
  /// Seed 000's ParallelConfig line for this rank.
  ParallelConfigView config_view(std::int64_t local_rank) const { return {mesh_, rank_, local_rank}; }
  /// "TP(2)-CP(1)-PP(1)-DP(2)-Rank(0)".
  std::string to_string() const { return view_.to_string(); }

  /// Backend splits made so far (shared kinds count once; kinds whose groups are the
  /// world or single ranks need none).
  int splits() const { return splits_; }
  /// Kinds with the same members share a communicator: the kind with its dims of size 1
  /// removed, which is the cache key.
  DimSet canonical(DimSet dims) const;

 private:
  // Timed all_gather of one record per rank; ConfigError naming the ranks whose first
  // value differs from the others'.
  void agree(std::string_view what, std::int64_t value, const std::string& mine);
  const comm::Communicator& create_one(DimSet dims);

  const comm::Communicator& folded(std::int64_t ep, Mesh::Fold part);

  std::map<std::pair<std::int64_t, int>, comm::Communicator> folded_;
  Mesh mesh_;
  comm::Communicator world_;
  std::int64_t rank_;
  GroupManagerView view_;
  comm::Options opts_;
  std::map<std::uint32_t, comm::Communicator> by_canonical_;
  std::map<std::uint32_t, comm::Communicator> by_kind_;
  int splits_ = 0;
  bool have_embedding_ = false;
  comm::Communicator embedding_;
};

}  // namespace ndmesh
