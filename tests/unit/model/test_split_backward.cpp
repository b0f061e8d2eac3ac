// The split backward of zero-bubble pipelines: with nn::DeferWeightGrads active the
// backward computes the same input gradients and no weight gradient of any linear layer
// (head included); running the deferred records afterwards gives the gradients of the
// plain backward, for a whole model and for a pipeline stage (tied and untied heads).
#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

#include "ndmesh/core/error.hpp"
#include "ndmesh/model/decoder.hpp"
#include "ndmesh/nn/linear.hpp"
#include "ndmesh/tensor/rng.hpp"

namespace ndmesh::model {
namespace {

ModelSpec tiny(bool tied) {
  return {.name = "tiny",
          .layers = 3,
          .hidden = 8,
          .heads = 4,
          .kv_heads = 2,
          .ffn = 12,
          .seq = 5,
          .vocab = 7,
          .tied_embeddings = tied};
}

class SplitBackward : public ::testing::TestWithParam<std::pair<bool, int>> {};

TEST_P(SplitBackward, DeferredWeightGradientsEqualThePlainBackward) {
  const auto [tied, first_block] = GetParam();
  ModelSpec spec = tiny(tied);
  spec.init_std = 0.5;
  DecoderT<double> gpt(spec, {.seed = 3, .batch = 2}, UnitRange::blocks(first_block, spec.layers, spec.layers));
  Rng rng(5);
  const std::int64_t n = 10, c = 8;
  std::vector<std::int32_t> tokens(n), targets(n);
  for (auto& t : tokens) t = static_cast<std::int32_t>(rng.below(7));
  for (auto& t : targets) t = static_cast<std::int32_t>(rng.below(7));
  std::vector<double> input(static_cast<std::size_t>(n * c));
  for (auto& x : input) x = rng.normal();
  auto made = gpt.make_activations({.deferred_weight_grads = true});
  Activations& acts = *made;
  gpt.forward(acts, tokens.data(), first_block > 0 ? input.data() : nullptr, targets.data());

  gpt.params().zero_grad();
  gpt.backward(acts, nullptr);
  const std::vector<double> plain(gpt.params().grads().begin(), gpt.params().grads().end());
  const std::vector<double> plain_input(gpt.input_grad().data(),
                                        gpt.input_grad().data() + gpt.input_grad().numel());

  // The backward writes the logits' gradient over the probabilities: a second one needs the
  // forward again (the same inputs, the same activations) ...
  EXPECT_THROW(gpt.backward(acts, nullptr), InternalError);
  gpt.forward(acts, tokens.data(), first_block > 0 ? input.data() : nullptr, targets.data());
  gpt.params().zero_grad();
  nn::DeferredWeightGrads<double> deferred;
  {
    nn::DeferWeightGrads<double> defer(deferred);
    gpt.backward(acts, nullptr);
  }
  ASSERT_FALSE(deferred.empty());
  for (std::int64_t i = 0; i < gpt.input_grad().numel(); ++i)
    EXPECT_EQ(gpt.input_grad().data()[i], plain_input[static_cast<std::size_t>(i)]);
  int linear_weights = 0;
  for (const auto& v : gpt.params().views()) {
    const bool linear = v.name.find(".qkv.") != std::string::npos ||
                        v.name.find(".proj.") != std::string::npos ||
                        v.name.find(".fc.") != std::string::npos || v.name.starts_with("lm_head");
    // Weights only: a row-parallel linear's bias (attn.proj, mlp.proj) is added and
    // differentiated by the block after the tp reduction, in the B pass.
    if (!linear || !v.name.ends_with(".weight")) continue;
    ++linear_weights;
    for (std::int64_t i = 0; i < v.numel; ++i)
      ASSERT_EQ(gpt.params().grads()[v.offset + i], 0.0) << v.name << " got a gradient before the W pass";
  }
  EXPECT_GT(linear_weights, 0);
  deferred.run();
  EXPECT_TRUE(deferred.empty());
  for (std::size_t i = 0; i < plain.size(); ++i)
    EXPECT_NEAR(gpt.params().grads()[static_cast<std::int64_t>(i)], plain[i],
                1e-12 * (1 + std::abs(plain[i])));
}

INSTANTIATE_TEST_SUITE_P(TiedAndStages, SplitBackward,
                         ::testing::Values(std::pair{true, 0}, std::pair{false, 0}, std::pair{true, 1},
                                           std::pair{false, 2}));

}  // namespace
}  // namespace ndmesh::model
