// The planner's mixture-of-experts arithmetic against hand-computed figures: parameters and
// active parameters (Mixtral 8x7B: 46.7B and 12.9B, Jiang et al. 2024 and its Hugging Face
// model card; DeepSeek-V3: 671B and 37B, DeepSeek-AI 2024), FLOPs from the active experts,
// memory per rank with the experts sharded over ep and their states over dp x cp / ep, the
// all-to-all's seconds, and the search over ep. Every expected value is worked out in the
// comments from the model's shape, never taken from the code under test.
#include <cmath>
#include <string>

#include <gtest/gtest.h>

#include "ndmesh/config/config.hpp"
#include "ndmesh/core/error.hpp"
#include "ndmesh/plan/estimate.hpp"
#include "ndmesh/plan/formulas.hpp"
#include "ndmesh/plan/presets.hpp"
#include "ndmesh/plan/search.hpp"

namespace ndmesh::plan {
namespace {

// Mixtral 8x7B: 32 layers, h 4096, 32 heads of 128, 8 kv heads (1024 wide), 8 SwiGLU experts
// of 14336, top-2, vocabulary 32000, untied, RMSNorm, no biases.
constexpr double kH = 4096, kL = 32, kV = 32000, kF = 14336, kKv = 1024, kE = 8;
constexpr double kAttention = 2 * kH * kH + 2 * kH * kKv;  // q, o; k, v: 41,943,040
constexpr double kExpert = 3 * kH * kF;                    // gate, up, down: 176,160,768
constexpr double kRouter = kE * kH;                        // 32,768
constexpr double kNorms = 2 * kH;                          // two RMSNorm scales per layer
constexpr double kOutside = 2 * kV * kH + kH;              // embedding, output layer, final norm

TEST(MoeParameters, Mixtral8x7bTotalAndActive) {
  const ParameterCount c = count_parameters(model_preset("mixtral-8x7b"));
  // 32 x (41,943,040 + 8 x 176,160,768 + 32,768 + 8,192) + 262,148,096 = 46,702,792,704.
  EXPECT_DOUBLE_EQ(c.total(), kL * (kAttention + kE * kExpert + kRouter + kNorms) + kOutside);
  EXPECT_DOUBLE_EQ(c.total(), 46702792704.0);
  // A token goes through 2 of the 8 experts: 12,879,925,248.
  EXPECT_DOUBLE_EQ(c.active(), kL * (kAttention + 2 * kExpert + kRouter + kNorms) + kOutside);
  EXPECT_DOUBLE_EQ(c.active(), 12879925248.0);
  // The published figures: 46.7B and 12.9B (the Hugging Face model card; the paper rounds to 47B, 13B).
  EXPECT_NEAR(c.total() / 1e9, 46.7, 0.05);
  EXPECT_NEAR(c.active() / 1e9, 12.9, 0.05);
  EXPECT_DOUBLE_EQ(c.routed, kL * kE * kExpert);
}

TEST(MoeParameters, DeepSeekV3Shape) {
  // 61 layers, h 7168, 128 heads of 56 (plain attention: 4 h^2), the first 3 dense (SwiGLU
  // 18432), then 256 routed experts of 2048 (top-8) + 1 shared, a sigmoid router with its
  // 256 balancing biases, vocabulary 129280, untied.
  const double h = 7168, v = 129280, e = 256, expert = 3 * h * 2048;
  const double attention = 4 * h * h, norms = 2 * h;
  const double dense = attention + 3 * h * 18432 + norms;
  const double moe = attention + e * h + e + e * expert + expert + norms;
  const double outside = 2 * v * h + h;
  const ParameterCount c = count_parameters(model_preset("deepseek-v3"));
  EXPECT_DOUBLE_EQ(c.total(), 3 * dense + 58 * moe + outside);
  EXPECT_DOUBLE_EQ(c.active(), 3 * dense + 58 * (moe - e * expert + 8 * expert) + outside);
  // Published: 671B total, 37B active (arXiv:2412.19437). The shape has no multi-head latent
  // attention (its low-rank projections hold less than 4 h^2) and no MTP module: within 0.5%
  // and 5%.
  EXPECT_NEAR(c.total() / 671e9, 1.0, 0.005);
  EXPECT_NEAR(c.active() / 37e9, 1.0, 0.05);
}

TEST(MoeFlops, FromTheActiveExperts) {
  const PlanModel m = model_preset("mixtral-8x7b");
  const double s = 4096, batch = 8;
  // Per token and layer: 2 FLOPs per weight met (attention, router, 2 experts) + 4 s h for
  // the attention core; the logits 2 h V; forward + backward 3x.
  const double layer = 2 * (kAttention + kRouter + 2 * kExpert) + 4 * s * kH;
  const double expected = 3 * batch * s * (kL * layer + 2 * kH * kV);
  EXPECT_DOUBLE_EQ(model_flops_per_step(m, s, batch), expected);
  // Far below the FLOPs of a dense model of all 8 experts.
  EXPECT_LT(model_flops_per_step(m, s, batch), 0.35 * 3 * batch * s * 2 * 46.7e9);
}

TEST(MoeMemory, ExpertsShardedOverEpTheirStatesOverTheRest) {
  const PlanModel m = model_preset("mixtral-8x7b");
  // What a rank holds apart from the routed experts: attention, router, norms, embedding,
  // output layer, final norm.
  const double dense = kL * (kAttention + kRouter + kNorms) + kOutside;
  const Workload w{.seq = 4096, .global_batch = 64};
  for (std::int64_t ep : {1, 2, 4, 8}) {
    const Layout l{.dp = 8, .micro_batch = 1, .zero = 1, .ep = ep};
    const MemoryBreakdown mem = estimate_memory(m, l, w);
    const double experts = kL * (kE / static_cast<double>(ep)) * kExpert;
    EXPECT_DOUBLE_EQ(mem.stage_expert_parameters, experts) << ep;
    EXPECT_DOUBLE_EQ(mem.stage_parameters, dense + experts) << ep;
    EXPECT_DOUBLE_EQ(mem.params, 2 * (dense + experts)) << ep;
    EXPECT_DOUBLE_EQ(mem.grads, 2 * (dense + experts)) << ep;
    // ZeRO-1: the dense states over dp x cp = 8, the experts' over dp x cp / ep.
    EXPECT_DOUBLE_EQ(mem.optimizer, 12 * (dense / 8 + experts / (8.0 / static_cast<double>(ep)))) << ep;
  }
  // Experts split over tp too, like the dense MLP: E/ep x 3 h f / tp per MoE layer.
  const MoeLayerShare share = moe_layer_parameters_per_rank(m, 2, 4);
  EXPECT_DOUBLE_EQ(share.experts, 2 * kExpert / 2);
  // q and o split over tp (2 h^2 / 2), k and v by kv heads (4 of 8 per rank, 512 wide each).
  EXPECT_DOUBLE_EQ(share.dense, 2 * kH * kH / 2 + 2 * kH * (kKv / 2) + kRouter + kNorms);
}

TEST(MoeMemory, EveryStageIsWeighed) {
  // DeepSeek-V3's first three blocks are dense: over 32 stages of 2 blocks (the last ones 1),
  // stage 0 holds two dense blocks, stage 1 one of each, stages 2.. two MoE blocks of 256
  // experts each (ep 1), which outweigh everything else.
  const PlanModel m = model_preset("deepseek-v3");
  const Layout l{.pp = 32, .dp = 64, .micro_batch = 1, .zero = 1, .ep = 1};
  const MemoryBreakdown mem = estimate_memory(m, l, {.seq = 4096, .global_batch = 2048});
  EXPECT_GE(mem.stage, 2);
  EXPECT_EQ(mem.moe_layers_on_stage, 2);
  EXPECT_DOUBLE_EQ(mem.stage_expert_parameters, 2 * 256 * 3 * 7168.0 * 2048);
}

TEST(MoeMemory, DispatchedRowsAndRouterProbabilities) {
  const PlanModel v = moe_block_view(model_preset("mixtral-8x7b"));
  // The view's MLP is the 2 active experts' width.
  EXPECT_EQ(v.spec.ffn_or_default(), 2 * 14336);
  const double s = 4096, b = 2;
  ActivationOptions plain{.activation_bytes = 2, .attention = Attention::kFlash};
  ActivationOptions moe = plain;
  moe.moe = true;
  // Beside the experts' activations: top-2 copies of each token in and out (2 x 2 x h x 2 B)
  // and fp32 router probabilities (4 B x 8).
  EXPECT_DOUBLE_EQ(activation_bytes_per_layer(v, s, b, moe) - activation_bytes_per_layer(v, s, b, plain),
                   (2 * 2 * 2 * kH + 4 * 8) * s * b);
}

TEST(MoeTime, AllToAllInsideAndAcrossNodes) {
  const double bytes = 64e6;
  EXPECT_EQ(all_to_all_seconds(bytes, 1, 1, 400e9, 50e9, 5e-6), 0.0);
  // 8 ranks on one node: 7 messages, 7/8 of the bytes over NVLink.
  EXPECT_DOUBLE_EQ(all_to_all_seconds(bytes, 8, 8, 400e9, 50e9, 5e-6), 7 * 5e-6 + 7.0 / 8 * bytes / 400e9);
  // 16 ranks, 8 per node: 7/16 over NVLink while 8/16 go over the NIC; the NIC's part decides.
  EXPECT_DOUBLE_EQ(all_to_all_seconds(bytes, 16, 8, 400e9, 50e9, 10e-6),
                   15 * 10e-6 + 8.0 / 16 * bytes / 50e9);
}

TEST(MoeTime, AllToAllTermPerMoeLayerAndMicroBatch) {
  const PlanModel m = model_preset("mixtral-8x7b");
  const Hardware hw = hardware_preset("h100");
  const Workload w{.seq = 4096, .global_batch = 64};
  const Layout one{.dp = 8, .micro_batch = 1, .zero = 1, .attention = Attention::kFlash, .ep = 1};
  EXPECT_EQ(estimate(m, hw, one, w).time.ep_comm, 0.0);
  Layout l = one;
  l.ep = 8;  // the 8 dp ranks of one node exchange tokens
  const Estimate e = estimate(m, hw, l, w);
  ASSERT_TRUE(e.where.ep_in_node);
  // Each rank sends its 4096 tokens' 2 copies of h bf16 values: 4096 x 2 x 4096 x 2 B; 4
  // all-to-alls per MoE layer and micro-batch, 32 MoE layers, 64 / 8 = 8 micro-batches.
  const double bytes = 4096.0 * 2 * kH * 2;
  EXPECT_DOUBLE_EQ(e.time.ep_bytes, bytes);
  const double a2a = 7 * hw.intra_node_latency + 7.0 / 8 * bytes / hw.intra_node_bw;
  EXPECT_NEAR(e.time.ep_comm, 8 * 32 * 4 * a2a, 1e-12);
  // The experts' gradients: over dp x cp / ep = 1 rank, nothing to reduce; the rest over 8.
  EXPECT_EQ(e.time.dp_expert_comm, 0.0);
  // The same FLOPs whatever ep (the products' kernels differ).
  EXPECT_DOUBLE_EQ(e.model_flops, estimate(m, hw, one, w).model_flops);
}

TEST(MoeSearch, SearchesEpAndHonoursTheConstraint) {
  const PlanModel m = model_preset("mixtral-8x7b");
  const Hardware hw = hardware_preset("h100");
  SearchOptions o{.gpus = 32, .workload = {.seq = 4096, .global_batch = 64}, .top = 20, .micro_batches = {1}};
  o.attention = Attention::kFlash;
  const SearchResult r = search(m, hw, o);
  ASSERT_FALSE(r.layouts.empty());
  bool some_ep = false;
  for (const Estimate& e : r.layouts) {
    const Layout& l = e.layout;
    EXPECT_EQ((l.dp * l.cp) % l.ep, 0);
    EXPECT_EQ(8 % l.ep, 0);
    some_ep = some_ep || l.ep > 1;
    EXPECT_DOUBLE_EQ(e.active_parameters, 12879925248.0);
  }
  EXPECT_TRUE(some_ep);
  o.constraints.ep = {4};
  const SearchResult fixed = search(m, hw, o);
  ASSERT_FALSE(fixed.layouts.empty());
  for (const Estimate& e : fixed.layouts) EXPECT_EQ(e.layout.ep, 4);
  // A dense model is searched at ep 1 only.
  const SearchResult dense =
      search(model_preset("llama3-8b"), hw, {.gpus = 8, .workload = {.seq = 4096, .global_batch = 16}});
  for (const Estimate& e : dense.layouts) EXPECT_EQ(e.layout.ep, 1);
}

TEST(MoeSearch, ValidationFoldsEp) {
  const PlanModel m = model_preset("mixtral-8x7b");
  const Workload w{.seq = 4096, .global_batch = 64};
  auto all_problems = [&](const Layout& l) {
    std::string text;
    for (const auto& p : problems(parallel_config(l, w, 8), &m.spec)) text += p + "\n";
    return text;
  };
  EXPECT_EQ(all_problems({.dp = 8, .ep = 8}), "");
  EXPECT_NE(all_problems({.dp = 4, .ep = 8}).find("ep=8 must divide dp*cp"), std::string::npos);
  EXPECT_NE(all_problems({.dp = 6, .ep = 3}).find("experts=8 is not divisible by ep=3"), std::string::npos);
}

}  // namespace
}  // namespace ndmesh::plan
