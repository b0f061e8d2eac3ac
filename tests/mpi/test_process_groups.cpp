// ProcessGroups under mpirun, checked by communication against a reference computed
// here by brute force (not by the Mesh): a rank's coordinates are the mixed-radix digits
// of its number with the outermost dim first, and a group over a set of dims is every
// rank that shares the other coordinates, in ascending rank order.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "ndmesh/comm/process_groups.hpp"
#include "ndmesh/core/error.hpp"

namespace ndmesh {
namespace {

using comm::Communicator;
using comm::Work;

struct Layout {
  std::vector<Dim> dims;  // outer to inner
};

// Layouts for every world size the tests run with: size-1 dims, odd orders, tp outermost,
// the seed 004 order (pipe outer, data inner), a 5-dim mesh with ep.
const std::vector<Layout>& catalog() {
  static const std::vector<Layout> kLayouts = {
      {{{"dp", 2}}},
      {{{"dp", 1}, {"pp", 1}, {"cp", 1}, {"tp", 2}}},
      {{{"tp", 2}, {"dp", 1}, {"pp", 1}}},
      {{{"dp", 2}, {"pp", 1}, {"cp", 1}, {"tp", 2}}},
      {{{"tp", 2}, {"dp", 2}}},
      {{{"pp", 2}, {"cp", 2}}},
      {{{"dp", 1}, {"pp", 4}, {"tp", 1}}},
      {{{"dp", 2}, {"pp", 2}, {"cp", 1}, {"tp", 2}}},
      {{{"pp", 2}, {"cp", 2}, {"tp", 2}}},
      {{{"tp", 2}, {"pp", 2}, {"dp", 2}}},
      {{{"cp", 4}, {"tp", 2}}},
      {{{"dp", 8}}},
      {{{"dp", 2}, {"pp", 2}, {"cp", 2}, {"tp", 2}}},
      {{{"pp", 2}, {"tp", 2}, {"dp", 4}}},
      {{{"dp", 4}, {"cp", 1}, {"tp", 4}}},
      {{{"dp", 2}, {"ep", 2}, {"pp", 2}, {"cp", 1}, {"tp", 2}}},
      {{{"tp", 16}}},
  };
  return kLayouts;
}

std::vector<Layout> layouts_for(std::int64_t world) {
  std::vector<Layout> out;
  for (const auto& l : catalog()) {
    std::int64_t n = 1;
    for (const auto& d : l.dims) n *= d.size;
    if (n == world) out.push_back(l);
  }
  return out;
}

std::vector<std::int64_t> digits(const Layout& l, std::int64_t rank) {
  std::vector<std::int64_t> c(l.dims.size());
  for (std::size_t i = l.dims.size(); i-- > 0;) {
    c[i] = rank % l.dims[i].size;
    rank /= l.dims[i].size;
  }
  return c;
}

// Ranks sharing every coordinate outside `chosen` (indices into l.dims) with `rank`.
std::vector<std::int64_t> reference_group(const Layout& l, std::int64_t world, std::int64_t rank,
                                          const std::vector<bool>& chosen) {
  auto mine = digits(l, rank);
  std::vector<std::int64_t> out;
  for (std::int64_t q = 0; q < world; ++q) {
    auto c = digits(l, q);
    bool same = true;
    for (std::size_t i = 0; i < c.size(); ++i) same = same && (chosen[i] || c[i] == mine[i]);
    if (same) out.push_back(q);
  }
  return out;
}

std::string describe(const Layout& l) {
  std::string s;
  for (const auto& d : l.dims) s += (s.empty() ? "" : ",") + d.name + "=" + std::to_string(d.size);
  return s;
}

TEST(ProcessGroups, EveryKindOfEveryLayoutVerifiedByCommunication) {
  Communicator world = Communicator::world();
  const std::int64_t n = world.size(), r = world.rank();
  auto layouts = layouts_for(n);
  ASSERT_GE(layouts.size(), 2u) << "no layouts for world " << n;
  for (const auto& l : layouts) {
    SCOPED_TRACE(describe(l));
    Mesh mesh(l.dims);
    ProcessGroups pg(mesh, world);
    const int nd = static_cast<int>(l.dims.size());
    // Every non-empty subset of the dims, created in one call.
    std::vector<DimSet> kinds;
    for (std::uint32_t bits = 1; bits < (1u << nd); ++bits) kinds.emplace_back(bits);
    pg.create(kinds);
    for (DimSet kind : kinds) {
      std::vector<bool> chosen(static_cast<std::size_t>(nd));
      std::string name;
      for (int i = 0; i < nd; ++i) {
        chosen[static_cast<std::size_t>(i)] = kind.contains(i);
        if (kind.contains(i)) name += (name.empty() ? "" : "-") + l.dims[static_cast<std::size_t>(i)].name;
      }
      SCOPED_TRACE(name);
      auto expected = reference_group(l, n, r, chosen);
      const Communicator& c = pg.group(kind);
      EXPECT_EQ(c.name(), name);
      ASSERT_EQ(c.size(), static_cast<int>(expected.size()));
      auto idx = std::find(expected.begin(), expected.end(), r) - expected.begin();
      EXPECT_EQ(c.rank(), idx);
      // all_reduce of the members' global ranks
      std::int64_t sum = r;
      c.all_reduce(std::span<std::int64_t>(&sum, 1));
      EXPECT_EQ(sum, std::accumulate(expected.begin(), expected.end(), std::int64_t{0}));
      // all_gather of the members' global ranks, in group order
      std::vector<std::int64_t> gathered(expected.size());
      std::int64_t mine = r;
      c.all_gather(std::span<const std::int64_t>(&mine, 1), std::span<std::int64_t>(gathered));
      EXPECT_EQ(gathered, expected);
      // ring: send my rank to the next member, receive the previous member's
      const int size = c.size();
      std::int64_t from_prev = -1;
      Work sent = c.send_async(std::span<const std::int64_t>(&mine, 1), static_cast<int>((idx + 1) % size));
      c.recv(std::span<std::int64_t>(&from_prev, 1), static_cast<int>((idx + size - 1) % size));
      sent.wait();
      EXPECT_EQ(from_prev, expected[static_cast<std::size_t>((idx + size - 1) % size)]);
    }
    // Kinds that differ only by size-1 dims share one communicator: the splits made are
    // the distinct sets of dims of size > 1, minus the full set (the world itself) and
    // the empty set (groups of one, made without communication).
    std::vector<std::uint32_t> distinct;
    std::uint32_t full = 0;
    for (int i = 0; i < nd; ++i)
      if (l.dims[static_cast<std::size_t>(i)].size > 1) full |= 1u << i;
    for (DimSet k : kinds) {
      std::uint32_t b = k.bits() & full;
      if (b != full && b != 0 && std::find(distinct.begin(), distinct.end(), b) == distinct.end())
        distinct.push_back(b);
    }
    EXPECT_EQ(pg.splits(), static_cast<int>(distinct.size()));
    world.barrier();
  }
}

TEST(ProcessGroups, SeedAccessorsMatchTheReference) {
  Communicator world = Communicator::world();
  const std::int64_t n = world.size(), r = world.rank();
  for (const auto& l : layouts_for(n)) {
    SCOPED_TRACE(describe(l));
    ProcessGroups pg(Mesh(l.dims), world);
    auto find = [&](const std::string& name) {
      for (std::size_t i = 0; i < l.dims.size(); ++i)
        if (l.dims[i].name == name) return static_cast<int>(i);
      return -1;
    };
    auto ref = [&](std::initializer_list<const char*> names) {
      std::vector<bool> chosen(l.dims.size());
      for (const char* nm : names)
        if (int i = find(nm); i >= 0) chosen[static_cast<std::size_t>(i)] = true;
      return reference_group(l, n, r, chosen);
    };
    auto ranks_of = [](const Communicator& c) { return c.members(); };
    EXPECT_EQ(ranks_of(pg.tp()), ref({"tp"}));
    EXPECT_EQ(ranks_of(pg.cp()), ref({"cp"}));
    EXPECT_EQ(ranks_of(pg.pp()), ref({"pp"}));
    EXPECT_EQ(ranks_of(pg.dp()), ref({"dp"}));
    EXPECT_EQ(ranks_of(pg.cp_dp()), ref({"cp", "dp"}));
    EXPECT_EQ(ranks_of(pg.pp_dp()), ref({"pp", "dp"}));
    EXPECT_EQ(ranks_of(pg.model()), ref({"pp", "tp"}));
    // Ring along cp and line along pp, from the reference groups.
    auto cp = ref({"cp"});
    auto ci = std::find(cp.begin(), cp.end(), r) - cp.begin();
    auto csz = static_cast<std::ptrdiff_t>(cp.size());
    EXPECT_EQ(pg.view().cp_send_rank(), cp[static_cast<std::size_t>((ci + 1) % csz)]);
    EXPECT_EQ(pg.view().cp_recv_rank(), cp[static_cast<std::size_t>((ci + csz - 1) % csz)]);
    auto pp = ref({"pp"});
    auto pi = std::find(pp.begin(), pp.end(), r) - pp.begin();
    auto psz = static_cast<std::ptrdiff_t>(pp.size());
    EXPECT_EQ(pg.view().pp_is_first_stage(), pi == 0);
    EXPECT_EQ(pg.view().pp_is_last_stage(), pi == psz - 1);
    if (pi + 1 < psz) {
      EXPECT_EQ(pg.view().pp_next_rank(), pp[static_cast<std::size_t>(pi + 1)]);
    } else {
      EXPECT_FALSE(pg.view().pp_next_rank().has_value());
    }
    if (pi > 0) {
      EXPECT_EQ(pg.view().pp_prev_rank(), pp[static_cast<std::size_t>(pi - 1)]);
    } else {
      EXPECT_FALSE(pg.view().pp_prev_rank().has_value());
    }
    world.barrier();
  }
}

// The embedding group (tied embeddings under pipeline parallelism): the first and the last
// rank of the reference pp group; empty on the stages in between; one rank when pp = 1.
// Checked by communication: the sum of the members' world ranks.
TEST(ProcessGroups, EmbeddingGroupIsFirstAndLastStageOfEachPipeline) {
  Communicator world = Communicator::world();
  const std::int64_t n = world.size(), r = world.rank();
  for (const auto& l : layouts_for(n)) {
    SCOPED_TRACE(describe(l));
    ProcessGroups pg(Mesh(l.dims), world);
    std::vector<bool> chosen(l.dims.size());
    for (std::size_t i = 0; i < l.dims.size(); ++i) chosen[i] = l.dims[i].name == "pp";
    const auto pp = reference_group(l, n, r, chosen);
    const Communicator& emb = pg.embedding();
    const bool end = r == pp.front() || r == pp.back();
    ASSERT_EQ(emb.valid(), end);
    if (end) {
      std::vector<std::int64_t> expected = {pp.front()};
      if (pp.size() > 1) expected.push_back(pp.back());
      EXPECT_EQ(emb.members(), expected);
      EXPECT_EQ(emb.name(), "embedding");
      std::int64_t sum = r;
      emb.all_reduce(std::span<std::int64_t>(&sum, 1));
      EXPECT_EQ(sum, std::accumulate(expected.begin(), expected.end(), std::int64_t{0}));
    }
    world.barrier();
  }
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(ProcessGroups, AMeshThatDiffersOnOneRankIsACleanErrorOnEveryRank) {
  Communicator world = Communicator::world();
  const std::int64_t n = world.size(), r = world.rank();
  // The last rank swaps the order of the two dims: same sizes, other layout.
  Mesh mine = r == n - 1 ? Mesh({{"tp", 2}, {"dp", n / 2}}) : Mesh({{"dp", n / 2}, {"tp", 2}});
  std::string msg = error_of([&] { ProcessGroups pg(mine, world, {.timeout_s = 30}); });
  std::string others = n - 1 > 1 ? fmt::format("ranks 0-{} have dp={},tp=2", n - 2, n / 2)
                                 : fmt::format("rank 0 has dp={},tp=2", n / 2);
  EXPECT_NE(msg.find("[comm] the ranks disagree on the mesh: " + others +
                     fmt::format(" but rank {} has tp=2,dp={}", n - 1, n / 2)),
            std::string::npos)
      << msg;
  world.barrier();
}

TEST(ProcessGroups, AMeshOfAnotherWorldSizeIsACleanError) {
  Communicator world = Communicator::world();
  const std::int64_t n = world.size();
  std::string msg = error_of([&] { ProcessGroups pg(Mesh({{"dp", n}, {"tp", 2}}), world); });
  EXPECT_NE(msg.find(fmt::format("has {} ranks but the job has {}", 2 * n, n)), std::string::npos) << msg;
  world.barrier();
}

TEST(ProcessGroups, GroupsRequestedInDifferentOrdersAreACleanError) {
  Communicator world = Communicator::world();
  const std::int64_t n = world.size(), r = world.rank();
  ProcessGroups pg(Mesh({{"dp", n / 2}, {"tp", 2}}), world);
  std::string msg = error_of([&] { r == 0 ? pg.tp() : pg.dp(); });
  EXPECT_NE(msg.find("the ranks disagree on the next group to create: rank 0 has tp but"), std::string::npos)
      << msg;
  EXPECT_EQ(pg.splits(), 0);
  world.barrier();
}

}  // namespace
}  // namespace ndmesh
