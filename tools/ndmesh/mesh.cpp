// `ndmesh mesh`: shows a layout before anything is launched: the groups of every requested
// kind, the placement of each kind on the nodes, and with --rank one rank's full view.
// With --rank the work is O(number of dims + size of the rank's groups), never O(world),
// so it answers instantly for a million-rank mesh.
#include <memory>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "mesh_flags.hpp"
#include "ndmesh/core/error.hpp"
#include "subcommand.hpp"

// Its own namespace: the tool compiles as a unity build (CMakeLists.txt), where every
// subcommand's file shares one translation unit with the others.
namespace ndmesh::cli::mesh_command {
namespace {

struct Options {
  MeshFlags flags;
  std::int64_t rank = -1;
  CLI::Option* rank_option = nullptr;
  bool json = false;
  std::int64_t max_groups = 16;
  bool fold_ep = false;
};

nlohmann::ordered_json dims_json(const Mesh& m) {
  auto dims = nlohmann::ordered_json::array();
  for (const auto& d : m.dims()) dims.push_back({{"name", d.name}, {"size", d.size}});
  return dims;
}

// Output stays proportional to what a person can read: a group of more than kListed
// members shows its first and last few and the count, so a 2^31-rank mesh answers at once.
constexpr std::int64_t kListed = 64;
// JSON lists every member; past these limits it is refused with a message instead of
// building gigabytes (the tables work at any size).
constexpr std::int64_t kJsonMembers = std::int64_t{1} << 20;
// The placement report walks every group of every kind: O(world) work.
constexpr std::int64_t kPlacementWorld = std::int64_t{1} << 24;

std::string join_ranks(const GroupView& g) {
  if (g.size() <= kListed) return fmt::format("{}", fmt::join(g, " "));
  std::string out;
  for (std::int64_t i = 0; i < kListed / 2; ++i) out += fmt::format("{} ", g[i]);
  out += "...";
  for (std::int64_t i = g.size() - 4; i < g.size(); ++i) out += fmt::format(" {}", g[i]);
  return out + fmt::format(" ({} ranks)", g.size());
}

std::int64_t nodes_of(std::int64_t world, std::int64_t rpn) { return world / rpn + (world % rpn != 0); }

// A warning line for each heavy dim whose groups cross node boundaries.
std::vector<std::string> placement_warnings(const MeshSetup& s) {
  std::vector<std::string> out;
  if (s.config.ranks_per_node <= 0 || s.mesh.world_size() > kPlacementWorld) return out;
  for (DimSet h : s.heavy) {
    auto p = s.mesh.group_placement(h, s.config.ranks_per_node);
    if (p.groups_crossing > 0) out.push_back(crossing_warning(s.mesh, p));
  }
  return out;
}

// Expert parallelism folded into dp x cp (--fold-ep): the expert groups ("ep") and the
// expert-data-parallel groups ("edp"), each as the list of its members by color.
struct FoldedKind {
  std::string name;
  Mesh::Fold part;
};
const FoldedKind kFolded[] = {{"ep", Mesh::Fold::kInner}, {"edp", Mesh::Fold::kOuter}};

std::vector<std::vector<std::int64_t>> folded_groups(const MeshSetup& s, Mesh::Fold part) {
  const Mesh& m = s.mesh;
  const DimSet dp_cp = m.dims_present("dp-cp");
  std::vector<std::vector<std::int64_t>> groups(static_cast<std::size_t>(
      m.world_size() / static_cast<std::int64_t>(m.fold_group(0, dp_cp, s.config.folded_ep, part).size())));
  for (std::int64_t r = 0; r < m.world_size(); ++r)
    groups[static_cast<std::size_t>(m.fold_color(r, dp_cp, s.config.folded_ep, part))].push_back(r);
  return groups;
}

int show_rank(const MeshSetup& s, std::int64_t rank, bool json) {
  const Mesh& m = s.mesh;
  Coords c = m.coords(rank);  // validates the rank
  std::int64_t rpn = s.config.ranks_per_node;
  nlohmann::ordered_json out;
  out["rank"] = rank;
  out["coords"] = nlohmann::ordered_json::object();
  for (int i = 0; i < m.ndims(); ++i) out["coords"][m.dim(i).name] = c[i];
  out["node"] =
      rpn > 0 ? nlohmann::ordered_json(Mesh::placement(rank, rpn).node) : nlohmann::ordered_json(nullptr);
  out["local_rank"] = rpn > 0 ? nlohmann::ordered_json(Mesh::placement(rank, rpn).local_rank)
                              : nlohmann::ordered_json(nullptr);
  out["groups"] = nlohmann::ordered_json::object();
  for (DimSet k : s.kinds) {
    GroupView g = m.group(rank, k);
    NDMESH_CHECK_CONFIG(!json || g.size() <= kJsonMembers, "mesh",
                        "--json lists every member, and the {} group of rank {} has {} (the limit is {}); "
                        "drop --json for the abbreviated table, or ask for smaller --groups",
                        m.key_name(k), rank, g.size(), kJsonMembers);
    if (!json) continue;
    auto& entry = out["groups"][m.key_name(k)];
    entry = nlohmann::ordered_json::array();
    for (std::int64_t r : g) entry.push_back(r);
  }
  const DimSet dp_cp = m.dims_present("dp-cp");
  if (s.config.folded_ep > 1)
    for (const FoldedKind& f : kFolded)
      out["groups"][f.name] = m.fold_group(rank, dp_cp, s.config.folded_ep, f.part);
  out["neighbours"] = nlohmann::ordered_json::object();
  auto opt = [](std::optional<std::int64_t> v) {
    return v ? nlohmann::ordered_json(*v) : nlohmann::ordered_json(nullptr);
  };
  for (int i = 0; i < m.ndims(); ++i) {
    out["neighbours"][m.dim(i).name] = {
        {"prev", opt(m.neighbour(rank, i, -1, Edge::kLine))},
        {"next", opt(m.neighbour(rank, i, +1, Edge::kLine))},
        {"ring_prev", *m.neighbour(rank, i, -1, Edge::kRing)},
        {"ring_next", *m.neighbour(rank, i, +1, Edge::kRing)},
        {"first", m.first(rank, i)},
        {"last", m.last(rank, i)},
    };
  }
  if (json) {
    fmt::print("{}\n", out.dump());
    return 0;
  }
  fmt::print("rank {} of {} in mesh {}\n", rank, m.world_size(), m.to_string());
  std::vector<std::string> coords;
  for (int i = 0; i < m.ndims(); ++i) coords.push_back(fmt::format("{}={}", m.dim(i).name, c[i]));
  fmt::print("  coords      {}\n", fmt::join(coords, " "));
  if (rpn > 0) {
    auto p = Mesh::placement(rank, rpn);
    fmt::print("  node        {} (local rank {}, {} ranks per node)\n", p.node, p.local_rank, rpn);
  } else {
    fmt::print("  node        unknown (give --ranks-per-node)\n");
  }
  fmt::print("  groups\n");
  for (DimSet k : s.kinds) {
    GroupView g = m.group(rank, k);
    std::string where;
    if (rpn > 0) where = g.front() / rpn == g.back() / rpn ? "  [one node]" : "  [crosses nodes]";
    fmt::print("    {:<12} color {:<6} key {:<6} ranks {}{}\n", m.key_name(k), m.color(rank, k),
               m.key(rank, k), join_ranks(g), where);
  }
  if (s.config.folded_ep > 1)
    for (const FoldedKind& f : kFolded)
      fmt::print("    {:<12} color {:<6} key {:<6} ranks {}  (ep={} folded into dp-cp)\n", f.name,
                 m.fold_color(rank, dp_cp, s.config.folded_ep, f.part),
                 m.fold_key(rank, dp_cp, s.config.folded_ep, f.part),
                 fmt::join(m.fold_group(rank, dp_cp, s.config.folded_ep, f.part), " "), s.config.folded_ep);
  fmt::print("  neighbours  (line: none past the ends; ring: wraps)\n");
  auto text = [](std::optional<std::int64_t> v) { return v ? std::to_string(*v) : std::string("-"); };
  for (int i = 0; i < m.ndims(); ++i)
    fmt::print("    {:<6} prev {:>6} next {:>6}   ring prev {:>6} ring next {:>6}   first {} last {}\n",
               m.dim(i).name, text(m.neighbour(rank, i, -1, Edge::kLine)),
               text(m.neighbour(rank, i, +1, Edge::kLine)), *m.neighbour(rank, i, -1, Edge::kRing),
               *m.neighbour(rank, i, +1, Edge::kRing), m.first(rank, i), m.last(rank, i));
  return 0;
}

int show_mesh(const MeshSetup& s, const Options& o) {
  const Mesh& m = s.mesh;
  std::int64_t rpn = s.config.ranks_per_node;
  if (o.json) {
    NDMESH_CHECK_CONFIG(m.world_size() <= kJsonMembers, "mesh",
                        "--json lists every group's members, and the mesh has {} ranks (the limit is {}); "
                        "drop --json for the abbreviated tables, or add --rank R for one rank's view",
                        m.world_size(), kJsonMembers);
    nlohmann::ordered_json out;
    out["world_size"] = m.world_size();
    out["dims"] = dims_json(m);
    out["groups"] = nlohmann::ordered_json::object();
    for (DimSet k : s.kinds) {
      auto& list = out["groups"][m.key_name(k)];
      list = nlohmann::ordered_json::array();
      m.for_each_group(k, [&](std::int64_t, const GroupView& g) {
        auto members = nlohmann::ordered_json::array();
        g.for_each([&](std::int64_t r) { members.push_back(r); });
        list.push_back(std::move(members));
      });
    }
    if (s.config.folded_ep > 1) {
      out["folded_ep"] = s.config.folded_ep;
      for (const FoldedKind& f : kFolded) out["groups"][f.name] = folded_groups(s, f.part);
    }
    if (rpn > 0) {
      out["ranks_per_node"] = rpn;
      out["placement"] = nlohmann::ordered_json::object();
      for (DimSet k : s.kinds) {
        auto p = m.group_placement(k, rpn);
        out["placement"][m.key_name(k)] = {{"groups", p.groups},
                                           {"groups_crossing_nodes", p.groups_crossing},
                                           {"max_nodes_spanned", p.max_nodes_spanned}};
      }
      out["warnings"] = placement_warnings(s);
    }
    fmt::print("{}\n", out.dump());
    return 0;
  }

  fmt::print("mesh {}  (order fastest first: {})\n", m.to_string(), m.order_string());
  if (rpn > 0) {
    std::int64_t nodes = nodes_of(m.world_size(), rpn);
    fmt::print("world {} ranks, {} per node, {} node{}\n", m.world_size(), rpn, nodes, nodes == 1 ? "" : "s");
  } else {
    fmt::print("world {} ranks\n", m.world_size());
  }
  for (DimSet k : s.kinds) {
    std::int64_t n = m.num_groups(k);
    fmt::print("\n{} groups: {} of {} rank{}\n", m.key_name(k), n, m.group_size(k),
               m.group_size(k) == 1 ? "" : "s");
    for (std::int64_t color = 0; color < std::min(n, o.max_groups); ++color) {
      GroupView g = m.group_by_color(k, color);
      std::string where;
      if (rpn > 0) {
        std::int64_t a = g.front() / rpn, b = g.back() / rpn;
        where = a == b ? fmt::format("  node {}", a) : fmt::format("  nodes {}..{}", a, b);
      }
      fmt::print("  {:>5}: {}{}\n", color, join_ranks(g), where);
    }
    if (n > o.max_groups) fmt::print("  ... {} more (--max-groups N, or --json for all)\n", n - o.max_groups);
  }
  if (s.config.folded_ep > 1) {
    NDMESH_CHECK_CONFIG(
        m.world_size() <= kJsonMembers, "mesh",
        "--fold-ep lists the folded groups of every rank, and the mesh has {} ranks (the limit is "
        "{}); add --rank R for one rank's view",
        m.world_size(), kJsonMembers);
    for (const FoldedKind& f : kFolded) {
      const auto groups = folded_groups(s, f.part);
      const auto n = static_cast<std::int64_t>(groups.size());
      fmt::print("\n{} groups ({}, ep={} folded into dp-cp): {} of {} rank{}\n", f.name,
                 f.part == Mesh::Fold::kInner ? "expert: the ranks that exchange tokens"
                                              : "expert-data-parallel: the ranks that hold the same experts",
                 s.config.folded_ep, n, groups.front().size(), groups.front().size() == 1 ? "" : "s");
      for (std::int64_t color = 0; color < std::min(n, o.max_groups); ++color)
        fmt::print("  {:>5}: {}\n", color, fmt::join(groups[static_cast<std::size_t>(color)], " "));
      if (n > o.max_groups)
        fmt::print("  ... {} more (--max-groups N, or --json for all)\n", n - o.max_groups);
    }
  }
  if (rpn > 0 && m.world_size() > kPlacementWorld) {
    fmt::print("\n(placement report skipped: it walks every group, and the world of {} ranks is above {})\n",
               m.world_size(), kPlacementWorld);
  } else if (rpn > 0) {
    fmt::print("\nplacement ({} ranks per node):\n", rpn);
    for (DimSet k : s.kinds) {
      auto p = m.group_placement(k, rpn);
      if (p.groups_crossing == 0)
        fmt::print("  {:<12} inside one node ({} groups)\n", m.key_name(k), p.groups);
      else
        fmt::print("  {:<12} {} of {} groups cross nodes (up to {} nodes each)\n", m.key_name(k),
                   p.groups_crossing, p.groups, p.max_nodes_spanned);
    }
    for (const auto& w : placement_warnings(s)) fmt::print("warning: {}\n", w);
  } else {
    fmt::print("\n(give --ranks-per-node N for the placement report)\n");
  }
  return 0;
}

Action setup(CLI::App& app) {
  auto o = std::make_shared<Options>();
  o->flags.add_to(app);
  o->rank_option =
      app.add_option("--rank", o->rank, "show one rank's full view: coords, node, groups, neighbours");
  app.add_flag("--json", o->json, "print JSON instead of tables");
  app.add_flag(
      "--fold-ep", o->fold_ep,
      "--ep is a MoE model's expert parallelism folded into dp x cp (as ndmesh train runs it): show its "
      "expert (ep) and expert-data-parallel (edp) groups; without it --ep is a dim of its own");
  app.add_option("--max-groups", o->max_groups, "groups listed per kind in the tables (default 16)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20));
  app.footer(
      "Examples:\n"
      "  ndmesh mesh --dp 2 --pp 2 --cp 2 --tp 2 --ranks-per-node 8\n"
      "  ndmesh mesh --tp 2 --cp 2 --dp 2 --pp 2 --megatron-order tp-cp-dp-pp --groups tp,dp-cp\n"
      "  ndmesh mesh --dims pipe=2,tensor=2,data=4 --groups pipe,tensor,data,pipe-tensor\n"
      "  ndmesh mesh --tp 8 --cp 4 --pp 16 --dp -1 --world 1048576 --rank 777777 --json\n"
      "  ndmesh mesh --dp 4 --ep 2 --fold-ep");
  return [o] {
    o->flags.set_fold_ep(o->fold_ep);
    MeshSetup s = o->flags.resolve();
    if (o->rank_option->count()) return show_rank(s, o->rank, o->json);
    return show_mesh(s, *o);
  };
}

const Subcommand kMesh{"mesh", "Show a layout: groups of any dims, placement on nodes, one rank's view",
                       setup};

}  // namespace
}  // namespace ndmesh::cli::mesh_command
