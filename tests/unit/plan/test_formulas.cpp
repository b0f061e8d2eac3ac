// The planner's closed forms against the numbers published in their sources. Expected
// values are typed in from the papers or worked out by hand in the comments, never taken
// from the code under test.
#include <cmath>

#include <gtest/gtest.h>

#include "ndmesh/core/error.hpp"
#include "ndmesh/plan/estimate.hpp"
#include "ndmesh/plan/formulas.hpp"
#include "ndmesh/plan/presets.hpp"

namespace ndmesh::plan {
namespace {

// Narayanan et al. 2021, Table 1: the parameter count (billions) of each GPT model as
// printed, to one decimal.
struct Table1Row {
  const char* name;
  double billions;
};
constexpr Table1Row kTable1[] = {
    {"gpt3-1.7b", 1.7}, {"gpt3-3.6b", 3.6},   {"gpt3-7.5b", 7.5},   {"gpt3-18b", 18.4},   {"gpt3-39b", 39.1},
    {"gpt3-76b", 76.1}, {"gpt3-145b", 145.6}, {"gpt3-310b", 310.1}, {"gpt3-530b", 529.6}, {"gpt3-1t", 1008.0},
};

TEST(Parameters, ReproduceMegatronTable1) {
  for (const auto& row : kTable1) {
    const double count = count_parameters(model_preset(row.name)).total();
    const double table = row.billions * 1e9;
    // Within 1%, or within the table's own rounding to 0.05B where that is coarser (1.7B is
    // 1.652B, 3.6B is 3.562B: both print to those values but sit 2.8% / 1.1% below them).
    const double tolerance = std::max(0.01 * table, 0.05e9);
    EXPECT_NEAR(count, table, tolerance) << row.name;
  }
}

TEST(Parameters, MatchNarayananClosedForm) {
  // P = 12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h)), which leaves out the final LayerNorm
  // (2h parameters): the count must agree to within those.
  for (const auto& row : kTable1) {
    const PlanModel m = model_preset(row.name);
    const double l = m.spec.layers, h = m.spec.hidden, v = 51200, s = 2048;
    const double closed = 12 * l * h * h * (1 + 13 / (12 * h) + (v + s) / (12 * l * h));
    EXPECT_NEAR(count_parameters(m).total(), closed, 2 * h + 1) << row.name;
  }
}

TEST(Parameters, Gpt3_175b) {
  // 12*96*12288^2 + 13*12288*96 + (51200 + 2048)*12288 + 2*12288 (final LayerNorm)
  // = 173,946,175,488 + 15,335,424 + 654,311,424 + 24,576 = 174,615,846,912; the paper
  // says 175B.
  const double count = count_parameters(model_preset("gpt3-175b")).total();
  EXPECT_DOUBLE_EQ(count, 174615846912.0);
  EXPECT_NEAR(count, 175e9, 0.01 * 175e9);
}

TEST(Parameters, LlamaCountsMatchPublishedSizes) {
  // Published sizes: Llama 2 7B 6.74B (6,738,415,616 in the released checkpoint), Llama 3
  // 8B 8.03B, 70B 70.6B, 405B 405.8B (the released checkpoints' counts below, also worked
  // out by hand: e.g. Llama 3 8B per layer 2*4096^2 + 2*4096*1024 + 3*4096*14336 + 2*4096
  // = 218,112,000; x32 + 2*128256*4096 + 4096 = 8,030,261,248).
  EXPECT_DOUBLE_EQ(count_parameters(model_preset("llama2-7b")).total(), 6738415616.0);
  EXPECT_DOUBLE_EQ(count_parameters(model_preset("llama3-8b")).total(), 8030261248.0);
  EXPECT_DOUBLE_EQ(count_parameters(model_preset("llama3-70b")).total(), 70553706496.0);
  EXPECT_DOUBLE_EQ(count_parameters(model_preset("llama3-405b")).total(), 405853388800.0);
  EXPECT_NEAR(count_parameters(model_preset("llama2-13b")).total(), 13.0e9, 0.01 * 13.0e9);
  EXPECT_NEAR(count_parameters(model_preset("llama2-70b")).total(), 69.0e9, 0.01 * 69.0e9);
}

TEST(Parameters, TensorParallelSplit) {
  // GPT layer on one of t ranks: 12h^2/t matrices, column-parallel biases (3h + 4h)/t,
  // row-parallel biases 2h and two LayerNorms 4h replicated.
  const PlanModel m = model_preset("gpt3-175b");
  const double h = 12288, t = 8;
  EXPECT_DOUBLE_EQ(layer_parameters_per_rank(m, 8), 12 * h * h / t + 7 * h / t + 6 * h);
  EXPECT_DOUBLE_EQ(layer_parameters_per_rank(m, 1), count_parameters(m).per_layer);
  // Llama 3 70B with tp 16 > 8 kv heads: each rank keeps one kv head of 128 channels.
  const PlanModel l = model_preset("llama3-70b");
  const double h2 = 8192;
  EXPECT_DOUBLE_EQ(layer_parameters_per_rank(l, 16),
                   2 * h2 * h2 / 16 + 2 * h2 * 128 + 3 * h2 * 28672 / 16 + 2 * h2);
}

// Korthikanti et al. 2022 for GPT-3 175B: s = 2048, h = 12288, a = 96, micro-batch 1,
// t = 8. sbh = 25,165,824; 5as/h = 5*96*2048/12288 = 80.
constexpr double kSbh = 2048.0 * 12288.0;

double layer(Recompute r, std::int64_t tp, bool sp) {
  return activation_bytes_per_layer(model_preset("gpt3-175b"), 2048, 1,
                                    {.tp = tp, .sequence_parallel = sp, .recompute = r});
}

TEST(Activations, KorthikantiNoParallelism) {
  // sbh(34 + 5as/h) = 114 sbh
  EXPECT_DOUBLE_EQ(layer(Recompute::kNone, 1, false), 2868903936.0);
  EXPECT_DOUBLE_EQ(layer(Recompute::kNone, 1, false), kSbh * 114);
}

TEST(Activations, KorthikantiTensorParallel) {
  // sbh(10 + 24/t + 5as/(ht)) = sbh(10 + 3 + 10) = 23 sbh = 578,813,952
  EXPECT_DOUBLE_EQ(layer(Recompute::kNone, 8, false), 578813952.0);
}

TEST(Activations, KorthikantiSequenceParallel) {
  // sbh/t (34 + 5as/h) = sbh/8 * 114 = 358,612,992
  EXPECT_DOUBLE_EQ(layer(Recompute::kNone, 8, true), 358612992.0);
}

TEST(Activations, KorthikantiSelectiveRecompute) {
  // TP only: sbh(10 + 24/t) = 13 sbh = 327,155,712; TP + SP: 34 sbh/t = 106,954,752
  EXPECT_DOUBLE_EQ(layer(Recompute::kSelective, 8, false), 327155712.0);
  EXPECT_DOUBLE_EQ(layer(Recompute::kSelective, 8, true), 106954752.0);
}

TEST(Activations, KorthikantiFullRecompute) {
  // 2sbh per layer input; with SP 2sbh/t.
  EXPECT_DOUBLE_EQ(layer(Recompute::kFull, 8, false), 50331648.0);
  EXPECT_DOUBLE_EQ(layer(Recompute::kFull, 8, true), 6291456.0);
}

TEST(Activations, FirstStageOf175bWithPipeline) {
  // pp = 8, 1F1B: the first stage keeps p = 8 micro-batches of L/p = 12 layers, i.e. the
  // activations of all 96 layers (Korthikanti section 4.2.3), plus the embedding dropout
  // mask sbh*p/t (sbh*p without SP).
  const PlanModel m = model_preset("gpt3-175b");
  const Workload w{.seq = 2048, .global_batch = 64};
  Layout l{.tp = 8,
           .cp = 1,
           .pp = 8,
           .dp = 1,
           .micro_batch = 1,
           .schedule = Schedule::k1F1B,
           .recompute = Recompute::kSelective,
           .sequence_parallel = true};
  MemoryBreakdown mem = estimate_memory(m, l, w);
  EXPECT_EQ(mem.stage, 0);
  // 96 * 34 sbh/8 + sbh*8/8 = 96 * 106,954,752 + 25,165,824
  EXPECT_DOUBLE_EQ(mem.activations, 10292822016.0);
  l.recompute = Recompute::kNone;
  l.sequence_parallel = false;
  mem = estimate_memory(m, l, w);
  // 96 * 23 sbh + 8 sbh = 55,566,139,392 + 201,326,592
  EXPECT_DOUBLE_EQ(mem.activations, 55767465984.0);
}

// Flash attention (Dao et al. 2022): Korthikanti's 5as/h term is gone and 4 a s b / t
// bytes of fp32 log-sum-exp are kept. GPT-3 175B, s = 2048, b = 1, a = 96:
// 4 a s b = 786,432 bytes per layer.
double flash_layer(Recompute r, std::int64_t tp, bool sp) {
  return activation_bytes_per_layer(
      model_preset("gpt3-175b"), 2048, 1,
      {.tp = tp, .sequence_parallel = sp, .recompute = r, .attention = Attention::kFlash});
}

TEST(Activations, FlashDropsTheScoreTerm) {
  // No parallelism: 34 sbh + 4as = 855,638,016 + 786,432
  EXPECT_DOUBLE_EQ(flash_layer(Recompute::kNone, 1, false), 34 * kSbh + 786432.0);
  EXPECT_DOUBLE_EQ(flash_layer(Recompute::kNone, 1, false), 856424448.0);
  // TP 8: sbh(10 + 24/8) + 4as/8 = 327,155,712 + 98,304
  EXPECT_DOUBLE_EQ(flash_layer(Recompute::kNone, 8, false), 327254016.0);
  // TP 8 + SP: 34 sbh/8 + 4as/8 = 106,954,752 + 98,304
  EXPECT_DOUBLE_EQ(flash_layer(Recompute::kNone, 8, true), 107053056.0);
  // Selective recompute under flash attention drops the attention output (2sbh/8 bytes =
  // 6,291,456) and the log-sum-exp (98,304): 107,053,056 - 6,389,760.
  EXPECT_DOUBLE_EQ(flash_layer(Recompute::kSelective, 8, true), 100663296.0);
  EXPECT_DOUBLE_EQ(flash_layer(Recompute::kSelective, 8, true), 32 * kSbh / 8);
  // Full recompute keeps the layer input only, whatever the attention: 2sbh/8.
  EXPECT_DOUBLE_EQ(flash_layer(Recompute::kFull, 8, true), 6291456.0);
}

// ndmesh's bf16 keeps the attention output (the output projection's input, s b h / t
// elements) in bf16 among fp32 activations: 2 bytes an element fewer. Selective recompute
// drops it whatever its type.
TEST(Activations, ABf16AttentionOutputIsCountedAtItsOwnBytes) {
  const PlanModel m = model_preset("gpt3-175b");
  for (const std::int64_t tp : {1, 8}) {
    const ActivationOptions fp32{.tp = tp, .activation_bytes = 4, .attention = Attention::kFlash};
    ActivationOptions bf16 = fp32;
    bf16.attention_output_bytes = 2;
    EXPECT_DOUBLE_EQ(activation_bytes_per_layer(m, 2048, 1, fp32) - activation_bytes_per_layer(m, 2048, 1, bf16),
                     2 * kSbh / static_cast<double>(tp));
    ActivationOptions fp32_selective = fp32, bf16_selective = bf16;
    fp32_selective.recompute = bf16_selective.recompute = Recompute::kSelective;
    EXPECT_DOUBLE_EQ(activation_bytes_per_layer(m, 2048, 1, fp32_selective),
                     activation_bytes_per_layer(m, 2048, 1, bf16_selective));
  }
}

// And its input, Q, K and V (3 s b h / t elements for gpt3's multi-head attention; K and V
// scale with kv_heads / heads): 2 bytes an element fewer, kept under selective recompute too
// (the recomputed attention core reads them).
TEST(Activations, ABf16AttentionInputIsCountedAtItsOwnBytes) {
  const PlanModel m = model_preset("gpt3-175b");
  for (const std::int64_t tp : {1, 8}) {
    for (const Recompute r : {Recompute::kNone, Recompute::kSelective}) {
      const ActivationOptions fp32{.tp = tp, .recompute = r, .activation_bytes = 4, .attention = Attention::kFlash};
      ActivationOptions bf16 = fp32;
      bf16.attention_input_bytes = 2;
      EXPECT_DOUBLE_EQ(activation_bytes_per_layer(m, 2048, 1, fp32) - activation_bytes_per_layer(m, 2048, 1, bf16),
                       2 * 3 * kSbh / static_cast<double>(tp));
    }
  }
  PlanModel gqa = m;
  gqa.spec.kv_heads = gqa.spec.heads / 4;  // K and V a quarter as wide
  const ActivationOptions fp32{.activation_bytes = 4, .attention = Attention::kFlash};
  ActivationOptions bf16 = fp32;
  bf16.attention_input_bytes = 2;
  EXPECT_DOUBLE_EQ(activation_bytes_per_layer(gqa, 2048, 1, fp32) - activation_bytes_per_layer(gqa, 2048, 1, bf16),
                   2 * 1.5 * kSbh);
}

// And the MLP's pre-activation (fc's output, s b f / t elements; f = 4h for gpt3): 2 bytes an
// element fewer.
TEST(Activations, ABf16MlpPreActivationIsCountedAtItsOwnBytes) {
  const PlanModel m = model_preset("gpt3-175b");
  for (const std::int64_t tp : {1, 8}) {
    const ActivationOptions fp32{.tp = tp, .activation_bytes = 4, .attention = Attention::kFlash};
    ActivationOptions bf16 = fp32;
    bf16.mlp_pre_activation_bytes = 2;
    EXPECT_DOUBLE_EQ(
        activation_bytes_per_layer(m, 2048, 1, fp32) - activation_bytes_per_layer(m, 2048, 1, bf16),
        2 * 4 * kSbh / static_cast<double>(tp));
  }
}

// And the two norms' outputs (the qkv and MLP inputs, s b h elements each): 2 bytes an element
// fewer, with sequence parallelism too (kept on 1/t of the rows and gathered in bf16).
TEST(Activations, ABf16NormOutputIsCountedAtItsOwnBytes) {
  const PlanModel m = model_preset("gpt3-175b");
  for (const std::int64_t tp : {1, 8}) {
    for (const bool sp : {false, true}) {
      const ActivationOptions fp32{
          .tp = tp, .sequence_parallel = sp, .activation_bytes = 4, .attention = Attention::kFlash};
      ActivationOptions bf16 = fp32;
      bf16.norm_output_bytes = 2;
      EXPECT_DOUBLE_EQ(activation_bytes_per_layer(m, 2048, 1, fp32) - activation_bytes_per_layer(m, 2048, 1, bf16),
                       2 * 2 * kSbh / static_cast<double>(sp ? tp : 1))
          << "tp " << tp << (sp ? " with" : " without") << " sequence parallelism";
    }
  }
}

TEST(Flops, FlashRecomputesTheScores) {
  // Flash attention's backward recomputes Q K^T: 2 b s^2 h per layer, B = 1536.
  const PlanModel m = model_preset("gpt3-175b");
  const double b = 1536, s = 2048, l = 96, h = 12288, v = 51200;
  EXPECT_DOUBLE_EQ(recompute_flops_per_step(m, s, b, Recompute::kNone, Attention::kFlash),
                   2 * b * s * s * h * l);
  // Selective adds the attention core forward that rebuilds the dropped output: 4 b s^2 h.
  EXPECT_DOUBLE_EQ(recompute_flops_per_step(m, s, b, Recompute::kSelective, Attention::kFlash),
                   6 * b * s * s * h * l);
  // Full recompute: Narayanan's 96 (one more forward) plus the flash backward's Q K^T.
  const double full = 96 * b * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h));
  EXPECT_NEAR(
      model_flops_per_step(m, s, b) + recompute_flops_per_step(m, s, b, Recompute::kFull, Attention::kFlash),
      full + 2 * b * s * s * h * l, 1e-12 * full);
  // Standard attention without recompute recomputes nothing.
  EXPECT_EQ(recompute_flops_per_step(m, s, b, Recompute::kNone, Attention::kStandard), 0.0);
}

TEST(Attention, ParseNamesAndErrors) {
  EXPECT_EQ(parse_attention("flash"), Attention::kFlash);
  EXPECT_EQ(parse_attention("standard"), Attention::kStandard);
  try {
    parse_attention("sparse");
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--attention 'sparse'"), std::string::npos) << e.what();
  }
}

TEST(Pipeline, UnevenStagesUseTheBalancedPartition) {
  // GPT-3 1.7B has 24 layers; pp = 5 gives chunks 5,5,5,5,4 (balanced_partition), so the
  // heaviest rank holds 5 blocks (not 24/5 = 4.8) and the first stage, with the most
  // micro-batches in flight (5 under 1F1B), is the worst: 5 layers x 5 in flight.
  const PlanModel m = model_preset("gpt3-1.7b");
  const Workload w{.seq = 2048, .global_batch = 10};
  const Layout l{.tp = 1, .cp = 1, .pp = 5, .dp = 1, .recompute = Recompute::kSelective};
  const MemoryBreakdown mem = estimate_memory(m, l, w);
  EXPECT_EQ(mem.stage, 0);
  EXPECT_EQ(mem.layers_on_stage, 5);
  EXPECT_EQ(mem.in_flight, 5);
  // An explicit partition 4,5,5,5,5 moves a block off the first stage.
  Layout explicit_split = l;
  explicit_split.stage_layers = {4, 5, 5, 5, 5};
  EXPECT_EQ(estimate_memory(m, explicit_split, w).layers_on_stage, 4);
  // Time: the slowest rank is the last (4 blocks + the logits, more than 5 blocks: the
  // logits 2hV = 236M FLOPs per token outweigh a block's 24h^2 + 4sh = 146M); per block
  // 3 B s (2 x 12h^2 + 4sh) FLOPs with h = 2304, plus 3 B s 2hV logits, at 312 x 0.6 TFLOP/s,
  // and per micro-batch (10 of them) 18 kernels per block (12 weight products, 6 attention)
  // and 3 for the logits, each with the per-kernel overhead.
  const Hardware hw = hardware_preset("a100-80gb");
  const double b = 10, s = 2048, h = 2304, v = 51200;
  const double block = 3 * b * s * (2 * 12 * h * h + 4 * s * h);
  const double logits = 3 * b * s * 2 * h * v;
  const Estimate e = estimate(m, hw, l, w);
  EXPECT_NEAR(e.time.compute, (4 * block + logits) / (312e12 * 0.6) + 10 * (4 * 18 + 3) * hw.gemm_overhead,
              1e-9);
  EXPECT_EQ(e.time.layers_on_stage, 4);
}

TEST(Activations, ContextParallelDividesTheSequence) {
  // cp = 2 is the same as half the sequence.
  const PlanModel m = model_preset("llama3-8b");
  const Workload w{.seq = 8192, .global_batch = 8};
  const Layout cp2{.tp = 1, .cp = 2, .pp = 1, .dp = 1};
  const Workload half{.seq = 4096, .global_batch = 8};
  const Layout cp1{.tp = 1, .cp = 1, .pp = 1, .dp = 1};
  EXPECT_DOUBLE_EQ(estimate_memory(m, cp2, w).activations, estimate_memory(m, cp1, half).activations);
}

TEST(ModelStates, ZeroStages) {
  // Rajbhandari et al.: 16P, 4P + 12P/dp, 2P + 14P/dp, 16P/dp. P = 1e9, dp = 8.
  const double p = 1e9;
  EXPECT_DOUBLE_EQ(model_state_bytes(p, 0, 8).total(), 16e9);
  EXPECT_DOUBLE_EQ(model_state_bytes(p, 1, 8).total(), 4e9 + 12e9 / 8);
  EXPECT_DOUBLE_EQ(model_state_bytes(p, 2, 8).total(), 2e9 + 14e9 / 8);
  EXPECT_DOUBLE_EQ(model_state_bytes(p, 3, 8).total(), 16e9 / 8);
  const ModelStates z2 = model_state_bytes(p, 2, 8);
  EXPECT_DOUBLE_EQ(z2.params, 2e9);
  EXPECT_DOUBLE_EQ(z2.grads, 2e9 / 8);
  EXPECT_DOUBLE_EQ(z2.optimizer, 12e9 / 8);
  // fp32 AdamW: 4 + 4 + 8 bytes per parameter.
  EXPECT_DOUBLE_EQ(
      model_state_bytes(p, 0, 1, {.param_bytes = 4, .grad_bytes = 4, .optimizer_bytes = 8}).total(), 16e9);
  // ndmesh's bf16: fp32's and a bf16 copy of the weights (2 B) beside them, not under ZeRO-3
  // (whose gathered parameters are cast where they are used).
  const Precision bf16 = parse_precision("bf16");
  EXPECT_DOUBLE_EQ(model_state_bytes(p, 0, 8, bf16).params, 6e9);
  EXPECT_DOUBLE_EQ(model_state_bytes(p, 2, 8, bf16).params, 6e9);
  EXPECT_DOUBLE_EQ(model_state_bytes(p, 3, 8, bf16).params, 4e9 / 8);
  EXPECT_DOUBLE_EQ(model_state_bytes(p, 0, 1, bf16).total(), 18e9);
}

TEST(ModelStates, Zero3KeepsTwoGatheredLayersAndTwoLayersOfGradients) {
  // gpt3-1.7b: P = 12*24*2304^2 + 13*2304*24 + 53248*2304 + 2*2304 = 1,652,230,656 and one
  // layer 12*2304^2 + 13*2304 = 63,730,944. ZeRO-3 over dp = 8: 2P/8 + 2 layers x 2 bytes
  // (the one in use and the one prefetched) less the own 1/8 of them (in the shard already);
  // gradients: 2P/8 + two layers' full gradients (one written, one being reduce-scattered)
  // + the tied token table's (vocab 51200 x 2304; P's 53248 rows add the 2048 positions): the
  // head writes it first, it is reduced last.
  const Layout l{.dp = 8, .zero = 3};
  const MemoryBreakdown mem = estimate_memory(model_preset("gpt3-1.7b"), l, {.seq = 2048, .global_batch = 8});
  EXPECT_DOUBLE_EQ(mem.params, 2 * 1652230656.0 / 8 + 2 * 2 * 63730944.0 * 7 / 8);
  EXPECT_DOUBLE_EQ(mem.grads, 2 * 1652230656.0 / 8 + 2 * 2 * 63730944.0 + 2 * 51200.0 * 2304);
  EXPECT_DOUBLE_EQ(mem.optimizer, 12 * 1652230656.0 / 8);
  // Sharded over the gradient group dp x cp; a deeper prefetch holds one more layer.
  const MemoryBreakdown cp2 = estimate_memory(model_preset("gpt3-1.7b"), {.cp = 2, .dp = 4, .zero = 3},
                                              {.seq = 2048, .global_batch = 8});
  EXPECT_DOUBLE_EQ(cp2.optimizer, mem.optimizer);
  Layout deep = l;
  deep.zero3_prefetch = 2;
  const MemoryBreakdown d2 =
      estimate_memory(model_preset("gpt3-1.7b"), deep, {.seq = 2048, .global_batch = 8});
  EXPECT_DOUBLE_EQ(d2.params, mem.params + 2 * 63730944.0 * 7 / 8);
}

TEST(ModelStates, OffloadMovesTheOptimizerStateToDisk) {
  Layout l{.dp = 8, .zero = 1};
  const Workload w{.seq = 2048, .global_batch = 8};
  const PlanModel model = model_preset("gpt3-1.7b");
  const MemoryBreakdown in_memory = estimate_memory(model, l, w);
  l.offload_optimizer = true;
  const MemoryBreakdown offloaded = estimate_memory(model, l, w);
  EXPECT_DOUBLE_EQ(offloaded.optimizer, 0.0);
  EXPECT_DOUBLE_EQ(offloaded.optimizer_offloaded, in_memory.optimizer);
  EXPECT_DOUBLE_EQ(offloaded.total, in_memory.total - in_memory.optimizer);
  // Time: 8 GPUs of a node share its disk; each reads and writes its state once per step.
  Hardware hw = hardware_preset("h100");
  hw.disk_read_bw = 4e9, hw.disk_write_bw = 2e9;
  const Estimate e = estimate(model, hw, l, w);
  EXPECT_DOUBLE_EQ(e.time.offload, 8 * in_memory.optimizer * (1 / 4e9 + 1 / 2e9));
  l.offload_optimizer = false;
  EXPECT_DOUBLE_EQ(e.time.total - estimate(model, hw, l, w).time.total, e.time.offload);
}

TEST(Bubble, ClosedForms) {
  // (p-1)/m, (p-1)/(v m), ZB-H1 a third of 1F1B.
  EXPECT_DOUBLE_EQ(bubble_fraction(Schedule::k1F1B, 8, 32, 1), 7.0 / 32);
  EXPECT_DOUBLE_EQ(bubble_fraction(Schedule::kGpipe, 8, 32, 1), 7.0 / 32);
  EXPECT_DOUBLE_EQ(bubble_fraction(Schedule::kInterleaved, 8, 32, 4), 7.0 / 128);
  EXPECT_DOUBLE_EQ(bubble_fraction(Schedule::kZbH1, 8, 32, 1), 7.0 / 96);
  EXPECT_DOUBLE_EQ(bubble_fraction(Schedule::k1F1B, 1, 32, 1), 0.0);
  EXPECT_DOUBLE_EQ(bubble_fraction(Schedule::k1F1B, 4, 4, 1), 3.0 / 4);
}

TEST(Bubble, MicrobatchesInFlight) {
  EXPECT_DOUBLE_EQ(microbatches_in_flight(Schedule::k1F1B, 8, 32, 1, 0), 8);
  EXPECT_DOUBLE_EQ(microbatches_in_flight(Schedule::k1F1B, 8, 32, 1, 7), 1);
  EXPECT_DOUBLE_EQ(microbatches_in_flight(Schedule::k1F1B, 8, 4, 1, 0), 4);
  EXPECT_DOUBLE_EQ(microbatches_in_flight(Schedule::kGpipe, 8, 32, 1, 0), 32);
  // 1 + (p-1)/(p v) = 1 + 7/16
  EXPECT_DOUBLE_EQ(microbatches_in_flight(Schedule::kInterleaved, 8, 32, 2, 0), 8 * (1 + 7.0 / 16));
}

TEST(Flops, NarayananFormula) {
  // 72 B s l h^2 (1 + s/(6h) + V/(12 l h)) for GPT-3 175B, B = 1536.
  const PlanModel m = model_preset("gpt3-175b");
  const double b = 1536, s = 2048, l = 96, h = 12288, v = 51200;
  const double expected = 72 * b * s * l * h * h * (1 + s / (6 * h) + v / (12 * l * h));
  EXPECT_NEAR(model_flops_per_step(m, s, b), expected, 1e-12 * expected);
  // With full recompute: 96 B s l h^2 (1 + s/(6h) + V/(16 l h)).
  const double full = 96 * b * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h));
  EXPECT_NEAR(model_flops_per_step(m, s, b) + recompute_flops_per_step(m, s, b, Recompute::kFull), full,
              1e-12 * full);
  // Selective: 4 b s^2 h per layer.
  EXPECT_DOUBLE_EQ(recompute_flops_per_step(m, s, b, Recompute::kSelective), 4 * b * s * s * h * l);
}

TEST(Time, SingleGpuIsComputeKernelsAndMemory) {
  // One GPU, standard attention, 8 micro-batches of one sequence: the FLOPs 72 B s l h^2 (1 +
  // s/(6h) + V/(12lh)) at peak x fraction, 18 kernels per layer (12 weight products, 6 for
  // the attention core) and 3 for the logits per micro-batch at the per-kernel overhead, and
  // the memory-bound work at the HBM bandwidth: (13e + 2) = 28 bytes per score (a s^2 per
  // layer), 20 bytes per fp32 logit (s V), (3e + 8) = 14 bytes per embedding element (s h).
  const PlanModel m = model_preset("gpt3-1.7b");
  Hardware hw = hardware_preset("a100-80gb");
  const Workload w{.seq = 2048, .global_batch = 8};
  const Estimate e = estimate(m, hw, Layout{}, w);
  const double b = 8, s = 2048, l = 24, h = 2304, v = 51200, a = 24;
  const double flops = 72 * b * s * l * h * h * (1 + s / (6 * h) + v / (12 * l * h));
  const double kernels = b * (l * 18 + 3) * hw.gemm_overhead;
  const double memory = b * (l * 28 * a * s * s + 20 * s * v + 14 * s * h) / 2039e9;
  EXPECT_NEAR(e.time.compute, flops / (312e12 * 0.6) + kernels, 1e-9);
  EXPECT_NEAR(e.time.memory, memory, 1e-9);
  EXPECT_NEAR(e.time.total, flops / (312e12 * 0.6) + kernels + memory, 1e-9);
  EXPECT_NEAR(e.mfu, flops / (e.time.total * 312e12), 1e-12);
  EXPECT_LT(e.mfu, 0.6);
  EXPECT_EQ(e.time.tp_comm, 0);
  EXPECT_EQ(e.time.bubble, 0);
  // Without the measured overheads and HBM bandwidth it is the FLOPs at the achievable rate.
  hw.gemm_overhead = 0;
  hw.memory_bw = 0;
  EXPECT_NEAR(estimate(m, hw, Layout{}, w).mfu, 0.6, 1e-9);
}

TEST(Time, TensorParallelTrafficUsesWhereTheGroupSits) {
  // tp = 2, b = 1, s = 2048, h = 2304, 24 layers, 8 micro-batches (global batch 8): 4 ring
  // all-reduces per layer and micro-batch of 2*s*h bytes, 2(t-1) = 2 steps of latency each
  // and ring factor 2(t-1)/t = 1.
  const PlanModel m = model_preset("gpt3-1.7b");
  Hardware hw = hardware_preset("a100-80gb");
  const Workload w{.seq = 2048, .global_batch = 8};
  const Layout l{.tp = 2, .sequence_parallel = true};
  const double calls = 8.0 * 24 * 4;
  const double bytes = calls * (2.0 * 2048 * 2304);
  Estimate e = estimate(m, hw, l, w);
  EXPECT_TRUE(e.where.tp_in_node);
  EXPECT_NEAR(e.time.tp_comm, bytes / 300e9 + calls * 2 * 5e-6, 1e-12);
  hw.gpus_per_node = 1;  // now the pair spans two nodes
  e = estimate(m, hw, l, w);
  EXPECT_FALSE(e.where.tp_in_node);
  EXPECT_NEAR(e.time.tp_comm, bytes / 25e9 + calls * 2 * 10e-6, 1e-12);
  // ndmesh's bf16 (fp32 activations, 4 B) gathers the norms' outputs in bf16: of each layer's
  // 4 x 4 s h bytes, the two forward all-gathers (half of an all-reduce each) move 2 s h, not
  // 4 s h: 14 s h bytes a layer and micro-batch, in as many steps.
  hw.gpus_per_node = 8;
  e = estimate(m, hw, l, w, parse_precision("bf16"));
  EXPECT_NEAR(e.time.tp_comm, 8.0 * 24 * 14 * 2048 * 2304 / 300e9 + calls * 2 * 5e-6, 1e-12);
}

TEST(Presets, UnknownNamesListTheValidOnes) {
  try {
    model_preset("llama3-7b");
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("'llama3-7b'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("llama3-8b"), std::string::npos) << msg;
  }
  EXPECT_THROW(hardware_preset("tpu"), ConfigError);
  EXPECT_THROW(parse_recompute("some"), ConfigError);
  EXPECT_THROW(parse_mlp_kind("relu"), ConfigError);
}

TEST(Presets, HardwareAndModelsAreValid) {
  for (const auto& hw : hardware_presets()) EXPECT_TRUE(hardware_problems(hw).empty()) << hw.name;
  for (const auto& p : model_presets()) {
    EXPECT_TRUE(model_problems(p.spec).empty()) << p.name;
    // Mixtures of experts too (test_moe.cpp checks their arithmetic).
    EXPECT_TRUE(plan_model_problems({p.spec, p.dropout}).empty()) << p.name;
  }
}

}  // namespace
}  // namespace ndmesh::plan
