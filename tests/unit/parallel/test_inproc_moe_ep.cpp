// Expert parallelism of nn::Moe on in-process ranks: every rank routes its own rows, the
// experts run on the rank that holds them (dispatch and combine by all_to_all_v, uneven and
// zero counts), and each rank's output and input gradient equal the serial layer's on the
// same rows; the gradients summed over the ranks equal the serial ones summed (an expert's on
// its rank, zero elsewhere; the router's on every rank from its own rows). Under context
// parallelism (MoeCp) the ranks hold equal parts of one micro-batch: the auxiliary loss is the
// whole micro-batch's on every rank, and with each rank weighing it by 1/ranks (its share of
// the micro-batch, as the decoder does) the gradients summed over the ranks are the serial ones;
// with a capacity (MoeCpCapacity) the drop rule orders the whole micro-batch's tokens, whose
// chunks the ranks hold out of order, so each rank drops what the serial layer drops there.
// With sharded storage (MoeEpSharded: MoeOptions::shard_experts) a rank's store holds only its
// experts, in the expert partition after the dense parameters, and each of its experts'
// gradients is that expert's serial gradient summed over the ranks. Under bf16 products
// (MoeEpBf16: rows in bfloat16, a float layer) the same equalities hold: the rows travel
// widened and reach each expert as the serial layer gives them.
#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "ndmesh/comm/communicator.hpp"
#include "ndmesh/comm/inproc.hpp"
#include "ndmesh/core/dtype.hpp"
#include "ndmesh/nn/moe.hpp"
#include "ndmesh/parallel/ep/ep_comm.hpp"
#include "unit/nn/fd_check.hpp"

namespace ndmesh::parallel {
namespace {

using ndmesh::testing::fill_normal;
using ndmesh::testing::random_vector;
using V = std::vector<double>;

constexpr std::int64_t kC = 4, kExperts = 4, kTopK = 2;

struct Pass {
  V out, dx, grads;
  std::vector<double> load;
  double aux = 0;
  std::int64_t dropped = 0;               // assignments the capacity dropped
  std::map<std::string, V> grad_of;       // by parameter name
  std::vector<std::string> expert_views;  // the names in the store's expert partition
  std::int64_t dense = 0, size = 0;       // ParamStore::expert_offset(), size()
};

// Forward and backward of one Moe over `ep` (nullptr: serial) on rows x, gradient w, the
// auxiliary loss weighed by aux_weight; with `positions` the rows' places in sequences of `seq`
// tokens (FeedForward::set_token_positions).
Pass run_moe(std::shared_ptr<nn::EpComm> ep, const V& x, const V& w, std::int64_t rows, RouterKind router,
             double capacity, double aux_weight = 0.7, bool shard_experts = false,
             const std::vector<std::int64_t>& positions = {}, std::int64_t seq = 0) {
  ParamStore<double> store;
  nn::MoeOptions opts{.experts = kExperts,
                      .top_k = kTopK,
                      .shared_experts = 1,
                      .expert_ffn = 5,
                      .kind = MlpKind::kSwiglu,
                      .router = router,
                      .aux_loss = 0.3,
                      .capacity_factor = capacity,
                      .shard_experts = shard_experts};
  if (ep) opts.ep = std::move(ep);
  nn::Moe<double> moe(store, {.channels = kC, .name = "moe", .bias = false}, opts);
  store.allocate();
  for (const auto& view : store.views()) {  // the same parameter of a name on every rank
    Rng rng(5 + std::hash<std::string>{}(view.name));
    fill_normal(store.mutable_param(store.find(view.name)), view.numel, rng,
                view.name == "moe.router.bias" ? 0.1 : 0.7);
  }
  nn::MlpActivations<double> acts;
  acts.resize(rows, moe.pre_width(), moe.hidden_width());
  Pass p{.out = V(static_cast<std::size_t>(rows * kC)), .dx = V(static_cast<std::size_t>(rows * kC))};
  moe.set_aux_weight(aux_weight);
  if (!positions.empty()) moe.set_token_positions(positions, seq);
  moe.forward(x.data(), p.out.data(), acts, rows);
  p.aux = moe.aux_loss();
  p.dropped = moe.dropped();
  store.zero_grad();
  V scratch;
  moe.backward(w.data(), x.data(), acts, p.dx.data(), scratch.data(), rows);
  p.grads.assign(store.grads().data(), store.grads().data() + store.size());
  p.load = moe.expert_load();
  for (const auto& view : store.views()) {
    p.grad_of[view.name] =
        V(store.grad(store.find(view.name)), store.grad(store.find(view.name)) + view.numel);
    if (view.expert) p.expert_views.push_back(view.name);
  }
  p.dense = store.expert_offset();
  p.size = store.size();
  return p;
}

void expect_near(const V& a, const V& b, const char* what, int rank) {
  ASSERT_EQ(a.size(), b.size()) << what;
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]));
  EXPECT_LT(worst, 1e-12) << what << " on rank " << rank;
}

class MoeEp : public ::testing::TestWithParam<std::tuple<int, RouterKind, double>> {};

TEST_P(MoeEp, EqualsTheSerialLayerOnEveryRanksRows) {
  const auto [ranks, router, capacity] = GetParam();
  comm::inproc::run(
      ranks, [&, ranks = ranks, router = router, capacity = capacity](const comm::Communicator& world) {
        const int r = world.rank();
        const std::int64_t rows = 3 + 2 * r;  // uneven: some pairs exchange no row at all
        Rng rng(100 + static_cast<std::uint64_t>(r));
        const V x = random_vector(rows * kC, rng), w = random_vector(rows * kC, rng);
        const Pass serial = run_moe(nullptr, x, w, rows, router, capacity);
        auto stats = std::make_shared<EpCommStats>();
        // No cp and no tp: each rank alone shares its micro-batch and its experts' slices.
        const comm::Communicator alone = world.split(world.rank(), 0, "alone");
        const Pass ep = run_moe(std::make_shared<CommunicatorEpComm>(world.named("ep"), alone, alone, stats),
                                x, w, rows, router, capacity);
        expect_near(ep.out, serial.out, "output", r);
        expect_near(ep.dx, serial.dx, "input gradient", r);
        EXPECT_EQ(ep.load, serial.load);
        if (ranks > 1) {
          EXPECT_EQ(stats->calls, 6);  // counts and two exchanges, forward and backward
        }
        V sum_ep = ep.grads, sum_serial = serial.grads;
        world.all_reduce(std::span<double>(sum_ep));
        world.all_reduce(std::span<double>(sum_serial));
        expect_near(sum_ep, sum_serial, "gradients summed over the ranks", r);
      });
}

INSTANTIATE_TEST_SUITE_P(Ranks, MoeEp,
                         ::testing::Values(std::make_tuple(1, RouterKind::kSoftmax, 0.0),
                                           std::make_tuple(2, RouterKind::kSoftmax, 0.0),
                                           std::make_tuple(4, RouterKind::kSoftmax, 0.0),
                                           std::make_tuple(2, RouterKind::kSigmoid, 0.5),
                                           std::make_tuple(4, RouterKind::kSigmoid, 0.0)));

class MoeEpSharded : public ::testing::TestWithParam<int> {};

TEST_P(MoeEpSharded, EachRankStoresItsExpertsOnly) {
  const int ranks = GetParam();
  comm::inproc::run(ranks, [&](const comm::Communicator& world) {
    const int r = world.rank();
    const std::int64_t rows = 3 + 2 * r;
    Rng rng(300 + static_cast<std::uint64_t>(r));
    const V x = random_vector(rows * kC, rng), w = random_vector(rows * kC, rng);
    const Pass serial = run_moe(nullptr, x, w, rows, RouterKind::kSoftmax, 0.0);
    const comm::Communicator alone = world.split(world.rank(), 0, "alone");
    const Pass ep = run_moe(std::make_shared<CommunicatorEpComm>(world.named("ep"), alone, alone,
                                                                 std::make_shared<EpCommStats>()),
                            x, w, rows, RouterKind::kSoftmax, 0.0, 0.7, true);
    expect_near(ep.out, serial.out, "output", r);
    expect_near(ep.dx, serial.dx, "input gradient", r);
    // The experts r * E/ranks .. (r+1) * E/ranks - 1, SwiGLU: fc and proj each, after the dense part.
    std::vector<std::string> mine;
    for (std::int64_t e = r * kExperts / ranks; e < (r + 1) * kExperts / ranks; ++e)
      for (const char* part : {"fc", "proj"})
        mine.push_back("moe.experts." + std::to_string(e) + "." + part + ".weight");
    EXPECT_EQ(ep.expert_views, ranks > 1 ? mine : std::vector<std::string>{}) << "rank " << r;
    EXPECT_EQ(ep.grad_of.size(), serial.grad_of.size() - (ranks > 1 ? 2 * (kExperts - kExperts / ranks) : 0));
    // An expert is 4 x 10 + 5 x 4 elements (fc [2 x 5, 4], proj [4, 5]; aligned to 16: 48 + 32).
    EXPECT_EQ(ep.size, serial.size - (ranks > 1 ? (kExperts - kExperts / ranks) * 80 : 0)) << "rank " << r;
    EXPECT_EQ(ep.dense, ranks > 1 ? serial.size - kExperts * 80 : serial.size)
        << "rank " << r;  // every expert out
    // Each parameter a rank stores: an expert's gradient is the serial one summed over the
    // ranks (all its tokens came to this rank), a dense one's this rank's own rows' (the dense
    // reduction sums them).
    for (const auto& [name, g] : serial.grad_of) {
      V sum = g;
      world.all_reduce(std::span<double>(sum));
      const auto it = ep.grad_of.find(name);
      if (it == ep.grad_of.end()) continue;
      const bool expert = name.find(".experts.") != std::string::npos;
      expect_near(it->second, expert ? sum : g, name.c_str(), r);
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, MoeEpSharded, ::testing::Values(1, 2, 4));

class MoeCp : public ::testing::TestWithParam<std::tuple<int, RouterKind>> {};

TEST_P(MoeCp, TheMicroBatchsAuxiliaryLossOverItsRanks) {
  const auto [ranks, router] = GetParam();
  comm::inproc::run(ranks, [&, ranks = ranks, router = router](const comm::Communicator& world) {
    const int r = world.rank();
    constexpr std::int64_t kRows = 5;  // every cp rank holds as many of the micro-batch's rows
    Rng rng(200 + static_cast<std::uint64_t>(r));
    const V x = random_vector(kRows * kC, rng), w = random_vector(kRows * kC, rng);
    V all_x(static_cast<std::size_t>(ranks * kRows * kC)), all_w(all_x.size());
    world.all_gather(std::span<const double>(x), std::span<double>(all_x));
    world.all_gather(std::span<const double>(w), std::span<double>(all_w));
    const Pass serial = run_moe(nullptr, all_x, all_w, ranks * kRows, router, 0.0);
    // The expert group and the micro-batch's ranks are both the world (--dp 1 --cp N --ep N).
    const comm::Communicator alone = world.split(world.rank(), 0, "alone");
    const Pass cp = run_moe(std::make_shared<CommunicatorEpComm>(world.named("ep"), world.named("cp"), alone,
                                                                 std::make_shared<EpCommStats>()),
                            x, w, kRows, router, 0.0, 0.7 / ranks);
    EXPECT_NEAR(cp.aux, serial.aux, 1e-14 * std::fabs(serial.aux)) << "rank " << r;
    const auto mine = [&](const V& v) {
      return V(v.begin() + r * kRows * kC, v.begin() + (r + 1) * kRows * kC);
    };
    expect_near(cp.out, mine(serial.out), "output", r);
    expect_near(cp.dx, mine(serial.dx), "input gradient", r);
    V sum = cp.grads;
    world.all_reduce(std::span<double>(sum));
    expect_near(sum, serial.grads, "gradients summed over the ranks", r);
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, MoeCp,
                         ::testing::Values(std::make_tuple(2, RouterKind::kSoftmax),
                                           std::make_tuple(4, RouterKind::kSigmoid)));

// A capacity under context parallelism: the micro-batch is 2 sequences of ranks x kChunk
// tokens, and rank r holds chunk ranks - 1 - r of each (chunks out of rank order, as cp's
// zigzag has them). The drop rule orders the whole micro-batch's tokens, so every rank's
// rows are the serial layer's at their places in it, drops included.
class MoeCpCapacity : public ::testing::TestWithParam<std::tuple<int, RouterKind>> {};

TEST_P(MoeCpCapacity, DropsWhatTheSerialLayerDropsOnTheWholeMicroBatch) {
  const auto [ranks, router] = GetParam();
  comm::inproc::run(ranks, [&, ranks = ranks, router = router](const comm::Communicator& world) {
    const int r = world.rank();
    constexpr std::int64_t kChunk = 3, kSeqs = 2, kRows = kSeqs * kChunk;
    const std::int64_t seq = ranks * kChunk, chunk = ranks - 1 - r;
    std::vector<std::int64_t> positions(kChunk);
    for (std::int64_t i = 0; i < kChunk; ++i) positions[static_cast<std::size_t>(i)] = chunk * kChunk + i;
    Rng rng(300 + static_cast<std::uint64_t>(r));
    const V x = random_vector(kRows * kC, rng), w = random_vector(kRows * kC, rng);
    V all_x(static_cast<std::size_t>(ranks * kRows * kC)), all_w(all_x.size());
    world.all_gather(std::span<const double>(x), std::span<double>(all_x));
    world.all_gather(std::span<const double>(w), std::span<double>(all_w));
    // Serial row of rank q's row b * kChunk + i: token b * seq + (ranks - 1 - q) * kChunk + i.
    const auto place = [&](int q, std::int64_t row) {
      return (row / kChunk) * seq + (ranks - 1 - q) * kChunk + row % kChunk;
    };
    V ser_x(all_x.size()), ser_w(all_w.size());
    for (int q = 0; q < ranks; ++q)
      for (std::int64_t row = 0; row < kRows; ++row)
        for (std::int64_t c = 0; c < kC; ++c) {
          const auto from = static_cast<std::size_t>((q * kRows + row) * kC + c);
          const auto to = static_cast<std::size_t>(place(q, row) * kC + c);
          ser_x[to] = all_x[from];
          ser_w[to] = all_w[from];
        }
    const double capacity = 0.5;
    const Pass serial = run_moe(nullptr, ser_x, ser_w, ranks * kRows, router, capacity);
    ASSERT_GT(serial.dropped, 0) << "the capacity drops nothing: the test would not see the order";
    const comm::Communicator alone = world.split(world.rank(), 0, "alone");
    const auto ep = [&] {
      return std::make_shared<CommunicatorEpComm>(world.named("ep"), world.named("cp"), alone,
                                                  std::make_shared<EpCommStats>());
    };
    const Pass cp = run_moe(ep(), x, w, kRows, router, capacity, 0.7 / ranks, false, positions, seq);
    V mine_out(x.size()), mine_dx(x.size());
    for (std::int64_t row = 0; row < kRows; ++row)
      for (std::int64_t c = 0; c < kC; ++c) {
        const auto at = static_cast<std::size_t>(row * kC + c);
        const auto from = static_cast<std::size_t>(place(r, row) * kC + c);
        mine_out[at] = serial.out[from];
        mine_dx[at] = serial.dx[from];
      }
    expect_near(cp.out, mine_out, "output", r);
    expect_near(cp.dx, mine_dx, "input gradient", r);
    EXPECT_NEAR(cp.aux, serial.aux, 1e-14 * std::fabs(serial.aux)) << "rank " << r;
    V sum = cp.grads;
    world.all_reduce(std::span<double>(sum));
    expect_near(sum, serial.grads, "gradients summed over the ranks", r);
    // Every rank saying it holds chunk 0: the places overlap, and the sum over the ranks says so.
    std::vector<std::int64_t> same(kChunk);
    for (std::int64_t i = 0; i < kChunk; ++i) same[static_cast<std::size_t>(i)] = i;
    try {
      run_moe(ep(), x, w, kRows, router, capacity, 0.7 / ranks, false, same, seq);
      ADD_FAILURE() << "overlapping positions were not refused on rank " << r;
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("positions that overlap or leave a gap"), std::string::npos) << e.what();
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, MoeCpCapacity,
                         ::testing::Values(std::make_tuple(2, RouterKind::kSoftmax),
                                           std::make_tuple(4, RouterKind::kSigmoid)));

// One float Moe under bf16 products over `ep` (nullptr: serial) on bfloat16 rows x.
struct Bf16Pass {
  std::vector<float> out, dx, grads;
  std::vector<double> load;
  double aux = 0;
};

Bf16Pass run_moe_bf16(std::shared_ptr<nn::EpComm> ep, const std::vector<BFloat16>& x, const std::vector<float>& w,
                      std::int64_t rows, RouterKind router, double capacity) {
  ParamStore<float> store;
  store.set_matmul_precision(MatmulPrecision::kBf16);
  nn::MoeOptions opts{.experts = kExperts,
                      .top_k = kTopK,
                      .shared_experts = 1,
                      .expert_ffn = 5,
                      .kind = MlpKind::kGelu,
                      .router = router,
                      .aux_loss = 0.3,
                      .capacity_factor = capacity};
  if (ep) opts.ep = std::move(ep);
  nn::Moe<float> moe(store, {.channels = kC, .name = "moe", .bias = false}, opts);
  store.allocate();
  for (const auto& view : store.views()) {
    Rng rng(5 + std::hash<std::string>{}(view.name));
    float* p = store.mutable_param(store.find(view.name));
    for (std::int64_t i = 0; i < view.numel; ++i)
      p[i] = static_cast<float>((view.name == "moe.router.bias" ? 0.1 : 0.7) * rng.normal());
  }
  nn::MlpActivations<float> acts;
  moe.resize_activations(acts, rows);
  Bf16Pass p{.out = std::vector<float>(static_cast<std::size_t>(rows * kC)),
             .dx = std::vector<float>(static_cast<std::size_t>(rows * kC))};
  moe.set_aux_weight(0.7);
  moe.forward(x.data(), p.out.data(), acts, rows);
  p.aux = moe.aux_loss();
  store.zero_grad();
  BFloat16* scratch = nullptr;  // the layer's own
  moe.backward(w.data(), x.data(), acts, p.dx.data(), scratch, rows);
  p.grads.assign(store.grads().data(), store.grads().data() + store.size());
  p.load = moe.expert_load();
  return p;
}

void expect_near(const std::vector<float>& a, const std::vector<float>& b, const char* what, int rank) {
  ASSERT_EQ(a.size(), b.size()) << what;
  double worst = 0, scale = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
    scale = std::max(scale, std::fabs(static_cast<double>(b[i])));
  }
  EXPECT_LE(worst, 1e-6 * scale) << what << " on rank " << rank;
  EXPECT_GT(scale, 0) << what;
}

class MoeEpBf16 : public ::testing::TestWithParam<std::tuple<int, RouterKind, double>> {};

TEST_P(MoeEpBf16, EqualsTheSerialLayerOnEveryRanksRows) {
  const auto [ranks, router, capacity] = GetParam();
  comm::inproc::run(
      ranks, [&, router = router, capacity = capacity](const comm::Communicator& world) {
        const int r = world.rank();
        const std::int64_t rows = 3 + 2 * r;
        Rng rng(400 + static_cast<std::uint64_t>(r));
        std::vector<BFloat16> x(static_cast<std::size_t>(rows * kC));
        std::vector<float> w(x.size());
        for (std::size_t i = 0; i < x.size(); ++i) {
          x[i] = BFloat16(static_cast<float>(rng.normal()));
          w[i] = static_cast<float>(rng.normal());
        }
        const Bf16Pass serial = run_moe_bf16(nullptr, x, w, rows, router, capacity);
        const comm::Communicator alone = world.split(world.rank(), 0, "alone");
        const Bf16Pass ep = run_moe_bf16(
            std::make_shared<CommunicatorEpComm>(world.named("ep"), alone, alone, std::make_shared<EpCommStats>()), x,
            w, rows, router, capacity);
        expect_near(ep.out, serial.out, "output", r);
        expect_near(ep.dx, serial.dx, "input gradient", r);
        EXPECT_EQ(ep.load, serial.load);
        EXPECT_EQ(ep.aux, serial.aux);
        std::vector<float> sum_ep = ep.grads, sum_serial = serial.grads;
        world.all_reduce(std::span<float>(sum_ep));
        world.all_reduce(std::span<float>(sum_serial));
        expect_near(sum_ep, sum_serial, "gradients summed over the ranks", r);
      });
}

INSTANTIATE_TEST_SUITE_P(Ranks, MoeEpBf16,
                         ::testing::Values(std::make_tuple(2, RouterKind::kSoftmax, 0.0),
                                           std::make_tuple(4, RouterKind::kSigmoid, 0.5)));

}  // namespace
}  // namespace ndmesh::parallel
