#include "ndmesh/mesh/seed_views.hpp"

#include <fmt/format.h>

#include "ndmesh/core/error.hpp"

namespace ndmesh {
namespace {

void check_rank(const Mesh& mesh, std::int64_t rank) {
  NDMESH_CHECK_CONFIG(rank >= 0 && rank < mesh.world_size(), "mesh",
                      "global rank {} is outside the world of {} ranks of {}", rank, mesh.world_size(),
                      mesh.to_string());
}

}  // namespace

// ------------------------------------------------------------------ ParallelConfigView

ParallelConfigView::ParallelConfigView(const Mesh& mesh, std::int64_t global_rank, std::int64_t local_rank)
    : mesh_(mesh), rank_(global_rank), local_rank_(local_rank) {
  check_rank(mesh_, rank_);
}

std::string ParallelConfigView::to_string() const {
  std::string cp_part = cp() > 1 ? fmt::format(", cp={}[rank={}]", cp(), cp_rank()) : "";
  return fmt::format(
      "ParallelConfig(global_rank={}, world_size={}, tp={}[rank={}]{}, pp={}[rank={}], dp={}[rank={}])",
      rank_, world_size(), tp(), tp_rank(), cp_part, pp(), pp_rank(), dp(), dp_rank());
}

// -------------------------------------------------------------------- GroupManagerView

GroupManagerView::GroupManagerView(const Mesh& mesh, std::int64_t global_rank)
    : mesh_(mesh), rank_(global_rank) {
  check_rank(mesh_, rank_);
}

GroupView GroupManagerView::group_ids(std::string_view dims) const {
  return mesh_.group(rank_, mesh_.dims_present(dims));
}

std::optional<std::int64_t> GroupManagerView::step(std::string_view dim, std::int64_t offset,
                                                   Edge edge) const {
  auto i = mesh_.find(dim);
  if (!i) return edge == Edge::kRing ? std::optional<std::int64_t>(rank_) : std::nullopt;
  return mesh_.neighbour(rank_, *i, offset, edge);
}

std::int64_t GroupManagerView::cp_send_rank() const { return *step("cp", +1, Edge::kRing); }
std::int64_t GroupManagerView::cp_recv_rank() const { return *step("cp", -1, Edge::kRing); }
std::optional<std::int64_t> GroupManagerView::pp_next_rank() const { return step("pp", +1, Edge::kLine); }
std::optional<std::int64_t> GroupManagerView::pp_prev_rank() const { return step("pp", -1, Edge::kLine); }

std::string GroupManagerView::to_string() const {
  return fmt::format("TP({})-CP({})-PP({})-DP({})-Rank({})", tp_world_size(), cp_world_size(),
                     pp_world_size(), dp_world_size(), rank_);
}

// ------------------------------------------------------------------------ RankMapping3D

Mesh RankMapping3D::layout(std::int64_t dp, std::int64_t tp, std::int64_t pp) {
  return Mesh{{"dp", dp}, {"tp", tp}, {"pp", pp}};
}

RankMapping3D::RankMapping3D(const Mesh& mesh, std::int64_t global_rank, std::int64_t ranks_per_node)
    : mesh_(mesh), rank_(global_rank), local_rank_(Mesh::placement(global_rank, ranks_per_node).local_rank) {
  check_rank(mesh_, rank_);
}

std::int64_t RankMapping3D::from_3d_coords(std::int64_t dp_rank, std::int64_t tp_rank,
                                           std::int64_t pp_rank) const {
  Coords c = mesh_.coords(0);
  auto set = [&](std::string_view name, std::int64_t value) {
    if (auto i = mesh_.find(name)) {
      c[*i] = value;
    } else {
      NDMESH_CHECK_CONFIG(value == 0, "mesh", "{}_rank={} but the mesh {} has no {} dim", name, value,
                          mesh_.to_string(), name);
    }
  };
  set("dp", dp_rank);
  set("tp", tp_rank);
  set("pp", pp_rank);
  return mesh_.rank(c);
}

std::optional<std::int64_t> RankMapping3D::next_pp_rank() const {
  auto i = mesh_.find("pp");
  return i ? mesh_.neighbour(rank_, *i, +1, Edge::kLine) : std::nullopt;
}

std::optional<std::int64_t> RankMapping3D::prev_pp_rank() const {
  auto i = mesh_.find("pp");
  return i ? mesh_.neighbour(rank_, *i, -1, Edge::kLine) : std::nullopt;
}

std::int64_t RankMapping3D::layers_per_stage(std::int64_t num_layers) const {
  std::int64_t pp = mesh_.size_of("pp");
  NDMESH_CHECK_CONFIG(num_layers % pp == 0, "config",
                      "num_layers={} is not divisible by pp={}; use a multiple of {} layers", num_layers, pp,
                      pp);
  return num_layers / pp;
}

}  // namespace ndmesh
