// Run under mpirun with 4 ranks: builds the ProcessGroups of mesh dp=2,tp=2 and checks
// each group by all_reduce against the members' rank sum computed here in closed form
// (not by the Mesh): with tp innermost, rank r is at dp = r / 2, tp = r % 2. It also
// calls the planner, so a layer with a private dependency (config -> tomlplusplus) links.
#include <cstdint>
#include <cstdio>
#include <span>

#include "ndmesh/comm/process_groups.hpp"
#include "ndmesh/plan/search.hpp"

int main() {
  auto world = ndmesh::comm::Communicator::world();
  if (world.size() != 4) {
    std::fprintf(stderr, "consumer: run with 4 ranks, got %d\n", world.size());
    return 2;
  }
  ndmesh::Mesh mesh{{"dp", 2}, {"tp", 2}};
  ndmesh::ProcessGroups pg(mesh, world);
  const std::int64_t r = world.rank();
  const std::int64_t expect_tp = 2 * (r / 2 * 2) + 1;  // ranks {2*(r/2), 2*(r/2)+1}
  const std::int64_t expect_dp = 2 * (r % 2) + 2;      // ranks {r%2, r%2+2}
  std::int64_t tp_sum = r, dp_sum = r;
  pg.tp().all_reduce(std::span<std::int64_t>(&tp_sum, 1));
  pg.dp().all_reduce(std::span<std::int64_t>(&dp_sum, 1));
  const double params = ndmesh::plan::count_parameters(ndmesh::plan::model_preset("gpt3-1.7b")).total();
  int bad = (tp_sum != expect_tp) + (dp_sum != expect_dp) + (pg.tp().size() != 2) + (pg.dp().size() != 2);
  std::printf("rank %lld: tp sum %lld (expect %lld), dp sum %lld (expect %lld)%s\n", (long long)r,
              (long long)tp_sum, (long long)expect_tp, (long long)dp_sum, (long long)expect_dp,
              bad ? " MISMATCH" : "");
  int all_bad = bad;
  world.all_reduce(std::span<int>(&all_bad, 1));
  if (r == 0 && all_bad == 0)
    std::printf("consumer ok: 4 ranks, groups verified; gpt3-1.7b has %.3g parameters\n", params);
  return all_bad == 0 ? 0 : 1;
}
