// Tensor-parallel layers in double precision under mpirun (the tp group is the world):
// a DecoderT<double> split over tp, with random parameters that are slices of a serial
// model's, has the serial loss (1e-12) and, for every parameter, the slice of the serial
// gradient (1e-10) once the tp part of the gradient rule (parallel::sum_replicated_over_tp,
// the function training uses) has run; and its gradients match central finite differences
// of the tp loss itself (perturbing one rank's shard element, or a replicated element on every rank),
// with and without sequence parallelism, tied and untied heads, grouped-query attention.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "ndmesh/comm/communicator.hpp"
#include "ndmesh/model/decoder.hpp"
#include "ndmesh/parallel/grad_sync.hpp"
#include "ndmesh/parallel/tp/tp_comm.hpp"
#include "ndmesh/tensor/rng.hpp"

namespace ndmesh {
namespace {

using comm::Communicator;

struct Case {
  bool tied;
  bool sequence_parallel;
};

class TpGrad : public ::testing::TestWithParam<Case> {};

TEST_P(TpGrad, SliceOfSerialAndFiniteDifferences) {
  const Case c = GetParam();
  const Communicator world = Communicator::world();
  const int tp = world.size(), rank = world.rank();
  const ModelSpec spec{.layers = 2,
                       .hidden = 16,
                       .heads = 4,
                       .kv_heads = 2,
                       .ffn = 8 * tp,
                       .seq = 8,
                       .vocab = 4 * tp,
                       .tied_embeddings = c.tied};
  const std::int64_t batch = 2, n = batch * spec.seq;
  model::DecoderT<double> serial(spec, {.seed = 3, .batch = batch});
  auto stats = std::make_shared<parallel::TpCommStats>();
  model::DecoderT<double> split(spec, {.seed = 3, .batch = batch}, {},
                                parallel::make_tp_context<double>(world, c.sequence_parallel, stats));
  // Random parameters (biases and norms too, so that every path is exercised): the
  // serial model's, and each rank's slices of them.
  Rng rng(17);
  for (double& x : serial.params().params()) x = 0.3 * rng.normal();
  auto& store = split.params();
  for (const ParamView& v : store.views()) {
    const int id = serial.params().find(v.name);
    ASSERT_GE(id, 0) << v.name;
    copy_shard(v.shard, v.shape, store.params().data() + v.offset, serial.params().mutable_param(id), false);
  }
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(n)), targets(tokens.size());
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<std::int32_t>((i * 7 + 3) % static_cast<std::size_t>(spec.vocab));
    targets[i] = static_cast<std::int32_t>((i * 5 + 1) % static_cast<std::size_t>(spec.vocab));
  }

  const double serial_loss = serial.forward(tokens.data(), targets.data());
  serial.backward();
  const double loss = split.forward(tokens.data(), targets.data());
  split.backward();
  // The tp part of the gradient rule, as training applies it (GradSync).
  Tensor<double> work;
  ParamStore<double>* stores[] = {&split.params()};
  parallel::sum_replicated_over_tp<double>(
      split.tp(), stores,
      [&](std::size_t chunk, const ParamView& v, auto&& f) {
        f(stores[chunk]->grads().data() + v.offset, v.numel, std::int64_t{0});
      },
      work);
  EXPECT_NEAR(loss, serial_loss, 1e-12 * std::abs(serial_loss));
  EXPECT_GT(stats->all_reduce.calls, 0);
  if (c.sequence_parallel) {
    EXPECT_GT(stats->all_gather.calls, 0);
  }

  // Every gradient is the slice of the serial one.
  std::vector<double> expected;
  for (const ParamView& v : store.views()) {
    const int id = serial.params().find(v.name);
    expected.assign(static_cast<std::size_t>(v.numel), 0.0);
    copy_shard(v.shard, v.shape, expected.data(), const_cast<double*>(serial.params().grad(id)), false);
    double worst = 0;
    for (std::int64_t i = 0; i < v.numel; ++i)
      worst = std::max(worst, std::abs(store.grads()[static_cast<std::size_t>(v.offset + i)] -
                                       expected[static_cast<std::size_t>(i)]));
    EXPECT_LT(worst, 1e-10) << "rank " << rank << " " << v.name << (v.shard.sharded() ? " (sharded)" : "");
  }

  // Central differences of the tp loss: a sharded element is perturbed on its owner only
  // (the others run the same collectives unperturbed), a replicated one on every rank.
  const double h = 1e-5;
  std::vector<double> analytic(store.grads().begin(), store.grads().end());
  int checked = 0;
  for (const ParamView& v : store.views()) {
    for (std::int64_t i : {std::int64_t{0}, v.numel / 2, v.numel - 1}) {
      const int owners = v.shard.sharded() ? tp : 1;
      for (int owner = 0; owner < owners; ++owner) {
        const bool mine = !v.shard.sharded() || owner == rank;
        double& x = store.params()[static_cast<std::size_t>(v.offset + i)];
        const double saved = x;
        if (mine) x = saved + h;
        const double up = split.forward(tokens.data(), targets.data());
        if (mine) x = saved - h;
        const double down = split.forward(tokens.data(), targets.data());
        x = saved;
        if (!mine) continue;
        const double fd = (up - down) / (2 * h), g = analytic[static_cast<std::size_t>(v.offset + i)];
        EXPECT_NEAR(g, fd, 1e-7 * std::max(1.0, std::abs(fd)))
            << "rank " << rank << " " << v.name << "[" << i << "]";
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 0);
}

INSTANTIATE_TEST_SUITE_P(Layouts, TpGrad,
                         ::testing::Values(Case{true, false}, Case{false, false}, Case{true, true},
                                           Case{false, true}),
                         [](const auto& param_info) {
                           return fmt::format("{}_{}", param_info.param.tied ? "tied" : "untied",
                                              param_info.param.sequence_parallel ? "sp" : "nosp");
                         });

}  // namespace
}  // namespace ndmesh
