// The whole model against finite differences (double), its loss at initialisation, and
// the float model against the double one.
#include <cmath>
#include <ostream>
#include <type_traits>
#include <vector>

#include <gtest/gtest.h>

#include "ndmesh/config/training.hpp"
#include "ndmesh/core/error.hpp"
#include "ndmesh/core/recompute.hpp"
#include "ndmesh/model/decoder.hpp"
#include "ndmesh/plan/formulas.hpp"
#include "ndmesh/tensor/blas.hpp"
#include "unit/nn/fd_check.hpp"

namespace ndmesh::model {
namespace {

ModelSpec tiny(bool tied, std::int64_t kv_heads) {
  return {.name = "tiny",
          .layers = 2,
          .hidden = 8,
          .heads = 4,
          .kv_heads = kv_heads,
          .ffn = 12,
          .seq = 5,
          .vocab = 7,
          .tied_embeddings = tied};
}

ModelSpec with_init(ModelSpec spec, double init_std) {
  spec.init_std = init_std;
  return spec;
}

std::vector<std::int32_t> random_tokens(std::int64_t n, std::int64_t vocab, Rng& rng) {
  std::vector<std::int32_t> t(static_cast<std::size_t>(n));
  for (auto& x : t) x = static_cast<std::int32_t>(rng.below(static_cast<std::uint64_t>(vocab)));
  return t;
}

// Moves every parameter off its initial value (norm scales and biases start at 1 and 0, which
// would make their gradients special), then checks every parameter's gradient against finite
// differences of the loss on (tokens, targets).
void expect_gradients_match_finite_differences(DecoderT<double>& m, const std::vector<std::int32_t>& tokens,
                                               const std::vector<std::int32_t>& targets, Rng& rng) {
  for (const auto& v : m.params().views())
    for (std::int64_t i = 0; i < v.numel; ++i) m.params().params()[v.offset + i] += 0.1 * rng.normal();
  auto loss = [&] { return m.forward(tokens.data(), targets.data()); };
  m.params().zero_grad();
  loss();
  m.backward();
  testing::expect_param_gradients(m.params(), loss);
}

struct GradCase {
  const char* arch;
  bool tied;
  std::int64_t kv_heads;
};
void PrintTo(const GradCase& c, std::ostream* os) {
  *os << c.arch << (c.tied ? " tied" : " untied") << " kv_heads " << c.kv_heads;
}

class GptGrad : public ::testing::TestWithParam<GradCase> {};

TEST_P(GptGrad, WholeModelGradientsMatchFiniteDifferences) {
  const GradCase c = GetParam();
  ModelSpec spec = with_arch(tiny(c.tied, c.kv_heads), c.arch);
  spec.tied_embeddings = c.tied;
  // A larger init than training uses, so that every parameter matters to the loss.
  DecoderT<double> gpt(with_init(spec, 0.5), {.seed = 3, .batch = 2});
  Rng rng(5);
  auto tokens = random_tokens(10, 7, rng), targets = random_tokens(10, 7, rng);
  expect_gradients_match_finite_differences(gpt, tokens, targets, rng);
}

// GPT-2 and Llama (RMSNorm, SwiGLU, rotary positions, no biases), tied and untied, with and
// without grouped-query attention; the vocabulary of 7 padded to 64 rows.
INSTANTIATE_TEST_SUITE_P(ArchTiedAndKvHeads, GptGrad,
                         ::testing::Values(GradCase{"gpt2", true, 0}, GradCase{"gpt2", false, 2},
                                           GradCase{"gpt2", true, 1}, GradCase{"llama", false, 2},
                                           GradCase{"llama", true, 4}));

// A mixture of experts in the whole model: a dense first block, then a MoE block of SwiGLU
// experts with a shared expert; the objective is the mean loss plus the auxiliary loss, both
// weighed as the model reports them (take_aux_loss_sum).
TEST(MoeGrad, WholeModelGradientsMatchFiniteDifferences) {
  for (const RouterKind router : {RouterKind::kSoftmax, RouterKind::kSigmoid}) {
    ModelSpec spec = with_arch(tiny(false, 2), "llama");
    spec.experts = 3;
    spec.top_k = 2;
    spec.shared_experts = 1;
    spec.expert_ffn = 4;
    spec.moe_first_dense = 1;
    spec.router = router;
    spec.aux_loss = 0.2;
    DecoderT<double> m(with_init(spec, 0.5), {.seed = 3, .batch = 2});
    ASSERT_EQ(m.blocks()[0].mlp().experts(), 0);
    ASSERT_EQ(m.blocks()[1].mlp().experts(), 3);
    Rng rng(7);
    auto tokens = random_tokens(10, 7, rng), targets = random_tokens(10, 7, rng);
    for (const auto& v : m.params().views())
      for (std::int64_t i = 0; i < v.numel; ++i) m.params().params()[v.offset + i] += 0.1 * rng.normal();
    auto loss = [&] {
      const double lm = m.forward(tokens.data(), targets.data());
      return lm + m.take_aux_loss_sum();
    };
    m.params().zero_grad();
    loss();
    m.backward();
    for (const auto& view : m.params().views()) {
      if (view.name.ends_with("router.bias")) continue;  // no gradient: it picks, it does not weigh
      const double largest = testing::expect_gradient(view.name, m.params().params().data() + view.offset,
                                                      m.params().grads().data() + view.offset, view.numel, loss);
      EXPECT_GT(largest, 1e-6) << view.name;
    }
    // The load of one forward counts every token's two assignments (10 tokens x top-2).
    m.take_expert_loads();
    loss();
    const std::vector<double> load = m.take_expert_loads();
    ASSERT_EQ(load.size(), 3u);
    EXPECT_EQ(load[0] + load[1] + load[2], 20.0);
  }
}

// A context-parallel rank's model: rows at global positions that are not contiguous
// (zigzag chunks). The embedding reads those rows of the position table and the causal
// mask compares them; gradients still match finite differences, and explicit positions
// 0..seq-1 give exactly the default model.
TEST(Gpt, NonContiguousPositionsGradientsMatchFiniteDifferences) {
  DecoderT<double> gpt(with_init(tiny(true, 2), 0.5), {.seed = 3, .batch = 2, .seq = 3});
  gpt.set_positions({0, 3, 4});
  Rng rng(6);
  auto tokens = random_tokens(6, 7, rng), targets = random_tokens(6, 7, rng);
  expect_gradients_match_finite_differences(gpt, tokens, targets, rng);
  EXPECT_THROW(gpt.set_positions({0, 5, 1}), Error);
  EXPECT_THROW(gpt.set_positions({0, 1}), Error);
}

TEST(Gpt, ExplicitSerialPositionsAreTheDefault) {
  DecoderT<double> a(tiny(false, 2), {.seed = 4, .batch = 2}), b(tiny(false, 2), {.seed = 4, .batch = 2});
  b.set_positions({0, 1, 2, 3, 4});
  Rng rng(7);
  auto tokens = random_tokens(10, 7, rng), targets = random_tokens(10, 7, rng);
  EXPECT_EQ(a.forward(tokens.data(), targets.data()), b.forward(tokens.data(), targets.data()));
}

TEST(Gpt, LossAtInitialisationIsNearLogVocab) {
  set_blas_threads(1);
  const ModelSpec spec{.layers = 2, .hidden = 32, .heads = 4, .seq = 16, .vocab = 64};
  Decoder gpt(spec, {.seed = 1, .batch = 4});
  Rng rng(9);
  auto tokens = random_tokens(64, 64, rng), targets = random_tokens(64, 64, rng);
  // With weights of std 0.02 the logits are tiny, so the prediction is close to uniform.
  EXPECT_NEAR(gpt.forward(tokens.data(), targets.data()), std::log(64.0), 0.02);
}

TEST(Gpt, FloatModelMatchesDoubleModel) {
  const ModelSpec spec = tiny(true, 2);
  Decoder f(spec, {.seed = 4, .batch = 2});
  DecoderT<double> d(spec, {.seed = 4, .batch = 2});
  // Same seed: the float init is the double init rounded.
  for (std::int64_t i = 0; i < f.params().size(); ++i)
    ASSERT_EQ(f.params().params()[i], static_cast<float>(d.params().params()[i]));
  Rng rng(6);
  auto tokens = random_tokens(10, 7, rng), targets = random_tokens(10, 7, rng);
  EXPECT_NEAR(f.forward(tokens.data(), targets.data()), d.forward(tokens.data(), targets.data()), 1e-5);
  f.params().zero_grad();
  d.params().zero_grad();
  f.backward();
  d.backward();
  for (std::int64_t i = 0; i < f.params().size(); ++i)
    EXPECT_NEAR(f.params().grads()[i], d.params().grads()[i], 1e-5) << i;
}

TEST(Gpt, ParametersAreOneFlatBufferOfNamedViews) {
  const ModelSpec spec = tiny(false, 2);
  Decoder gpt(spec, {.batch = 1});
  const auto& store = gpt.params();
  // Count by hand: embeddings 7x8 + 5x8, final norm 2x8, untied head 7x8, and per block
  // two norms (4x8), qkv 8x(4+2+2)*2 + 16, proj 8x8 + 8, fc 8x12 + 12, mlp proj 12x8 + 8. The
  // store holds the token table and the head padded to 64 rows of 8.
  const std::int64_t block = 4 * 8 + (8 * 16 + 16) + (64 + 8) + (96 + 12) + (96 + 8);
  std::int64_t logical = 0;
  for (const auto& v : store.views()) logical += v.full_numel();
  EXPECT_EQ(logical, 56 + 40 + 16 + 56 + 2 * block);
  EXPECT_EQ(store.parameter_count(), 512 + 40 + 16 + 512 + 2 * block);
  EXPECT_GE(store.find("block.1.attn.qkv.weight"), 0);
  EXPECT_EQ(store.view(store.find("block.1.attn.qkv.weight")).shape, (std::vector<std::int64_t>{16, 8}));
  EXPECT_GE(store.find("lm_head.weight"), 0);
  std::int64_t end = 0;
  for (const auto& v : store.views()) {
    EXPECT_GE(v.offset, end) << v.name;  // views never overlap
    EXPECT_EQ(v.offset % kParamAlign, 0) << v.name;
    end = v.offset + v.numel;
  }
  EXPECT_LE(end, store.size());
}

TEST(Gpt, InitialisationDependsOnlyOnSeedAndName) {
  const ModelSpec one{.layers = 1, .hidden = 8, .heads = 2, .seq = 4, .vocab = 5};
  ModelSpec two = one;
  two.layers = 2;
  Decoder a(one, {.seed = 7}), b(two, {.seed = 7}), c(one, {.seed = 8});
  const auto& sa = a.params();
  const auto& sb = b.params();
  const int ia = sa.find("block.0.mlp.fc.weight"), ib = sb.find("block.0.mlp.fc.weight");
  for (std::int64_t i = 0; i < sa.view(ia).numel; ++i) EXPECT_EQ(sa.param(ia)[i], sb.param(ib)[i]);
  EXPECT_NE(sa.param(ia)[0], c.params().param(ia)[0]);
}

TEST(Gpt, BadSpecsNameTheFieldAndTheFix) {
  ModelSpec spec{.layers = 1, .hidden = 10, .heads = 4, .kv_heads = 3, .seq = 4, .vocab = 5};
  try {
    Decoder gpt(spec);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("model hidden=10 is not divisible by heads=4"), std::string::npos) << msg;
    EXPECT_NE(msg.find("model heads=4 is not a multiple of kv_heads=3"), std::string::npos) << msg;
  }
  spec = {.layers = 0, .hidden = 8, .heads = 2, .seq = 4, .vocab = 5};
  EXPECT_THROW(Decoder{spec}, ConfigError);
}

TEST(Gpt, TwoPipelineStagesComposeToTheWholeModel) {
  for (bool tied : {true, false}) {
    const ModelSpec spec = tiny(tied, 2);
    DecoderT<double> whole(spec, {.seed = 3, .batch = 2});
    DecoderT<double> first(spec, {.seed = 3, .batch = 2}, UnitRange::blocks(0, 1, 2));
    DecoderT<double> last(spec, {.seed = 3, .batch = 2}, UnitRange::blocks(1, 2, 2));
    EXPECT_TRUE(first.has_embedding() && !first.has_head());
    EXPECT_TRUE(!last.has_embedding() && last.has_head());
    Rng rng(8);
    auto tokens = random_tokens(10, 7, rng), targets = random_tokens(10, 7, rng);
    whole.params().zero_grad();
    const double loss = whole.forward(tokens.data(), targets.data());
    whole.backward();

    auto a0 = first.make_activations();
    auto a1 = last.make_activations();
    first.params().zero_grad();
    last.params().zero_grad();
    EXPECT_TRUE(std::isnan(first.forward(*a0, tokens.data(), nullptr, nullptr)));
    EXPECT_EQ(last.forward(*a1, nullptr, first.output(*a0), targets.data()), loss);
    last.backward(*a1, nullptr);
    first.backward(*a0, last.input_grad().data());

    // Every parameter of the whole model is in exactly one stage, with the same initial
    // value and gradient; the tied token table is in both, and its two gradients add up.
    for (const auto& v : whole.params().views()) {
      const int i0 = first.params().find(v.name), i1 = last.params().find(v.name);
      ASSERT_TRUE(i0 >= 0 || i1 >= 0) << v.name;
      for (std::int64_t k = 0; k < v.numel; ++k) {
        double g = 0;
        if (i0 >= 0) {
          EXPECT_EQ(first.params().param(i0)[k], whole.params().params()[v.offset + k]) << v.name;
          g += first.params().grad(i0)[k];
        }
        if (i1 >= 0) {
          EXPECT_EQ(last.params().param(i1)[k], whole.params().params()[v.offset + k]) << v.name;
          g += last.params().grad(i1)[k];
        }
        EXPECT_NEAR(g, whole.params().grads()[v.offset + k], 1e-14) << v.name << "[" << k << "]";
      }
    }
    EXPECT_EQ(first.params().find("embed.tokens") >= 0 && last.params().find("embed.tokens") >= 0, tied);
  }
}

TEST(Gpt, MicroBatchesInFlightKeepSeparateActivations) {
  const ModelSpec spec = tiny(true, 2);
  DecoderT<double> gpt(spec, {.seed = 2, .batch = 2});
  Rng rng(12);
  auto t1 = random_tokens(10, 7, rng), y1 = random_tokens(10, 7, rng);
  auto t2 = random_tokens(10, 7, rng), y2 = random_tokens(10, 7, rng);
  // One after the other.
  gpt.params().zero_grad();
  const double l1 = gpt.forward(t1.data(), y1.data());
  gpt.backward();
  const double l2 = gpt.forward(t2.data(), y2.data());
  gpt.backward();
  std::vector<double> expected(gpt.params().grads().begin(), gpt.params().grads().end());
  // Both forwards first, backwards in reverse order (as a pipeline schedule might).
  auto a = gpt.make_activations(), b = gpt.make_activations();
  gpt.params().zero_grad();
  EXPECT_EQ(gpt.forward(*a, t1.data(), nullptr, y1.data()), l1);
  EXPECT_EQ(gpt.forward(*b, t2.data(), nullptr, y2.data()), l2);
  gpt.backward(*b, nullptr);
  gpt.backward(*a, nullptr);
  for (std::size_t i = 0; i < expected.size(); ++i)
    EXPECT_NEAR(gpt.params().grads()[i], expected[i], 1e-14) << i;
}

// Recompute: the same loss and gradients bit for bit in every mode, for the whole model and
// for a two-stage split with two micro-batches in flight; each mode keeps fewer bytes per
// micro-batch than the one before, and full keeps only each block's output.
// One recompute enum and one parser for the model, the runtime and the planner.
static_assert(std::is_same_v<nn::Recompute, plan::Recompute>);
TEST(Recompute, OneParserNamesTheFlagTheValueAndTheModes) {
  for (Recompute r : {Recompute::kNone, Recompute::kSelective, Recompute::kFull})
    EXPECT_EQ(parse_recompute(recompute_name(r)), r);
  try {
    parse_recompute("partial", "--recompute");
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(
        std::string(e.what()).find("--recompute=partial is not a recompute mode (none, selective, full)"),
        std::string::npos)
        << e.what();
  }
}

TEST(Gpt, RecomputeModesGiveTheSameGradientsBitForBit) {
  const ModelSpec spec = tiny(true, 2);
  Rng rng(21);
  auto t1 = random_tokens(10, 7, rng), y1 = random_tokens(10, 7, rng);
  auto t2 = random_tokens(10, 7, rng), y2 = random_tokens(10, 7, rng);
  std::vector<double> expected, expected_stages;
  double expected_loss = 0;
  std::int64_t previous_bytes = 0;
  for (nn::Recompute mode : {nn::Recompute::kNone, nn::Recompute::kSelective, nn::Recompute::kFull}) {
    SCOPED_TRACE(recompute_name(mode));
    DecoderT<double> gpt(with_init(spec, 0.5), {.seed = 3, .batch = 2, .recompute = mode});
    gpt.params().zero_grad();
    const double loss = gpt.forward(t1.data(), y1.data());
    gpt.backward();
    std::vector<double> grads(gpt.params().grads().begin(), gpt.params().grads().end());
    // Two stages, both micro-batches forward first, backwards in reverse order.
    DecoderT<double> first(with_init(spec, 0.5), {.seed = 3, .batch = 2, .recompute = mode},
                           UnitRange::blocks(0, 1, 2));
    DecoderT<double> last(with_init(spec, 0.5), {.seed = 3, .batch = 2, .recompute = mode},
                          UnitRange::blocks(1, 2, 2));
    auto a0 = first.make_activations(), b0 = first.make_activations();
    auto a1 = last.make_activations(), b1 = last.make_activations();
    first.params().zero_grad();
    last.params().zero_grad();
    first.forward(*a0, t1.data(), nullptr, nullptr);
    const double loss_a = last.forward(*a1, nullptr, first.output(*a0), y1.data());
    first.forward(*b0, t2.data(), nullptr, nullptr);
    last.forward(*b1, nullptr, first.output(*b0), y2.data());
    last.backward(*b1, nullptr);
    first.backward(*b0, last.input_grad().data());
    last.backward(*a1, nullptr);
    first.backward(*a0, last.input_grad().data());
    std::vector<double> stages(first.params().grads().begin(), first.params().grads().end());
    stages.insert(stages.end(), last.params().grads().begin(), last.params().grads().end());
    const std::int64_t bytes = gpt.make_activations()->bytes();
    if (mode == nn::Recompute::kNone) {
      expected = grads, expected_stages = stages, expected_loss = loss;
      EXPECT_EQ(loss_a, loss);
      EXPECT_EQ(gpt.recompute_workspace_bytes(), 0);
    } else {
      EXPECT_EQ(loss, expected_loss);
      EXPECT_EQ(loss_a, expected_loss);
      ASSERT_EQ(grads.size(), expected.size());
      for (std::size_t i = 0; i < grads.size(); ++i) EXPECT_EQ(grads[i], expected[i]) << i;
      ASSERT_EQ(stages.size(), expected_stages.size());
      for (std::size_t i = 0; i < stages.size(); ++i) EXPECT_EQ(stages[i], expected_stages[i]) << i;
      EXPECT_LT(bytes, previous_bytes);
      EXPECT_GT(gpt.recompute_workspace_bytes(), 0);
    }
    if (mode == nn::Recompute::kFull) {
      const auto acts = gpt.make_activations();
      for (const auto& blk : dynamic_cast<const DecoderActivations<double>&>(*acts).blocks)
        EXPECT_EQ(blk.bytes(), blk.out.numel() * static_cast<std::int64_t>(sizeof(double)));
    }
    previous_bytes = bytes;
  }
}

TEST(Gpt, BadStageRangeIsAConfigError) {
  EXPECT_THROW((Decoder{tiny(true, 2), {}, UnitRange{2, 2}}), ConfigError);
  EXPECT_THROW((Decoder{tiny(true, 2), {}, UnitRange{0, 5}}), ConfigError);
  EXPECT_THROW((Decoder{tiny(true, 2), {}, UnitRange{3, 4}}), ConfigError);  // the head alone: no block
}

TEST(Gpt, MemoryEstimateCoversTheAllocation) {
  // The estimate counts parameters and gradients exactly (no padding) and every
  // activation buffer; compare with what the model holds.
  const ModelSpec spec{.layers = 2, .hidden = 32, .heads = 4, .kv_heads = 2, .seq = 16, .vocab = 50};
  Decoder gpt(spec, {.batch = 3});
  const double estimate = model_memory_elements(spec, 3, 16);
  const double params = static_cast<double>(gpt.params().parameter_count());
  const auto made = gpt.make_activations();
  const auto& acts = dynamic_cast<const DecoderActivations<float>&>(*made);
  double held = 0;
  for (const auto& b : acts.blocks)
    held +=
        static_cast<double>(b.ln1.numel() + b.qkv.numel() + b.lse.numel() + b.atty.numel() + b.res1.numel() +
                            b.ln2.numel() + b.mlp.pre.numel() + b.mlp.hidden.numel() + b.out.numel());
  held += static_cast<double>(acts.input.numel() + acts.lnf.numel() + acts.head.logits.numel());
  EXPECT_GT(estimate, 2 * params + held);
  EXPECT_LT(estimate, 1.6 * (2 * params + held));
}

TEST(Gpt, FlopsCountMatchesHandCount) {
  const ModelSpec spec{.layers = 1, .hidden = 4, .heads = 2, .kv_heads = 1, .ffn = 8, .seq = 3, .vocab = 5};
  Decoder gpt(spec, {.batch = 2});
  // N = 6 tokens, hd = 2. Forward: qkv 2*6*4*(2+2)*2 = 384, proj 2*6*4*4 = 192,
  // mlp 2*2*6*4*8 = 768, head 2*6*4*64 = 3072 (the vocabulary of 5 padded to 64: the padding's
  // logits are computed too), all three times for forward + backward.
  // Attention: seq 3 is one (masked) tile of 3x3 scores per (batch, head), 2*hd flops per
  // score and product, 7 products (2 forward, 5 backward): 7 * 2*2 * 9 * 2*2 = 1008.
  EXPECT_DOUBLE_EQ(gpt.flops_per_step(), 3.0 * (384 + 192 + 768 + 3072) + 1008);
  // Selective recompute runs the 2 attention products once more: 2 * 2*2 * 9 * 2*2 = 288;
  // full recompute the whole block forward once more: 384 + 192 + 768 + 288.
  Decoder selective(spec, {.batch = 2, .recompute = nn::Recompute::kSelective});
  EXPECT_DOUBLE_EQ(selective.flops_per_step(), 3.0 * (384 + 192 + 768 + 3072) + 1008 + 288);
  Decoder full(spec, {.batch = 2, .recompute = nn::Recompute::kFull});
  EXPECT_DOUBLE_EQ(full.flops_per_step(), 3.0 * (384 + 192 + 768 + 3072) + 1008 + 384 + 192 + 768 + 288);
}

TEST(Gpt, FlopsCountOnlyTheAttentionTilesComputed) {
  // seq 130 = tiles of 64, 64, 2 rows: the causal mask skips 3 of the 9 tile pairs, leaving
  // 3 * 64*64 + 2 * 2*64 + 2*2 = 12548 score elements per (batch, head) instead of 130^2.
  const ModelSpec spec{.layers = 1, .hidden = 4, .heads = 2, .kv_heads = 1, .ffn = 8, .seq = 130, .vocab = 5};
  Decoder gpt(spec, {.batch = 1});
  // Per token: qkv 2*4*(2+2)*2 = 64, proj 2*2*2*4 = 32, mlp 2*2*4*8 = 128, head 2*4*64 = 512
  // (the padded vocabulary).
  const double linear = 3.0 * 130 * (64 + 32 + 128 + 512);
  const double attention = 7.0 * 2 * 2 * 12548 * 1 * 2;  // 7 products, 2 hd, batch 1, 2 heads
  EXPECT_DOUBLE_EQ(gpt.flops_per_step(), linear + attention);
}

// The padded vocabulary changes no number of the model: its rows start and stay zero, its
// logits never enter the softmax, and the logical parameters (a [vocab, C] table) and their
// gradients equal those of the unpadded model, tied and untied.
TEST(Gpt, PaddedVocabularyIsTheSameModel) {
  for (bool tied : {true, false}) {
    ModelSpec spec = with_init(tiny(tied, 2), 0.5);
    spec.vocab_multiple = 64;  // 7 tokens, 64 rows
    ModelSpec plain = spec;
    plain.vocab_multiple = 1;
    DecoderT<double> padded(spec, {.seed = 3, .batch = 2}), unpadded(plain, {.seed = 3, .batch = 2});
    const int id = padded.params().find("embed.tokens");
    ASSERT_GE(id, 0);
    EXPECT_EQ(padded.params().view(id).shape, (std::vector<std::int64_t>{64, 8}));
    EXPECT_EQ(padded.params().view(id).full_numel(), 7 * 8);
    // The logical count is the same; the store holds the padding rows too (57 of 8 per table).
    auto logical = [](const ParamStore<double>& st) {
      std::int64_t n = 0;
      for (const auto& v : st.views()) n += v.full_numel();
      return n;
    };
    EXPECT_EQ(logical(padded.params()), logical(unpadded.params()));
    EXPECT_EQ(padded.params().parameter_count(),
              unpadded.params().parameter_count() + (tied ? 1 : 2) * 57 * 8);
    Rng rng(4);
    auto tokens = random_tokens(10, 7, rng), targets = random_tokens(10, 7, rng);
    padded.params().zero_grad();
    unpadded.params().zero_grad();
    const double a = padded.forward(tokens.data(), targets.data()),
                 b = unpadded.forward(tokens.data(), targets.data());
    EXPECT_NEAR(a, b, 1e-14 * b);
    padded.backward();
    unpadded.backward();
    for (const auto& v : unpadded.params().views()) {
      const ParamView& w = padded.params().view(padded.params().find(v.name));
      for (std::int64_t k = 0; k < v.numel; ++k) {
        EXPECT_EQ(padded.params().params()[w.offset + k], unpadded.params().params()[v.offset + k]) << v.name;
        EXPECT_NEAR(padded.params().grads()[w.offset + k], unpadded.params().grads()[v.offset + k], 1e-14)
            << v.name << "[" << k << "]";
      }
      for (std::int64_t k = v.numel; k < w.numel; ++k) {  // the padding rows
        EXPECT_EQ(padded.params().params()[w.offset + k], 0.0) << v.name;
        EXPECT_EQ(padded.params().grads()[w.offset + k], 0.0) << v.name;
      }
    }
  }
}

// Tensor-parallel layout problems name the flag, the value and the fix; a layout that
// divides everything has none.
TEST(GptTp, ProblemsNameTheFlagAndTheFix) {
  const ModelSpec spec{
      .layers = 2, .hidden = 32, .heads = 4, .kv_heads = 2, .ffn = 0, .seq = 16, .vocab = 16};
  EXPECT_TRUE(tp_problems(spec, 1, false, 16).empty());
  EXPECT_TRUE(tp_problems(spec, 2, true, 16).empty());
  auto p = tp_problems(spec, 4, false, 16);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_NE(p[0].find("--tp=4 does not divide --kv-heads=2"), std::string::npos) << p[0];
  p = tp_problems(spec, 3, true, 16);
  EXPECT_EQ(p.size(), 4u);  // heads, kv heads, ffn 128, and 16 token rows (the vocabulary is padded)
  p = tp_problems(spec, 2, true, 15);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_NE(p[0].find("--sequence-parallel"), std::string::npos) << p[0];
  // The model refuses them too, as a ConfigError, before any communication.
  struct FourRanks : nn::TpComm<double> {
    int size() const override { return 4; }
  };
  EXPECT_THROW(
      DecoderT<double>(spec, {.batch = 1}, {}, nn::TpContext<double>{.comm = std::make_shared<FourRanks>()}),
      ConfigError);
  EXPECT_NO_THROW(DecoderT<double>(spec, {.batch = 1}, {}, nn::TpContext<double>{}));
}

}  // namespace
}  // namespace ndmesh::model
