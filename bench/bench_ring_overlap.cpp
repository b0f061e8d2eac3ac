// Context parallelism, under mpirun (bench/bench_cp.sh): the fraction of ring attention's
// forward transfers hidden behind its compute. The ring's forward (zigzag, seq 2048) is
// timed against the same transfers alone, measured in the same run: hidden = (compute +
// transfers alone - ring wall time) / transfers alone, and 1 - exposed wait / transfers
// alone. A benchmark, not a test: timings on a shared machine are noisy.
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <random>
#include <vector>

#include <fmt/format.h>

#include "ndmesh/comm/communicator.hpp"
#include "ndmesh/nn/attention.hpp"
#include "ndmesh/parallel/cp/ring_attention.hpp"

namespace ndmesh {
namespace {

using comm::Communicator;
using parallel::CpLayout;

void run_overlap() {
  const Communicator world = Communicator::world();
  const std::int64_t P = world.size(), seq = 2048, B = 1;
  const nn::Attention<float> attn({.heads = 4, .kv_heads = 4, .head_dim = 16});
  const std::int64_t R = attn.qkv_width(), O = attn.out_width(), L = seq / P, W = 2 * 4 * 16;
  const auto pos = parallel::cp_positions(seq, P, world.rank(), CpLayout::kZigzag);
  std::vector<float> qkv(static_cast<std::size_t>(B * L * R)), out(static_cast<std::size_t>(B * L * O)),
      lse(static_cast<std::size_t>(B * 4 * L));
  std::mt19937 gen(static_cast<unsigned>(world.rank() + 1));
  std::normal_distribution<float> dist;
  for (float& x : qkv) x = dist(gen);
  parallel::RingAttention<float> ring(world);
  ring.forward(attn, qkv.data(), out.data(), lse.data(), B, L, pos.data());  // warm-up
  ring.reset();
  const int reps = 3;
  world.barrier();
  const auto r0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) ring.forward(attn, qkv.data(), out.data(), lse.data(), B, L, pos.data());
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - r0).count();
  // The same transfers with nothing to hide them behind.
  std::vector<float> a(static_cast<std::size_t>(B * L * W)), b(a.size());
  std::vector<std::int64_t> pa(static_cast<std::size_t>(L)), pb(pa.size());
  const int next = static_cast<int>((world.rank() + 1) % P), prev = static_cast<int>((world.rank() + P - 1) % P);
  world.barrier();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i)
    for (std::int64_t s = 0; s + 1 < P; ++s) {
      std::vector<comm::Work> w;
      w.push_back(world.send_async(std::span<const float>(a), next, {.tag = 5}));
      w.push_back(world.send_async(std::span<const std::int64_t>(pa), next, {.tag = 6}));
      w.push_back(world.recv_async(std::span<float>(b), prev, {.tag = 5}));
      w.push_back(world.recv_async(std::span<std::int64_t>(pb), prev, {.tag = 6}));
      comm::wait_all(w);
    }
  const double transfer = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::array<double, 4> mine = {ring.stats().compute_seconds, ring.stats().exposed_seconds, transfer, wall};
  world.all_reduce(std::span<double>(mine));
  for (double& x : mine) x /= static_cast<double>(P);
  // Hidden: what the ring saves against computing and then transferring, as a fraction of
  // the transfers alone; the exposed wait also holds any skew between the ranks.
  const double hidden = std::clamp((mine[0] + mine[2] - mine[3]) / std::max(1e-12, mine[2]), 0.0, 1.0);
  if (world.rank() == 0 && P > 1)
    fmt::print("cp {} seq {} zigzag forward x{} (mean per rank): ring {:.4f} s = compute {:.4f} s + exposed wait "
               "{:.4f} s; the same transfers alone {:.4f} s; hidden: {:.0f}% by wall time, {:.0f}% by exposed wait\n",
               P, seq, reps, mine[3], mine[0], mine[1], mine[2], 100.0 * hidden,
               100.0 * std::clamp(1.0 - mine[1] / std::max(1e-12, mine[2]), 0.0, 1.0));
}

}  // namespace
}  // namespace ndmesh

int main() {
  ndmesh::run_overlap();
  return 0;
}
