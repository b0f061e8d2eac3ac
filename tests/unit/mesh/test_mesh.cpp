// Mesh: exact memberships for hand-derived layouts, and properties over hundreds of
// random shapes checked against an independent brute-force decomposition.
#include <algorithm>
#include <map>
#include <random>
#include <set>

#include <fmt/core.h>
#include <gtest/gtest.h>

#include "ndmesh/core/error.hpp"
#include "ndmesh/mesh/mesh.hpp"

namespace ndmesh {
namespace {

using Groups = std::vector<std::vector<std::int64_t>>;

Groups all_groups(const Mesh& m, std::string_view spec) {
  DimSet s = m.dims_of(spec);
  Groups out;
  for (std::int64_t c = 0; c < m.num_groups(s); ++c) out.push_back(m.group_by_color(s, c).to_vector());
  return out;
}

// Megatron's default order "tp-cp-ep-dp-pp" (fastest first), every size 2 except ep=1:
// strides tp 1, cp 2, dp 4, pp 8. Expected groups written out by hand.
TEST(MeshExact, MegatronDefaultOrderW16) {
  Mesh m = Mesh::from_order("tp-cp-ep-dp-pp", {{"tp", 2}, {"cp", 2}, {"ep", 1}, {"dp", 2}, {"pp", 2}});
  EXPECT_EQ(m.world_size(), 16);
  EXPECT_EQ(m.to_string(), "pp=2,dp=2,ep=1,cp=2,tp=2");
  EXPECT_EQ(all_groups(m, "tp"),
            (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}}));
  EXPECT_EQ(all_groups(m, "cp"),
            (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
  EXPECT_EQ(all_groups(m, "dp"),
            (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13}, {10, 14}, {11, 15}}));
  EXPECT_EQ(all_groups(m, "pp"),
            (Groups{{0, 8}, {1, 9}, {2, 10}, {3, 11}, {4, 12}, {5, 13}, {6, 14}, {7, 15}}));
  EXPECT_EQ(all_groups(m, "ep"),
            (Groups{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}, {8}, {9}, {10}, {11}, {12}, {13}, {14}, {15}}));
  EXPECT_EQ(all_groups(m, "cp-dp"), (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}}));
  EXPECT_EQ(all_groups(m, "tp-pp"), (Groups{{0, 1, 8, 9}, {2, 3, 10, 11}, {4, 5, 12, 13}, {6, 7, 14, 15}}));
  EXPECT_EQ(all_groups(m, "tp-cp"), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}, {12, 13, 14, 15}}));
  EXPECT_EQ(all_groups(m, "tp-cp-dp-pp").size(), 1u);
  EXPECT_EQ(m.key_name(m.dims_of("tp-pp")), "pp-tp");
}

TEST(MeshExact, DefaultOrderCoordinates) {
  Mesh m{{"dp", 2}, {"pp", 2}, {"cp", 1}, {"tp", 2}};
  // rank = dp*4 + pp*2 + tp
  for (std::int64_t r = 0; r < 8; ++r) {
    Coords c = m.coords(r);
    EXPECT_EQ(c[0], r / 4);
    EXPECT_EQ(c[1], r / 2 % 2);
    EXPECT_EQ(c[2], 0);
    EXPECT_EQ(c[3], r % 2);
    EXPECT_EQ(m.rank(c), r);
  }
  EXPECT_EQ(m.coord_of(5, "tp"), 1);
  EXPECT_EQ(m.coord_of(5, "ep"), 0);
  EXPECT_EQ(m.size_of("ep"), 1);
}

TEST(MeshExact, ColorKeyAndNeighbours) {
  Mesh m{{"dp", 3}, {"pp", 4}, {"tp", 2}};  // rank = dp*8 + pp*2 + tp
  DimSet pp = m.dims_of("pp");
  EXPECT_EQ(m.group(13, pp).to_vector(), (std::vector<std::int64_t>{9, 11, 13, 15}));
  EXPECT_EQ(m.key(13, pp), 2);
  EXPECT_EQ(m.color(13, pp), 1 * 2 + 1);  // (dp=1, tp=1) row-major over dp, tp
  EXPECT_EQ(m.neighbour(13, 1, +1, Edge::kLine), 15);
  EXPECT_EQ(m.neighbour(15, 1, +1, Edge::kLine), std::nullopt);
  EXPECT_EQ(m.neighbour(15, 1, +1, Edge::kRing), 9);
  EXPECT_EQ(m.neighbour(9, 1, -1, Edge::kRing), 15);
  EXPECT_EQ(m.neighbour(9, 1, -5, Edge::kRing), 15);
  EXPECT_EQ(m.neighbour(9, 1, -1, Edge::kLine), std::nullopt);
  EXPECT_EQ(m.first(13, 1), 9);
  EXPECT_EQ(m.last(13, 1), 15);
  EXPECT_EQ(m.group_label(13, pp), "pp_group_dp1_tp1");
  EXPECT_TRUE(m.group(13, pp).contains(11));
  EXPECT_FALSE(m.group(13, pp).contains(12));
  EXPECT_FALSE(m.group(13, pp).contains(24));
}

// Expert parallelism folded into dp x cp (Megatron-core, torchtitan): ep consecutive members
// of each dp-cp group exchange tokens; the members at the same place of every block hold the
// same experts.
TEST(MeshExact, FoldedExpertGroups) {
  using V = std::vector<std::int64_t>;
  const Mesh m({{"dp", 4}, {"pp", 1}, {"cp", 1}, {"tp", 2}});
  const DimSet dp_cp = m.dims_present("dp-cp");  // rank 0's: 0 2 4 6; rank 1's: 1 3 5 7
  EXPECT_EQ(m.fold_group(0, dp_cp, 2, Mesh::Fold::kInner), (V{0, 2}));
  EXPECT_EQ(m.fold_group(6, dp_cp, 2, Mesh::Fold::kInner), (V{4, 6}));
  EXPECT_EQ(m.fold_group(3, dp_cp, 2, Mesh::Fold::kInner), (V{1, 3}));
  EXPECT_EQ(m.fold_group(0, dp_cp, 2, Mesh::Fold::kOuter), (V{0, 4}));
  EXPECT_EQ(m.fold_group(2, dp_cp, 2, Mesh::Fold::kOuter), (V{2, 6}));
  EXPECT_EQ(m.fold_group(7, dp_cp, 2, Mesh::Fold::kOuter), (V{3, 7}));
  EXPECT_EQ(m.fold_group(5, dp_cp, 4, Mesh::Fold::kInner), (V{1, 3, 5, 7}));
  EXPECT_EQ(m.fold_group(5, dp_cp, 4, Mesh::Fold::kOuter), (V{5}));
  EXPECT_EQ(m.fold_group(5, dp_cp, 1, Mesh::Fold::kOuter), (V{1, 3, 5, 7}));
  // Colors number the groups of a part 0..n-1 over the world, keys are the places in them.
  for (std::int64_t ep : {1, 2, 4})
    for (auto part : {Mesh::Fold::kInner, Mesh::Fold::kOuter}) {
      std::map<std::int64_t, V> by_color;
      for (std::int64_t r = 0; r < m.world_size(); ++r) {
        const V g = m.fold_group(r, dp_cp, ep, part);
        EXPECT_EQ(g[static_cast<std::size_t>(m.fold_key(r, dp_cp, ep, part))], r);
        by_color[m.fold_color(r, dp_cp, ep, part)].push_back(r);
      }
      const auto groups = static_cast<std::int64_t>(by_color.size());
      EXPECT_EQ(by_color.rbegin()->first, groups - 1);
      for (const auto& [color, members] : by_color)
        EXPECT_EQ(members, m.fold_group(members[0], dp_cp, ep, part));
    }
  // With cp, the dp-cp group is dp-major: ep=2 pairs the cp ranks of one dp rank.
  const Mesh c({{"dp", 2}, {"cp", 2}});
  EXPECT_EQ(c.fold_group(1, c.dims_of("dp-cp"), 2, Mesh::Fold::kInner), (V{0, 1}));
  EXPECT_EQ(c.fold_group(1, c.dims_of("dp-cp"), 2, Mesh::Fold::kOuter), (V{1, 3}));
  EXPECT_THROW(m.fold_group(0, dp_cp, 3, Mesh::Fold::kInner), ConfigError);
}

TEST(MeshExact, DimsPresentSkipsAbsentNames) {
  Mesh m{{"dp", 2}, {"tp", 3}};
  EXPECT_EQ(m.dims_present("cp-dp"), m.dims_of("dp"));
  EXPECT_EQ(m.dims_present("tp,dp,ep"), m.all());
  EXPECT_TRUE(m.dims_present("cp").empty());
  EXPECT_THROW(m.dims_of("cp-dp"), ConfigError);  // the strict spelling still rejects them
}

TEST(MeshExact, EmptySubsetIsTheRankAlone) {
  Mesh m{{"dp", 2}, {"tp", 3}};
  EXPECT_EQ(m.group(4, DimSet{}).to_vector(), (std::vector<std::int64_t>{4}));
  EXPECT_EQ(m.num_groups(DimSet{}), 6);
}

TEST(MeshText, RoundTripAndSpellings) {
  Mesh m = Mesh::parse("dp=2,pp=2,cp=1,tp=2");
  EXPECT_EQ(m.to_string(), "dp=2,pp=2,cp=1,tp=2");
  EXPECT_EQ(m.order_string(), "tp-cp-pp-dp");
  EXPECT_EQ(Mesh::parse(m.to_string()), m);
  EXPECT_EQ(Mesh::from_order("tp-cp-pp-dp", {{"dp", 2}, {"pp", 2}, {"cp", 1}, {"tp", 2}}), m);
  EXPECT_EQ(Mesh::parse(" dp = 2 , tp=2 "), (Mesh{{"dp", 2}, {"tp", 2}}));
}

TEST(MeshErrors, BadInputNamesTheValue) {
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([] { Mesh{{"tp", 2}, {"tp", 2}}; }).find("'tp' appears twice"), std::string::npos);
  EXPECT_NE(message([] { Mesh{{"tp", 0}}; }).find("tp=0"), std::string::npos);
  EXPECT_NE(message([] { Mesh{{"", 2}}; }).find("not valid"), std::string::npos);
  EXPECT_NE(message([] { Mesh::parse("dp=2,tp"); }).find("'tp'"), std::string::npos);
  EXPECT_NE(message([] { Mesh::parse("dp=x"); }).find("'x'"), std::string::npos);
  EXPECT_NE(message([] { Mesh::from_order("tp-dp", {{"tp", 2}}); }).find("'dp'"), std::string::npos);
  EXPECT_NE(message([] { Mesh::from_order("tp", {{"tp", 2}, {"pp", 2}}); }).find("pp=2"), std::string::npos);
  EXPECT_NE(message([] { (Mesh{{"dp", 2}}).dims_of("dp-xx"); }).find("'xx'"), std::string::npos);
  EXPECT_NE(message([] { (Mesh{{"dp", 2}}).dims_of("dp-dp"); }).find("twice"), std::string::npos);
  EXPECT_NE(message([] { (Mesh{{"dp", 2}}).coords(2); }).find("rank 2"), std::string::npos);
  std::vector<Dim> nine;
  for (int i = 0; i < 9; ++i) nine.push_back({fmt::format("d{}", i), 1});
  EXPECT_NE(message([&] { Mesh m(nine); }).find("at most 8"), std::string::npos);
  EXPECT_NE(message([] {
              Mesh{{"a", 1 << 30}, {"b", 1 << 30}, {"c", 1 << 30}};
            }).find("2^62"),
            std::string::npos);
}

TEST(MeshPlacement, NodesAndCrossingGroups) {
  Mesh m{{"dp", 2}, {"pp", 2}, {"cp", 2}, {"tp", 2}};
  EXPECT_EQ(Mesh::placement(13, 8).node, 1);
  EXPECT_EQ(Mesh::placement(13, 8).local_rank, 5);
  EXPECT_TRUE(m.groups_within_node(m.dims_of("tp"), 8));
  EXPECT_TRUE(m.groups_within_node(m.dims_of("tp-cp-pp"), 8));
  EXPECT_FALSE(m.groups_within_node(m.dims_of("dp"), 8));
  auto dp = m.group_placement(m.dims_of("dp"), 8);
  EXPECT_EQ(dp.groups, 8);
  EXPECT_EQ(dp.groups_crossing, 8);
  EXPECT_EQ(dp.max_nodes_spanned, 2);
  // 3 ranks per node: tp groups {0,1},{2,3}: {2,3} straddles nodes 0 and 1.
  auto tp = m.group_placement(m.dims_of("tp"), 3);
  // groups {0,1} {2,3} {4,5} {6,7} {8,9} {10,11} {12,13} {14,15}; nodes of 3 ranks:
  // {2,3}: 0|1 cross, {8,9}: 2|3 cross, {14,15}: 4|5 cross.
  EXPECT_EQ(tp.groups_crossing, 3);
  // dp groups {r, r+8} with 4 ranks per node skip node 1: they touch exactly 2 nodes.
  EXPECT_EQ(m.group_placement(m.dims_of("dp"), 4).max_nodes_spanned, 2);
}

TEST(MeshPermutation, SameNamedCoordinates) {
  Mesh a{{"dp", 2}, {"pp", 3}, {"tp", 2}};
  Mesh b{{"tp", 2}, {"dp", 2}, {"pp", 3}};
  auto perm = Mesh::permutation(a, b);
  ASSERT_EQ(perm.size(), 12u);
  for (std::int64_t r = 0; r < 12; ++r) {
    for (const auto& d : a.dims()) EXPECT_EQ(a.coord_of(r, d.name), b.coord_of(perm[r], d.name));
  }
  EXPECT_EQ(perm[1], 6);  // a: tp=1 -> b: tp is outermost, stride 6
  EXPECT_THROW(Mesh::permutation(a, Mesh{{"dp", 2}, {"pp", 3}, {"tp", 3}}), ConfigError);
}

// ------------------------------------------------------------------ property tests

// Independent decomposition: coordinates by repeated division from the innermost dim.
std::vector<std::int64_t> brute_coords(const std::vector<std::int64_t>& sizes, std::int64_t r) {
  std::vector<std::int64_t> c(sizes.size());
  for (int i = static_cast<int>(sizes.size()) - 1; i >= 0; --i) {
    c[i] = r % sizes[i];
    r /= sizes[i];
  }
  return c;
}

// 300 random shapes; 60 of them under AddressSanitizer (make sanitize), where the brute force of
// the test's own unoptimised code made it 36 s: the same checks, a fifth of the shapes.
#if defined(__SANITIZE_ADDRESS__)
constexpr int kRandomShapes = 60;
#else
constexpr int kRandomShapes = 300;
#endif

TEST(MeshProperties, RandomShapes) {
  std::mt19937_64 rng(20261122);
  const std::vector<std::string> names = {"dp", "pp", "cp", "tp", "ep", "x", "y", "z"};
  int shapes = 0;
  while (shapes < kRandomShapes) {
    int nd = 1 + static_cast<int>(rng() % 6);
    std::vector<Dim> dims;
    std::vector<std::int64_t> sizes;
    std::int64_t world = 1;
    std::vector<std::string> pool = names;
    std::shuffle(pool.begin(), pool.end(), rng);
    for (int i = 0; i < nd; ++i) {
      static constexpr std::int64_t kChoices[] = {1, 1, 2, 2, 3, 4, 5, 7, 8, 16};
      std::int64_t s = kChoices[rng() % 10];
      dims.push_back({pool[i], s});
      sizes.push_back(s);
      world *= s;
    }
    if (world > 4096) continue;
    ++shapes;
    Mesh m(dims);
    ASSERT_EQ(m.world_size(), world);

    // Both spellings and the text form give the same mesh.
    std::map<std::string, std::int64_t> by_name;
    for (const auto& d : dims) by_name[d.name] = d.size;
    EXPECT_EQ(Mesh::from_order(m.order_string(), by_name), m);
    EXPECT_EQ(Mesh::parse(m.to_string()), m);

    // rank <-> coords is a bijection matching the brute-force decomposition.
    for (std::int64_t r = 0; r < world; ++r) {
      Coords c = m.coords(r);
      auto bc = brute_coords(sizes, r);
      for (int i = 0; i < nd; ++i) ASSERT_EQ(c[i], bc[i]);
      ASSERT_EQ(m.rank(c), r);
    }

    for (std::uint32_t bits = 0; bits < (1u << nd); ++bits) {
      DimSet s(bits);
      // Brute force: ranks keyed by their coordinates outside s.
      std::map<std::vector<std::int64_t>, std::vector<std::int64_t>> expected;
      for (std::int64_t r = 0; r < world; ++r) {
        auto c = brute_coords(sizes, r);
        std::vector<std::int64_t> outside;
        for (int i = 0; i < nd; ++i)
          if (!s.contains(i)) outside.push_back(c[i]);
        expected[outside].push_back(r);  // ascending rank == row-major over s
      }
      ASSERT_EQ(m.num_groups(s), static_cast<std::int64_t>(expected.size()));
      // map order of `outside` is row-major over the other dims == color order.
      std::int64_t color = 0;
      std::vector<int> seen(world, 0);
      for (const auto& [outside, members] : expected) {
        GroupView g = m.group_by_color(s, color);
        ASSERT_EQ(g.to_vector(), members) << m.to_string() << " subset " << m.key_name(s);
        ASSERT_EQ(g.size(), static_cast<std::int64_t>(members.size()));
        ASSERT_EQ(g.back(), members.back());
        for (std::int64_t k = 0; k < g.size(); ++k) {
          std::int64_t r = g[k];
          ASSERT_EQ(r, members[k]);
          ASSERT_EQ(m.color(r, s), color);
          ASSERT_EQ(m.key(r, s), k);
          ASSERT_TRUE(g.contains(r));
          ++seen[r];
        }
        ASSERT_EQ(m.group(members[members.size() / 2], s).to_vector(), members);
        ++color;
      }
      for (int v : seen) ASSERT_EQ(v, 1);  // each kind of group partitions the world

      // for_each_group and GroupView::for_each visit the same groups and members.
      std::vector<std::vector<std::int64_t>> walked;
      m.for_each_group(s, [&](std::int64_t c, const GroupView& g) {
        ASSERT_EQ(c, static_cast<std::int64_t>(walked.size()));
        std::vector<std::int64_t> members;
        g.for_each([&](std::int64_t r) { members.push_back(r); });
        walked.push_back(members);
      });
      ASSERT_EQ(walked.size(), expected.size());
      std::size_t gi = 0;
      for (const auto& [outside, members] : expected) ASSERT_EQ(walked[gi++], members);
    }

    // Neighbours are inverse to each other, and line neighbours stop at the ends.
    for (std::int64_t r = 0; r < world; r += 1 + world / 64) {
      for (int i = 0; i < nd; ++i) {
        for (std::int64_t off : {1, 2, -1, 3}) {
          auto fwd = m.neighbour(r, i, off, Edge::kRing);
          ASSERT_TRUE(fwd.has_value());
          ASSERT_EQ(m.neighbour(*fwd, i, -off, Edge::kRing), r);
          auto line = m.neighbour(r, i, off, Edge::kLine);
          std::int64_t target = m.coord(r, i) + off;
          ASSERT_EQ(line.has_value(), target >= 0 && target < sizes[i]);
          if (line) {
            ASSERT_EQ(m.neighbour(*line, i, -off, Edge::kLine), r);
          }
        }
        ASSERT_EQ(m.coord(m.first(r, i), i), 0);
        ASSERT_EQ(m.coord(m.last(r, i), i), sizes[i] - 1);
      }
    }

    // The permutation to a shuffled order keeps every named coordinate.
    std::vector<Dim> shuffled = dims;
    std::shuffle(shuffled.begin(), shuffled.end(), rng);
    Mesh other(shuffled);
    auto perm = Mesh::permutation(m, other);
    std::vector<std::int64_t> sorted_perm = perm;
    std::sort(sorted_perm.begin(), sorted_perm.end());
    for (std::int64_t r = 0; r < world; ++r) ASSERT_EQ(sorted_perm[r], r);
    for (std::int64_t r = 0; r < world; r += 1 + world / 32)
      for (const auto& d : dims) ASSERT_EQ(m.coord_of(r, d.name), other.coord_of(perm[r], d.name));
  }
}

TEST(MeshProperties, MillionRankMeshAnswersWithoutEnumerating) {
  Mesh m{{"dp", 2048}, {"pp", 16}, {"cp", 4}, {"tp", 8}};
  ASSERT_EQ(m.world_size(), 1048576);
  std::int64_t r = 777777;
  Coords c = m.coords(r);
  EXPECT_EQ(m.rank(c), r);
  GroupView dp = m.group(r, m.dims_of("dp"));
  EXPECT_EQ(dp.size(), 2048);
  EXPECT_EQ(dp[0], r % 512);
  EXPECT_EQ(dp[2047], r % 512 + 2047 * 512);
  EXPECT_EQ(m.key(r, m.dims_of("dp")), r / 512);
}

}  // namespace
}  // namespace ndmesh
