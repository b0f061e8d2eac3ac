// Mesh query cost on a 1,048,576-rank mesh (dp=2048, pp=16, cp=4, tp=8).
//  - per-rank queries (coords, own group of every subset with its color and key,
//    neighbours): nanoseconds per query and heap allocations per query (must be 0);
//  - enumerating every group of every single dim (4 x 2^20 members) against writing the
//    same count of integers to memory in the same run.
#include <atomic>
#include <cstdlib>
#include <new>
#include <vector>

#include "ndmesh/mesh/mesh.hpp"
#include "ratio_reporter.hpp"

// Counts heap allocations so the benchmark can prove queries make none. GCC 12 cannot
// see that the replaced new and delete below pair malloc with free.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
static std::atomic<long> g_allocations{0};
void* operator new(std::size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace {

const ndmesh::Mesh& big_mesh() {
  static const ndmesh::Mesh kMesh{{"dp", 2048}, {"pp", 16}, {"cp", 4}, {"tp", 8}};
  return kMesh;
}

// A cheap pseudo-random walk over ranks so the compiler cannot hoist the query.
inline std::int64_t next_rank(std::int64_t r) {
  return (r * 2862933555777941757LL + 3037000493LL) & ((1 << 20) - 1);
}

template <typename F>
void run_query(benchmark::State& state, F&& query) {
  std::int64_t r = 12345;
  long before = g_allocations.load();
  for (auto _ : state) {
    r = next_rank(r);
    benchmark::DoNotOptimize(query(r));
  }
  state.counters["allocs_per_query"] = benchmark::Counter(static_cast<double>(g_allocations.load() - before) /
                                                          static_cast<double>(state.iterations()));
}

void BM_RankStep(benchmark::State& state) {  // the cost of the rank walk alone
  run_query(state, [](std::int64_t r) { return r; });
}
BENCHMARK(BM_RankStep);

void BM_Coords(benchmark::State& state) {
  const auto& m = big_mesh();
  run_query(state, [&](std::int64_t r) { return m.coords(r); });
}
BENCHMARK(BM_Coords);

void BM_OwnGroupEverySubset(benchmark::State& state) {
  // One iteration answers all 16 subsets: group view, color and key. Reported per subset.
  const auto& m = big_mesh();
  run_query(state, [&](std::int64_t r) {
    std::int64_t acc = 0;
    for (std::uint32_t bits = 0; bits < 16; ++bits) {
      ndmesh::DimSet s(bits);
      ndmesh::GroupView g = m.group(r, s);
      acc += g.front() + g.size() + m.color(r, s) + m.key(r, s);
    }
    return acc;
  });
  state.SetItemsProcessed(state.iterations() * 16);
}
BENCHMARK(BM_OwnGroupEverySubset);

void BM_Neighbours(benchmark::State& state) {
  // Ring and line neighbours both ways along every dim: 16 queries per iteration.
  const auto& m = big_mesh();
  run_query(state, [&](std::int64_t r) {
    std::int64_t acc = 0;
    for (int i = 0; i < 4; ++i) {
      acc += *m.neighbour(r, i, +1, ndmesh::Edge::kRing) + *m.neighbour(r, i, -1, ndmesh::Edge::kRing);
      acc += m.neighbour(r, i, +1, ndmesh::Edge::kLine).value_or(0) +
             m.neighbour(r, i, -1, ndmesh::Edge::kLine).value_or(0);
    }
    return acc;
  });
  state.SetItemsProcessed(state.iterations() * 16);
}
BENCHMARK(BM_Neighbours);

std::vector<std::int64_t>& sink() {
  static std::vector<std::int64_t> buffer(4 << 20);
  return buffer;
}

void BM_EnumerateAllSingleDimGroups(benchmark::State& state) {
  const auto& m = big_mesh();
  auto& out = sink();
  for (auto _ : state) {
    std::size_t n = 0;
    for (int i = 0; i < m.ndims(); ++i) {
      ndmesh::DimSet s = ndmesh::DimSet::single(i);
      m.for_each_group(s, [&](std::int64_t, const ndmesh::GroupView& g) {
        g.for_each([&](std::int64_t r) { out[n++] = r; });
      });
    }
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(out.size()));
}
BENCHMARK(BM_EnumerateAllSingleDimGroups)->Unit(benchmark::kMillisecond);

void BM_WriteSameCountOfIntegers(benchmark::State& state) {  // baseline
  auto& out = sink();
  for (auto _ : state) {
    for (std::size_t n = 0; n < out.size(); ++n) out[n] = static_cast<std::int64_t>(n);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(out.size()));
}
BENCHMARK(BM_WriteSameCountOfIntegers)->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
  sink();  // allocate before measuring
  return ndmesh::bench::run_with_ratios(argc, argv,
                                        {{"BM_Coords", "BM_RankStep"},
                                         {"BM_OwnGroupEverySubset", "BM_RankStep"},
                                         {"BM_Neighbours", "BM_RankStep"},
                                         {"BM_EnumerateAllSingleDimGroups", "BM_WriteSameCountOfIntegers"}});
}
