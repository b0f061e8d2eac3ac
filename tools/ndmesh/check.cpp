// `ndmesh check`: run under a launcher (mpirun, srun, ndmesh launch) with the layout
// flags of `ndmesh mesh`. It builds the communicators of every requested group kind
// (ProcessGroups: mesh agreement check, one split per kind) and verifies every group by
// communication against the mesh: the all_reduce of the members' global ranks equals
// their sum, the all_gather equals the member list in order, and along each single dim
// the ring neighbours (wrapping) and the pipeline neighbours (not wrapping) exchange
// their ranks. On several nodes (as the launcher placed the ranks) it reports which kinds'
// groups cross nodes and warns for the bandwidth-heavy ones (--heavy-dims, default tp).
// Rank 0 prints a summary with the set-up time (or one JSON line); the exit status is 1
// on any mismatch.
#include <algorithm>
#include <array>
#include <chrono>
#include <exception>
#include <memory>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "mesh_flags.hpp"
#include "ndmesh/comm/communicator.hpp"
#include "ndmesh/comm/process_groups.hpp"
#include "ndmesh/core/error.hpp"
#include "subcommand.hpp"

// Its own namespace: the tool compiles as a unity build (CMakeLists.txt), where every
// subcommand's file shares one translation unit with the others.
namespace ndmesh::cli::check_command {
namespace {

using comm::Communicator;

struct CheckOptions {
  MeshFlags flags;
  bool json = false;
  std::int64_t fault_rank = -1;
};

// The outcome of one kind on this rank: 1 per test that saw a wrong value.
struct KindResult {
  DimSet kind;
  std::int64_t sum_bad = 0, gather_bad = 0, ring_bad = 0, line_bad = 0;
  bool has_neighbours = false;
  std::int64_t nodes = 1;  // the real nodes this rank's group spans (from the launcher)
};

// Sends `value` to group rank `to` (if any) and receives from group rank `from` (if any);
// returns what was received, or -1.
std::int64_t exchange(const Communicator& c, std::int64_t value, std::optional<std::int64_t> to,
                      std::optional<std::int64_t> from, int tag) {
  std::int64_t got = -1;
  comm::Work sent;
  if (to) sent = c.send_async(std::span<const std::int64_t>(&value, 1), static_cast<int>(*to), {.tag = tag});
  if (from) c.recv(std::span<std::int64_t>(&got, 1), static_cast<int>(*from), {.tag = tag});
  sent.wait();
  return got;
}

KindResult verify(ProcessGroups& pg, DimSet kind, std::int64_t fault_rank, std::int64_t node) {
  const Mesh& m = pg.mesh();
  const std::int64_t rank = pg.rank();
  // A rank chosen by --fault-rank reports a wrong rank everywhere (to test the check).
  const std::int64_t me = rank == fault_rank ? rank + 1000 : rank;
  const Communicator& c = pg.group(kind);
  GroupView members = m.group(rank, kind);
  KindResult res{.kind = kind};

  std::int64_t sum = me;
  c.all_reduce(std::span<std::int64_t>(&sum, 1));
  std::int64_t expected_sum = 0;
  for (std::int64_t r : members) expected_sum += r;
  res.sum_bad = sum != expected_sum;

  std::vector<std::int64_t> gathered(static_cast<std::size_t>(c.size()));
  c.all_gather(std::span<const std::int64_t>(&me, 1), std::span<std::int64_t>(gathered));
  res.gather_bad = gathered != members.to_vector();

  // Where the launcher really put the members: the nodes the group spans.
  std::vector<std::int64_t> nodes(static_cast<std::size_t>(c.size()));
  c.all_gather(std::span<const std::int64_t>(&node, 1), std::span<std::int64_t>(nodes));
  std::sort(nodes.begin(), nodes.end());
  res.nodes = std::unique(nodes.begin(), nodes.end()) - nodes.begin();

  if (kind.count() == 1) {
    int d = 0;
    while (!kind.contains(d)) ++d;
    if (m.size(d) > 1) {
      res.has_neighbours = true;
      auto group_rank = [&](std::optional<std::int64_t> r) -> std::optional<std::int64_t> {
        if (!r) return std::nullopt;
        return m.key(*r, kind);
      };
      auto ring_next = m.neighbour(rank, d, +1, Edge::kRing),
           ring_prev = m.neighbour(rank, d, -1, Edge::kRing);
      res.ring_bad = exchange(c, me, group_rank(ring_next), group_rank(ring_prev), 1) != *ring_prev;
      auto next = m.neighbour(rank, d, +1, Edge::kLine), prev = m.neighbour(rank, d, -1, Edge::kLine);
      std::int64_t got = exchange(c, me, group_rank(next), group_rank(prev), 2);
      res.line_bad = prev ? got != *prev : false;
    }
  }
  return res;
}

int run(const CheckOptions& o) {
  Communicator world = Communicator::world();
  // Bad input on one rank (a config file only it can see wrongly, different flags) must
  // not leave the others waiting in the next collective for the whole timeout: every rank
  // learns at once that some rank refused its input, and each exits with 2.
  std::optional<MeshSetup> setup;
  std::exception_ptr refused;
  try {
    setup = o.flags.resolve(world.size());
  } catch (const ConfigError&) {
    refused = std::current_exception();
  }
  std::int64_t first_refusing = refused ? world.rank() : world.size();
  world.all_reduce(std::span<std::int64_t>(&first_refusing, 1), {.op = comm::ReduceOp::kMin});
  if (refused) std::rethrow_exception(refused);
  NDMESH_CHECK_CONFIG(first_refusing == world.size(), "check",
                      "rank {} refused its input (its message says why); start every rank with valid flags",
                      first_refusing);
  const MeshSetup& s = *setup;
  // --ranks-per-node is part of the agreement: ranks that disagree would each build
  // their groups for a different machine shape.
  std::array<std::int64_t, 2> rpn_range = {s.config.ranks_per_node, -s.config.ranks_per_node};
  world.all_reduce(std::span<std::int64_t>(rpn_range), {.op = comm::ReduceOp::kMax});
  NDMESH_CHECK_CONFIG(rpn_range[0] == -rpn_range[1], "check",
                      "the ranks disagree on --ranks-per-node (from {} to {}, 0 = not given); start every rank "
                      "with the same layout flags and config",
                      -rpn_range[1], rpn_range[0]);
  LaunchEnv launch = comm::resolve_launch_env(world);

  world.barrier();
  auto start = std::chrono::steady_clock::now();
  ProcessGroups pg(s.mesh, world, s.kinds);
  double mine = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  double setup_seconds = mine;
  world.all_reduce(std::span<double>(&setup_seconds, 1), {.op = comm::ReduceOp::kMax});

  // With --ranks-per-node, does the engine place ranks where the mesh's placement report
  // assumes (consecutive ranks filling nodes)? A warning, not a failure: the flag may
  // describe the machine the layout is planned for.
  const std::int64_t rpn = s.config.ranks_per_node;
  std::int64_t placed_as_assumed = 1;
  if (rpn > 0) {
    Placement p = Mesh::placement(world.rank(), rpn);
    placed_as_assumed = p.node == *launch.node_rank && p.local_rank == *launch.local_rank;
    world.all_reduce(std::span<std::int64_t>(&placed_as_assumed, 1), {.op = comm::ReduceOp::kMin});
  }

  std::vector<KindResult> results;
  for (DimSet k : s.kinds) results.push_back(verify(pg, k, o.fault_rank, *launch.node_rank));

  // Per kind: groups seen (each counted by its member of group rank 0) and groups with a
  // failing test (any member), summed over the world.
  std::int64_t nodes = *launch.node_rank + 1;
  world.all_reduce(std::span<std::int64_t>(&nodes, 1), {.op = comm::ReduceOp::kMax});
  struct Row {
    std::string name;
    std::int64_t groups, size, bad_sum, bad_gather, bad_ring, bad_line;
    bool neighbours;
    GroupPlacement real;  // on the launcher's nodes
  };
  std::vector<Row> rows;
  std::int64_t groups_verified = 0, bad_groups = 0;
  for (const auto& r : results) {
    const Communicator& c = pg.group(r.kind);
    std::array<std::int64_t, 4> bad = {r.sum_bad, r.gather_bad, r.ring_bad, r.line_bad};
    c.all_reduce(std::span<std::int64_t>(bad), {.op = comm::ReduceOp::kMax});
    std::array<std::int64_t, 6> counts = {c.rank() == 0, 0, 0, 0, 0, 0};
    if (c.rank() == 0) {
      for (int i = 0; i < 4; ++i) counts[static_cast<std::size_t>(i) + 1] = bad[static_cast<std::size_t>(i)];
      counts[5] = bad[0] || bad[1] || bad[2] || bad[3];
    }
    world.all_reduce(std::span<std::int64_t>(counts));
    std::array<std::int64_t, 2> span = {c.rank() == 0 && r.nodes > 1, 0};
    world.all_reduce(std::span<std::int64_t>(span.data(), 1));
    span[1] = r.nodes;
    world.all_reduce(std::span<std::int64_t>(span.data() + 1, 1), {.op = comm::ReduceOp::kMax});
    rows.push_back({s.mesh.key_name(r.kind), counts[0], c.size(), counts[1], counts[2], counts[3], counts[4],
                    r.has_neighbours, GroupPlacement{r.kind, counts[0], span[0], span[1]}});
    groups_verified += counts[0];
    bad_groups += counts[5];
  }

  // The heavy kinds (--heavy-dims, default tp) whose groups cross the real nodes.
  std::vector<std::string> warnings;
  for (const auto& row : rows)
    for (DimSet h : s.heavy)
      if (row.real.dims == h && row.real.groups_crossing > 0) warnings.push_back(crossing_warning(s.mesh, row.real));

  if (world.rank() == 0) {
    if (o.json) {
      nlohmann::ordered_json out;
      out["mesh"] = s.mesh.to_string();
      out["world"] = world.size();
      out["nodes"] = nodes;
      out["launcher"] = launcher_name(launch.launcher);
      out["backend"] = world.backend();
      out["setup_seconds"] = setup_seconds;
      out["splits"] = pg.splits();
      out["groups_verified"] = groups_verified;
      out["groups_failed"] = bad_groups;
      if (rpn > 0) out["placement_as_assumed"] = placed_as_assumed == 1;
      out["kinds"] = nlohmann::ordered_json::array();
      for (const auto& row : rows)
        out["kinds"].push_back({{"kind", row.name},
                                {"groups", row.groups},
                                {"size", row.size},
                                {"all_reduce_failed", row.bad_sum},
                                {"all_gather_failed", row.bad_gather},
                                {"ring_failed", row.bad_ring},
                                {"line_failed", row.bad_line},
                                {"groups_crossing_nodes", row.real.groups_crossing},
                                {"max_nodes_spanned", row.real.max_nodes_spanned}});
      out["warnings"] = nlohmann::ordered_json::array();
      for (const auto& w : warnings) out["warnings"].push_back(w);
      out["ok"] = bad_groups == 0;
      fmt::print("{}\n", out.dump());
    } else {
      fmt::print("ndmesh check: mesh {} on {} ranks, {} node{} ({}, {} backend)\n", s.mesh.to_string(),
                 world.size(), nodes, nodes == 1 ? "" : "s", launcher_name(launch.launcher), world.backend());
      fmt::print("set-up: {} kind{} with {} split{} in {:.4f} s (slowest rank)\n", rows.size(),
                 rows.size() == 1 ? "" : "s", pg.splits(), pg.splits() == 1 ? "" : "s", setup_seconds);
      fmt::print("  {:<12} {:>6} {:>5}  {:<10} {:<10} {:<6} {:<6}\n", "kind", "groups", "size", "all_reduce",
                 "all_gather", "ring", "line");
      auto cell = [](std::int64_t bad, bool applies = true) {
        return !applies ? std::string("-") : bad == 0 ? std::string("ok") : fmt::format("{} bad", bad);
      };
      for (const auto& row : rows)
        fmt::print("  {:<12} {:>6} {:>5}  {:<10} {:<10} {:<6} {:<6}\n", row.name, row.groups, row.size,
                   cell(row.bad_sum), cell(row.bad_gather), cell(row.bad_ring, row.neighbours),
                   cell(row.bad_line, row.neighbours));
      if (nodes > 1) {
        fmt::print("placement on the launcher's {} nodes:\n", nodes);
        for (const auto& row : rows)
          if (row.real.groups_crossing == 0)
            fmt::print("  {:<12} inside one node ({} groups)\n", row.name, row.groups);
          else
            fmt::print("  {:<12} {} of {} groups cross nodes (up to {} nodes each)\n", row.name,
                       row.real.groups_crossing, row.groups, row.real.max_nodes_spanned);
      }
      for (const auto& w : warnings) fmt::print("warning: {}\n", w);
      if (rpn > 0 && placed_as_assumed == 0)
        fmt::print(
            "warning: --ranks-per-node {} assumes ranks fill nodes {} at a time, but the launcher placed "
            "them "
            "otherwise ({} node{} here); groups the placement report keeps inside a node may cross nodes\n",
            rpn, rpn, nodes, nodes == 1 ? "" : "s");
      if (bad_groups == 0)
        fmt::print("verified {} groups: all match the mesh\n", groups_verified);
      else
        fmt::print("FAILED: {} of {} groups do not match the mesh\n", bad_groups, groups_verified);
    }
    std::fflush(stdout);
  }
  world.barrier();
  return bad_groups == 0 ? 0 : 1;
}

Action setup(CLI::App& app) {
  auto o = std::make_shared<CheckOptions>();
  o->flags.add_to(app);
  app.add_flag("--json", o->json, "rank 0 prints one JSON line (setup_seconds, groups_verified, ...)");
  app.add_option("--fault-rank", o->fault_rank,
                 "testing: this rank reports a wrong rank, so the check must fail")
      ->group("");
  app.footer(
      "Run it under a launcher, one process per rank:\n"
      "  mpirun -np 8 ndmesh check --dp 2 --pp 2 --tp 2\n"
      "  srun --mpi=pmix -n 8 ndmesh check --pp 2 --cp 2 --tp 2 --json\n"
      "  ndmesh launch -n 8 -- ndmesh check --dp 2 --pp 2 --tp 2 --groups dp,pp,tp,dp-pp,pp-tp");
  return [o] { return run(*o); };
}

const Subcommand kCheck{
    "check", "Create the communicators of a layout and verify every group by communication", setup};

}  // namespace
}  // namespace ndmesh::cli::check_command
