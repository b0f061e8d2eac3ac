// A mixture of experts' token dispatch and combine over an expert group of all ranks, two
// ways, on the same routing in one run:
//  - all-to-all-v (what nn::Moe does): an all-to-all of the per-expert row counts, an
//    all_to_all_v of the kept rows to their experts' ranks, the experts, an all_to_all_v of
//    the outputs back, weighed and summed on the token's rank;
//  - all-gather (the baseline; Megatron-core's "allgather" token dispatcher): every rank
//    gathers every rank's tokens and routing, runs its experts on the rows routed to them,
//    weighed, into a buffer of every rank's tokens, and a reduce-scatter sums it back to the
//    tokens' ranks.
// Each rank holds `tokens` tokens of `channels` floats routed top-k over E experts (E/P per
// rank); the routing is drawn from a fixed seed per rank (uniform over the experts, k
// distinct). The expert is a stand-in that costs one pass over its rows (row * (1 + e/8)):
// what is measured is the exchange, not the experts' products. Both must give the same
// output (checked, max difference printed). Rank 0 prints one JSON line per width with the
// best time of each (rounds alternate them) and the ratio all-gather / all-to-all-v (above
// 1: all-to-all-v is faster). bench/bench_moe_dispatch.sh runs it on 2 and 4 ranks.
//   bench_moe_dispatch [tokens per rank] [experts] [top-k]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "ndmesh/comm/communicator.hpp"

namespace {

using ndmesh::comm::Communicator;

struct Routing {
  std::vector<std::int64_t> expert;  // [tokens * k]
  std::vector<float> weight;         // [tokens * k]
};

Routing draw_routing(std::int64_t tokens, std::int64_t experts, std::int64_t k, int rank) {
  std::mt19937 gen(1234u + static_cast<unsigned>(rank));
  Routing r;
  std::vector<std::int64_t> order(static_cast<std::size_t>(experts));
  for (std::int64_t t = 0; t < tokens; ++t) {
    std::iota(order.begin(), order.end(), std::int64_t{0});
    std::shuffle(order.begin(), order.end(), gen);
    float sum = 0;
    std::vector<float> w(static_cast<std::size_t>(k));
    for (auto& x : w) sum += x = std::uniform_real_distribution<float>(0.1f, 1.0f)(gen);
    for (std::int64_t j = 0; j < k; ++j) {
      r.expert.push_back(order[static_cast<std::size_t>(j)]);
      r.weight.push_back(w[static_cast<std::size_t>(j)] / sum);
    }
  }
  return r;
}

// The stand-in expert e on one row: out = in * (1 + e / 8).
void run_expert(std::int64_t e, const float* in, float* out, std::int64_t c, float weight = 1.0f,
                bool add = false) {
  const float s = weight * (1.0f + static_cast<float>(e) / 8.0f);
  for (std::int64_t i = 0; i < c; ++i) out[i] = (add ? out[i] : 0.0f) + s * in[i];
}

// nn::Moe's exchange: rows grouped by expert (token order inside), counts first.
void all_to_all_v_dispatch(const Communicator& ep, const std::vector<float>& x, const Routing& r,
                           std::int64_t n, std::int64_t c, std::int64_t experts, std::int64_t k,
                           std::vector<float>& out) {
  const auto p = static_cast<std::int64_t>(ep.size());
  const std::int64_t local = experts / p, first = local * ep.rank();
  std::vector<std::vector<std::int64_t>> by_expert(static_cast<std::size_t>(experts));  // token * k + j
  for (std::int64_t i = 0; i < n * k; ++i) by_expert[static_cast<std::size_t>(r.expert[i])].push_back(i);
  std::vector<std::int64_t> counts(static_cast<std::size_t>(experts)),
      received(static_cast<std::size_t>(experts));
  for (std::int64_t e = 0; e < experts; ++e)
    counts[static_cast<std::size_t>(e)] =
        static_cast<std::int64_t>(by_expert[static_cast<std::size_t>(e)].size());
  ep.all_to_all(std::span<const std::int64_t>(counts), std::span<std::int64_t>(received));
  std::vector<std::int64_t> send(static_cast<std::size_t>(p), 0), recv(static_cast<std::size_t>(p), 0);
  for (std::int64_t e = 0; e < experts; ++e) {
    send[static_cast<std::size_t>(e / local)] += counts[static_cast<std::size_t>(e)] * c;
    recv[static_cast<std::size_t>(e / local)] += received[static_cast<std::size_t>(e)] * c;
  }
  const std::int64_t sent_rows = n * k;
  const std::int64_t got_rows = std::accumulate(received.begin(), received.end(), std::int64_t{0});
  std::vector<float> sent(static_cast<std::size_t>(sent_rows * c)),
      got(static_cast<std::size_t>(got_rows * c));
  std::int64_t at = 0;
  for (const auto& rows : by_expert)
    for (std::int64_t i : rows) std::copy_n(x.data() + (i / k) * c, c, sent.data() + (at++) * c);
  ep.all_to_all_v(std::span<const float>(sent), std::span<const std::int64_t>(send), std::span<float>(got),
                  std::span<const std::int64_t>(recv));
  // Member by member, local expert by local expert: the experts in place.
  at = 0;
  for (std::int64_t m = 0; m < p; ++m)
    for (std::int64_t l = 0; l < local; ++l)
      for (std::int64_t i = 0; i < received[static_cast<std::size_t>(m * local + l)]; ++i, ++at)
        run_expert(first + l, got.data() + at * c, got.data() + at * c, c);
  ep.all_to_all_v(std::span<const float>(got), std::span<const std::int64_t>(recv), std::span<float>(sent),
                  std::span<const std::int64_t>(send));
  std::fill(out.begin(), out.end(), 0.0f);
  at = 0;
  for (const auto& rows : by_expert)
    for (std::int64_t i : rows) {
      const float* y = sent.data() + (at++) * c;
      float* o = out.data() + (i / k) * c;
      for (std::int64_t ch = 0; ch < c; ++ch) o[ch] += r.weight[static_cast<std::size_t>(i)] * y[ch];
    }
}

// The all-gather dispatcher: everyone's tokens and routing, local experts, reduce-scatter back.
void all_gather_dispatch(const Communicator& ep, const std::vector<float>& x, const Routing& r,
                         std::int64_t n, std::int64_t c, std::int64_t experts, std::int64_t k,
                         std::vector<float>& out) {
  const auto p = static_cast<std::int64_t>(ep.size());
  const std::int64_t local = experts / p, first = local * ep.rank();
  std::vector<float> all_x(static_cast<std::size_t>(p * n * c)), all_w(static_cast<std::size_t>(p * n * k));
  std::vector<std::int64_t> all_e(static_cast<std::size_t>(p * n * k));
  ep.all_gather(std::span<const float>(x), std::span<float>(all_x));
  ep.all_gather(std::span<const std::int64_t>(r.expert), std::span<std::int64_t>(all_e));
  ep.all_gather(std::span<const float>(r.weight), std::span<float>(all_w));
  std::vector<float> partial(static_cast<std::size_t>(p * n * c), 0.0f);
  for (std::int64_t i = 0; i < p * n * k; ++i) {
    const std::int64_t e = all_e[static_cast<std::size_t>(i)];
    if (e < first || e >= first + local) continue;
    run_expert(e, all_x.data() + (i / k) * c, partial.data() + (i / k) * c, c,
               all_w[static_cast<std::size_t>(i)], true);
  }
  ep.reduce_scatter(std::span<const float>(partial), std::span<float>(out));
}

}  // namespace

int main(int argc, char** argv) {
  using Clock = std::chrono::steady_clock;
  const std::int64_t tokens = argc > 1 ? std::stoll(argv[1]) : 1024;
  const std::int64_t experts = argc > 2 ? std::stoll(argv[2]) : 8;
  const std::int64_t k = argc > 3 ? std::stoll(argv[3]) : 2;
  Communicator world = Communicator::world();
  const int p = world.size();
  if (experts % p != 0 || k < 1 || k > experts) {
    if (world.rank() == 0)
      std::fprintf(
          stderr,
          "bench_moe_dispatch: experts=%lld must be divisible by the %d ranks and top-k=%lld in 1..experts\n",
          static_cast<long long>(experts), p, static_cast<long long>(k));
    return 2;
  }
  const Routing routing = draw_routing(tokens, experts, k, world.rank());
  for (std::int64_t c : {64, 256, 1024}) {
    std::vector<float> x(static_cast<std::size_t>(tokens * c));
    std::mt19937 gen(99u + static_cast<unsigned>(world.rank()));
    for (auto& v : x) v = std::uniform_real_distribution<float>(-1.0f, 1.0f)(gen);
    std::vector<float> out_a2a(x.size()), out_ag(x.size());
    all_to_all_v_dispatch(world, x, routing, tokens, c, experts, k, out_a2a);  // warm-up and the check
    all_gather_dispatch(world, x, routing, tokens, c, experts, k, out_ag);
    double diff = 0;
    for (std::size_t i = 0; i < x.size(); ++i)
      diff = std::max(diff, static_cast<double>(std::fabs(out_a2a[i] - out_ag[i])));
    world.all_reduce(std::span<double>(&diff, 1), {.op = ndmesh::comm::ReduceOp::kMax});
    const int reps =
        static_cast<int>(std::clamp<std::int64_t>((std::int64_t{1} << 24) / (tokens * c), 3, 50));
    double best[2] = {1e30, 1e30};
    for (int round = 0; round < 4; ++round)
      for (int j = 0; j < 2; ++j) {
        const int which = (j + round) % 2;
        world.barrier();
        const auto start = Clock::now();
        for (int i = 0; i < reps; ++i) {
          if (which == 0)
            all_to_all_v_dispatch(world, x, routing, tokens, c, experts, k, out_a2a);
          else
            all_gather_dispatch(world, x, routing, tokens, c, experts, k, out_ag);
        }
        double t = std::chrono::duration<double>(Clock::now() - start).count() / reps;
        world.all_reduce(std::span<double>(&t, 1), {.op = ndmesh::comm::ReduceOp::kMax});
        best[which] = std::min(best[which], t);
      }
    if (world.rank() == 0)
      std::printf(
          "{\"backend\":\"%s\",\"ranks\":%d,\"tokens\":%lld,\"channels\":%lld,\"experts\":%lld,\"top_k\":%"
          "lld,"
          "\"all_to_all_v_s\":%.3e,\"all_gather_s\":%.3e,\"ratio\":%.3f,\"max_difference\":%.2e}\n",
          std::string(world.backend()).c_str(), p, static_cast<long long>(tokens), static_cast<long long>(c),
          static_cast<long long>(experts), static_cast<long long>(k), best[0], best[1], best[1] / best[0],
          diff);
    if (diff > 1e-4) {
      if (world.rank() == 0)
        std::fprintf(stderr, "bench_moe_dispatch: the two dispatches differ by %.2e\n", diff);
      return 1;
    }
  }
  return 0;
}
