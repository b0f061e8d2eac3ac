// One mixture-of-experts MLP of ndmesh (nn::Moe: SwiGLU experts, top-2 of 4, one shared
// expert, the auxiliary loss), in double precision, written as JSON for the PyTorch reference
// (tests/reference/moe_torch.py): its options, every parameter, the input, the output's
// gradient, and what the layer computed: the output, the auxiliary loss, the input's gradient
// and every parameter's gradient of <out, dout> + aux_weight * aux.
//   moe_dump softmax|sigmoid [seed]
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dump_support.hpp"
#include "ndmesh/nn/moe.hpp"
#include "ndmesh/tensor/rng.hpp"

using reference_dump::fill;
using reference_dump::list;

int main(int argc, char** argv) {
  using namespace ndmesh;
  using namespace ndmesh::nn;
  const std::string router = argc > 1 ? argv[1] : "softmax";
  const std::uint64_t seed = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 7;
  constexpr std::int64_t kChannels = 8, kExperts = 4, kTopK = 2, kShared = 1, kExpertFfn = 6, kRows = 12;
  constexpr double kAux = 0.1, kAuxWeight = 0.5;
  Rng rng(seed);
  ParamStore<double> store;
  Moe<double> moe(store, {.channels = kChannels, .name = "moe", .bias = false},
                  {.experts = kExperts,
                   .top_k = kTopK,
                   .shared_experts = kShared,
                   .expert_ffn = kExpertFfn,
                   .kind = MlpKind::kSwiglu,
                   .router = parse_router(router),
                   .aux_loss = kAux});
  store.allocate();
  for (const auto& view :
       store.views())  // a small balancing bias: it moves choices without starving an expert
    fill(store.mutable_param(store.find(view.name)), view.numel, rng,
         view.name == "moe.router.bias" ? 0.05 : 0.4);
  const std::int64_t n = kRows * kChannels;
  std::vector<double> x(static_cast<std::size_t>(n)), dout(static_cast<std::size_t>(n)),
      out(static_cast<std::size_t>(n)), dx(static_cast<std::size_t>(n), 0.0), scratch;
  fill(x.data(), n, rng, 1.0);
  fill(dout.data(), n, rng, 1.0);
  MlpActivations<double> acts;
  acts.resize(kRows, moe.pre_width(), moe.hidden_width());
  moe.set_aux_weight(kAuxWeight);
  moe.forward(x.data(), out.data(), acts, kRows);
  moe.backward(dout.data(), x.data(), acts, dx.data(), scratch.data(), kRows);

  std::string params, grads;
  for (const auto& view : store.views()) {
    const auto id = store.find(view.name);
    params += fmt::format("{}\"{}\": {{\"shape\": [{}], \"values\": {}}}", params.empty() ? "" : ", ",
                          view.name, fmt::join(view.shape, ", "), list(store.param(id), view.numel));
    grads +=
        fmt::format("{}\"{}\": {}", grads.empty() ? "" : ", ", view.name, list(store.grad(id), view.numel));
  }
  fmt::print(
      "{{\"router\": \"{}\", \"channels\": {}, \"experts\": {}, \"top_k\": {}, \"shared\": {}, "
      "\"expert_ffn\": {}, "
      "\"rows\": {}, \"aux_coeff\": {}, \"aux_weight\": {}, \"params\": {{{}}}, \"x\": {}, \"dout\": {}, "
      "\"out\": {}, \"aux\": {:.17g}, \"dx\": {}, \"grads\": {{{}}}}}\n",
      router, kChannels, kExperts, kTopK, kShared, kExpertFfn, kRows, kAux, kAuxWeight, params,
      list(x.data(), n), list(dout.data(), n), list(out.data(), n), moe.aux_loss(), list(dx.data(), n),
      grads);
  return 0;
}
