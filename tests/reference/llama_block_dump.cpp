// One Llama block of ndmesh (nn::Block with RMSNorm, rotary positions, grouped-query
// attention, SwiGLU and no biases), in double precision, written as JSON for the PyTorch
// reference (tests/reference/llama_block_torch.py): its options, every parameter (name, shape,
// values), the input, the positions, the output's gradient, and what the block computed: the
// output, the input's gradient and every parameter's gradient.
//   llama_block_dump [seed]
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dump_support.hpp"
#include "ndmesh/nn/block.hpp"
#include "ndmesh/tensor/rng.hpp"

using reference_dump::fill;
using reference_dump::list;

int main(int argc, char** argv) {
  using namespace ndmesh;
  using namespace ndmesh::nn;
  const std::uint64_t seed = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 7;
  constexpr std::int64_t kChannels = 16, kHeads = 4, kKvHeads = 2, kFfn = 24, kBatch = 2, kSeq = 6;
  constexpr double kTheta = 500000, kEps = 1e-5;
  Rng rng(seed);
  ParamStore<double> store;
  Block<double> block(store, {.channels = kChannels,
                              .heads = kHeads,
                              .kv_heads = kKvHeads,
                              .ffn = kFfn,
                              .norm = NormKind::kRmsNorm,
                              .norm_eps = kEps,
                              .mlp = MlpKind::kSwiglu,
                              .bias = false,
                              .rope = RopeOptions{.theta = kTheta}});
  store.allocate();
  for (const auto& view : store.views()) {
    double* p = store.mutable_param(store.find(view.name));
    fill(p, view.numel, rng, 0.3);
    if (view.name.ends_with("ln1.weight") || view.name.ends_with("ln2.weight"))
      for (std::int64_t i = 0; i < view.numel; ++i) p[i] += 1.0;  // norms near their initial 1
  }
  const std::int64_t n = kBatch * kSeq * kChannels;
  const std::vector<std::int64_t> positions = {3, 4, 5, 9, 10, 11};  // a later chunk, as a cp rank has
  std::vector<double> x(static_cast<std::size_t>(n)), dout(static_cast<std::size_t>(n)),
      dx(static_cast<std::size_t>(n), 0.0);
  fill(x.data(), n, rng, 1.0);
  fill(dout.data(), n, rng, 1.0);
  BlockActivations<double> acts;
  BlockScratch<double> scratch;
  block.resize(acts, kBatch, kSeq);
  block.resize(scratch, kBatch, kSeq);
  block.forward(x.data(), acts, kBatch, kSeq, nullptr, positions.data());
  block.backward(dout.data(), x.data(), acts, scratch, dx.data(), kBatch, kSeq, nullptr, nullptr,
                 positions.data());

  std::string params, grads;
  for (const auto& view : store.views()) {
    const auto id = store.find(view.name);
    params += fmt::format("{}\"{}\": {{\"shape\": [{}], \"values\": {}}}", params.empty() ? "" : ", ",
                          view.name, fmt::join(view.shape, ", "), list(store.param(id), view.numel));
    grads +=
        fmt::format("{}\"{}\": {}", grads.empty() ? "" : ", ", view.name, list(store.grad(id), view.numel));
  }
  fmt::print(
      "{{\"channels\": {}, \"heads\": {}, \"kv_heads\": {}, \"ffn\": {}, \"batch\": {}, \"seq\": {}, "
      "\"theta\": {}, \"eps\": {}, \"positions\": [{}], \"params\": {{{}}}, \"x\": {}, \"dout\": {}, "
      "\"out\": {}, \"dx\": {}, \"grads\": {{{}}}}}\n",
      kChannels, kHeads, kKvHeads, kFfn, kBatch, kSeq, kTheta, kEps, fmt::join(positions, ", "), params,
      list(x.data(), n), list(dout.data(), n), list(acts.out.data(), n), list(dx.data(), n), grads);
  return 0;
}
