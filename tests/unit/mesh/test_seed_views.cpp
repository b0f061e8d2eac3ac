// The seed systems' own examples (the documents ndmesh grew from), verbatim.
#include <gtest/gtest.h>

#include "ndmesh/core/error.hpp"
#include "ndmesh/mesh/seed_views.hpp"

namespace ndmesh {
namespace {

using Ranks = std::vector<std::int64_t>;

// Seed 000: "When running with 4 GPUs (tp=2, pp=1, dp=2)", default order dp,pp,cp,tp.
TEST(Seed000, ExampleOutputVerbatim) {
  Mesh m{{"dp", 2}, {"pp", 1}, {"cp", 1}, {"tp", 2}};
  const char* expected[] = {
      "ParallelConfig(global_rank=0, world_size=4, tp=2[rank=0], pp=1[rank=0], dp=2[rank=0])",
      "ParallelConfig(global_rank=1, world_size=4, tp=2[rank=1], pp=1[rank=0], dp=2[rank=0])",
      "ParallelConfig(global_rank=2, world_size=4, tp=2[rank=0], pp=1[rank=0], dp=2[rank=1])",
      "ParallelConfig(global_rank=3, world_size=4, tp=2[rank=1], pp=1[rank=0], dp=2[rank=1])",
  };
  for (int r = 0; r < 4; ++r) {
    ParallelConfigView v(m, r, r);
    EXPECT_EQ(v.to_string(), expected[r]);
    EXPECT_EQ(v.get_local_rank(), r);
  }
}

TEST(Seed000, CpPartOnlyWhenCpAboveOne) {
  Mesh m{{"dp", 1}, {"pp", 2}, {"cp", 2}, {"tp", 2}};
  ParallelConfigView v(m, 7, 3);
  EXPECT_EQ(
      v.to_string(),
      "ParallelConfig(global_rank=7, world_size=8, tp=2[rank=1], cp=2[rank=1], pp=2[rank=1], dp=1[rank=0])");
  EXPECT_THROW(ParallelConfigView(m, 8, 0), ConfigError);
}

// Seed 001 (picotron): grid = arange(world).view(dp, pp, cp, tp). With tp=2, cp=2, pp=2,
// dp=2 (world 16) the grid index of rank r is (r/8, r/4%2, r/2%2, r%2). Expected values
// below are read off that grid by hand for rank 13 = (1, 1, 0, 1).
TEST(Seed001, AccessorsRank13) {
  Mesh m{{"dp", 2}, {"pp", 2}, {"cp", 2}, {"tp", 2}};
  GroupManagerView v(m, 13);
  EXPECT_EQ(v.dp_rank(), 1);
  EXPECT_EQ(v.pp_rank(), 1);
  EXPECT_EQ(v.cp_rank(), 0);
  EXPECT_EQ(v.tp_rank(), 1);
  EXPECT_EQ(v.tp_group_ids().to_vector(), (Ranks{12, 13}));           // grid[1,1,0,:]
  EXPECT_EQ(v.cp_group_ids().to_vector(), (Ranks{13, 15}));           // grid[1,1,:,1]
  EXPECT_EQ(v.pp_group_ids().to_vector(), (Ranks{9, 13}));            // grid[1,:,0,1]
  EXPECT_EQ(v.dp_group_ids().to_vector(), (Ranks{5, 13}));            // grid[:,1,0,1]
  EXPECT_EQ(v.cp_dp_group_ids().to_vector(), (Ranks{5, 7, 13, 15}));  // grid[:,1,:,1].flatten()
  EXPECT_EQ(v.pp_dp_group_ids().to_vector(), (Ranks{1, 5, 9, 13}));   // grid[:,:,0,1].flatten()
  EXPECT_EQ(v.tp_first_rank(), 12);
  EXPECT_EQ(v.tp_last_rank(), 13);
  EXPECT_EQ(v.cp_first_rank(), 13);
  EXPECT_EQ(v.cp_last_rank(), 15);
  EXPECT_EQ(v.pp_first_rank(), 9);
  EXPECT_EQ(v.pp_last_rank(), 13);
  EXPECT_EQ(v.dp_first_rank(), 5);
  EXPECT_EQ(v.dp_last_rank(), 13);
  EXPECT_EQ(v.cp_send_rank(), 15);            // cp_group_ids[(0 + 1) % 2]
  EXPECT_EQ(v.cp_recv_rank(), 15);            // cp_group_ids[(0 - 1) % 2] (Python modulo)
  EXPECT_EQ(v.pp_next_rank(), std::nullopt);  // last stage
  EXPECT_EQ(v.pp_prev_rank(), 9);
  EXPECT_FALSE(v.pp_is_first_stage());
  EXPECT_TRUE(v.pp_is_last_stage());
  EXPECT_EQ(v.cp_dp_world_size(), 4);
  EXPECT_EQ(v.to_string(), "TP(2)-CP(2)-PP(2)-DP(2)-Rank(13)");
}

TEST(Seed001, RingOfFourAndStringForm) {
  Mesh m{{"dp", 2}, {"pp", 1}, {"cp", 4}, {"tp", 1}};  // rank = dp*4 + cp
  GroupManagerView v(m, 4);                            // cp_rank 0 of dp group 1
  EXPECT_EQ(v.cp_send_rank(), 5);
  EXPECT_EQ(v.cp_recv_rank(), 7);
  EXPECT_EQ(v.pp_next_rank(), std::nullopt);
  EXPECT_EQ(v.pp_prev_rank(), std::nullopt);
  EXPECT_TRUE(v.pp_is_first_stage());
  EXPECT_TRUE(v.pp_is_last_stage());
  Mesh two{{"dp", 2}, {"pp", 1}, {"cp", 1}, {"tp", 2}};
  EXPECT_EQ(GroupManagerView(two, 0).to_string(), "TP(2)-CP(1)-PP(1)-DP(2)-Rank(0)");
}

// Seed 002 (torsh): pp fastest. Its own formulas, used here as the reference:
//   pp_rank = r % pp; tp_rank = (r / pp) % tp; dp_rank = r / (pp * tp)
//   from_3d_coords = dp * (tp * pp) + tp * pp_size + pp
TEST(Seed002, RankMappingMatchesTheSeedFormulas) {
  const std::int64_t dp = 3, tp = 2, pp = 4;
  Mesh m = RankMapping3D::layout(dp, tp, pp);
  for (std::int64_t r = 0; r < dp * tp * pp; ++r) {
    RankMapping3D v(m, r, 8);
    EXPECT_EQ(v.pp_rank(), r % pp);
    EXPECT_EQ(v.tp_rank(), (r / pp) % tp);
    EXPECT_EQ(v.dp_rank(), r / (pp * tp));
    EXPECT_EQ(v.from_3d_coords(v.dp_rank(), v.tp_rank(), v.pp_rank()), r);
    EXPECT_EQ(v.local_rank(), r % 8);
    EXPECT_EQ(v.is_pp_head(), r % pp == 0);
    EXPECT_EQ(v.is_pp_tail(), r % pp == pp - 1);
    EXPECT_EQ(v.is_tp_head(), (r / pp) % tp == 0);
    EXPECT_EQ(v.is_dp_head(), r / (pp * tp) == 0);
    Ranks dp_group, tp_group, pp_group;
    for (std::int64_t d = 0; d < dp; ++d) dp_group.push_back(d * tp * pp + v.tp_rank() * pp + v.pp_rank());
    for (std::int64_t t = 0; t < tp; ++t) tp_group.push_back(v.dp_rank() * tp * pp + t * pp + v.pp_rank());
    for (std::int64_t p = 0; p < pp; ++p) pp_group.push_back(v.dp_rank() * tp * pp + v.tp_rank() * pp + p);
    EXPECT_EQ(v.dp_group_ranks().to_vector(), dp_group);
    EXPECT_EQ(v.tp_group_ranks().to_vector(), tp_group);
    EXPECT_EQ(v.pp_group_ranks().to_vector(), pp_group);
    EXPECT_EQ(v.next_pp_rank(), r % pp < pp - 1 ? std::optional<std::int64_t>(r + 1) : std::nullopt);
    EXPECT_EQ(v.prev_pp_rank(), r % pp > 0 ? std::optional<std::int64_t>(r - 1) : std::nullopt);
  }
  RankMapping3D v(m, 13, 8);  // dp 1, tp 1, pp 1
  EXPECT_EQ(v.dp_group_id(), "dp_group_tp1_pp1");
  EXPECT_EQ(v.tp_group_id(), "tp_group_dp1_pp1");
  EXPECT_EQ(v.pp_group_id(), "pp_group_dp1_tp1");
  EXPECT_EQ(v.layers_per_stage(24), 6);
  EXPECT_THROW(v.layers_per_stage(26), ConfigError);
  // The seed assumes 8 devices per node; ndmesh takes the real count.
  EXPECT_EQ(RankMapping3D(m, 13, 4).local_rank(), 1);
}

// Seed 004 (TorchDistPackage): dims outer to inner pipe=2, tensor=2, data=4, world 16.
// Every group of its example output, in its order (which is ours: by color).
TEST(Seed004, EveryGroupOfTheExample) {
  Mesh m = Mesh::parse("pipe=2,tensor=2,data=4");
  auto groups = [&](std::string_view spec) {
    std::vector<Ranks> out;
    DimSet s = m.dims_of(spec);
    for (std::int64_t c = 0; c < m.num_groups(s); ++c) out.push_back(m.group_by_color(s, c).to_vector());
    return out;
  };
  EXPECT_EQ(groups("pipe"),
            (std::vector<Ranks>{{0, 8}, {1, 9}, {2, 10}, {3, 11}, {4, 12}, {5, 13}, {6, 14}, {7, 15}}));
  // The seed prints tensor groups as [0,4],[8,12],[1,5],[9,13],...: the same set; we list
  // them by color (row-major over pipe, data).
  auto tensor = groups("tensor");
  EXPECT_EQ(tensor,
            (std::vector<Ranks>{{0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13}, {10, 14}, {11, 15}}));
  std::vector<Ranks> seed_tensor = {{0, 4}, {8, 12}, {1, 5}, {9, 13}, {2, 6}, {10, 14}, {3, 7}, {11, 15}};
  std::sort(seed_tensor.begin(), seed_tensor.end());
  EXPECT_EQ(tensor, seed_tensor);
  EXPECT_EQ(groups("data"),
            (std::vector<Ranks>{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}, {12, 13, 14, 15}}));
  // "model": every dim except data.
  EXPECT_EQ(groups("pipe-tensor"),
            (std::vector<Ranks>{{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15}}));
  EXPECT_EQ(m.complement(m.dims_of("data")), m.dims_of("pipe-tensor"));
}

}  // namespace
}  // namespace ndmesh
