// Forward + backward throughput of a small GPT (4 layers, hidden 256, seq 256) as achieved
// GFLOP/s, reported as a ratio against OpenBLAS sgemm measured in the same run on the
// model's most common product shape (tokens x ffn x hidden) and on a 1024^3 square.
// Both use the same BLAS thread count (NDMESH_THREADS, default 1), so the ratio says how
// much of the machine's matrix-product speed the whole training step achieves.
// BM_Attention times the blockwise attention alone (forward + backward, float, the bench
// model's 4 heads of 64 at batch 4) at seq 256 and 1024, its FLOPs counted as computed
// (7 tile products over the tiles the causal mask does not skip).
#include <map>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>
#include <fmt/core.h>

#include "ndmesh/model/decoder.hpp"
#include "ndmesh/nn/attention.hpp"
#include "ndmesh/tensor/blas.hpp"
#include "ndmesh/tensor/rng.hpp"

namespace {

using ndmesh::ModelSpec;

const ModelSpec kSpec{.name = "bench", .layers = 4, .hidden = 256, .heads = 4, .seq = 256, .vocab = 256};
constexpr std::int64_t kBatch = 4;

void BM_GptForwardBackward(benchmark::State& state) {
  ndmesh::model::Decoder gpt(kSpec, {.seed = 1, .batch = kBatch});
  ndmesh::Rng rng(1);
  std::vector<std::int32_t> tokens(kBatch * kSpec.seq), targets(tokens.size());
  for (auto& t : tokens) t = static_cast<std::int32_t>(rng.below(256));
  for (auto& t : targets) t = static_cast<std::int32_t>(rng.below(256));
  for (auto _ : state) {
    gpt.params().zero_grad();
    benchmark::DoNotOptimize(gpt.forward(tokens.data(), targets.data()));
    gpt.backward();
  }
  state.counters["GFLOP/s"] =
      benchmark::Counter(gpt.flops_per_step() * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(kBatch * kSpec.seq),
                                                  benchmark::Counter::kIsIterationInvariantRate);
}

void BM_Attention(benchmark::State& state) {
  const std::int64_t seq = state.range(0), heads = 4, hd = 64;
  const ndmesh::nn::Attention<float> attn({.heads = heads, .kv_heads = heads, .head_dim = hd});
  ndmesh::Rng rng(2);
  std::vector<float> qkv(static_cast<std::size_t>(kBatch * seq * attn.qkv_width()));
  std::vector<float> dout(static_cast<std::size_t>(kBatch * seq * attn.out_width()));
  for (auto& x : qkv) x = static_cast<float>(rng.normal());
  for (auto& x : dout) x = static_cast<float>(rng.normal());
  std::vector<float> out(dout.size()), lse(static_cast<std::size_t>(kBatch * heads * seq)), dqkv(qkv.size());
  for (auto _ : state) {
    attn.forward(qkv.data(), out.data(), lse.data(), kBatch, seq);
    attn.backward(dout.data(), qkv.data(), out.data(), lse.data(), dqkv.data(), kBatch, seq);
    benchmark::ClobberMemory();
  }
  std::vector<std::int64_t> pos(static_cast<std::size_t>(seq));
  for (std::int64_t i = 0; i < seq; ++i) pos[static_cast<std::size_t>(i)] = i;
  const double scores =
      static_cast<double>(ndmesh::nn::attention_tiles(pos.data(), seq, pos.data(), seq).elements);
  state.counters["GFLOP/s"] = benchmark::Counter(7 * 2 * hd * scores * kBatch * heads * 1e-9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
}

void BM_Sgemm(benchmark::State& state) {
  const std::int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  std::vector<float> a(static_cast<std::size_t>(m * k), 0.5f), b(static_cast<std::size_t>(k * n), 0.25f),
      c(static_cast<std::size_t>(m * n));
  for (auto _ : state) {
    ndmesh::gemm<float>(false, true, m, n, k, 1.0f, a.data(), k, b.data(), k, 0.0f, c.data(), n);
    benchmark::ClobberMemory();
  }
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * static_cast<double>(m * n * k) * 1e-9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
}

BENCHMARK(BM_Sgemm)->Args({kBatch * 256, 1024, 256})->Args({1024, 1024, 1024})->Unit(benchmark::kMillisecond);
BENCHMARK(BM_GptForwardBackward)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK(BM_Attention)->Arg(256)->Arg(1024)->Unit(benchmark::kMillisecond);

// Keeps each run's GFLOP/s so that main() can print the ratios.
class Reporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const auto& run : runs) {
      auto it = run.counters.find("GFLOP/s");
      if (it != run.counters.end())
        gflops[run.run_name.function_name + "/" + run.run_name.args] = it->second.value;
    }
    ConsoleReporter::ReportRuns(runs);
  }
  std::map<std::string, double> gflops;
};

}  // namespace

int main(int argc, char** argv) {
  ndmesh::set_blas_threads(ndmesh::threads_from_env(1));
  benchmark::Initialize(&argc, argv);
  Reporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  const double model = reporter.gflops["BM_GptForwardBackward/"];
  const double shape = reporter.gflops["BM_Sgemm/1024/1024/256"];
  const double square = reporter.gflops["BM_Sgemm/1024/1024/1024"];
  if (model <= 0 || shape <= 0 || square <= 0) return 0;  // filtered run: nothing to compare
  fmt::print("BLAS threads: {}\n", ndmesh::blas_threads());
  fmt::print("GPT 4x256 seq 256 batch {} forward+backward: {:.1f} GFLOP/s\n", kBatch, model);
  fmt::print("  ratio vs sgemm 1024x1024x256 ({:.1f} GFLOP/s): {:.2f}\n", shape, model / shape);
  fmt::print("  ratio vs sgemm 1024x1024x1024 ({:.1f} GFLOP/s): {:.2f}\n", square, model / square);
  for (const char* seq : {"256", "1024"}) {
    const double attention = reporter.gflops[std::string("BM_Attention/") + seq];
    if (attention > 0)
      fmt::print("attention seq {} forward+backward: {:.1f} GFLOP/s, ratio vs sgemm 1024x1024x256: {:.2f}\n",
                 seq, attention, attention / shape);
  }
  return 0;
}
