// The search: every layout it returns passes config validation and fits, they come fastest
// first, and when nothing fits it says what is closest.
#include <chrono>
#include <string>

#include <gtest/gtest.h>

#include "ndmesh/config/config.hpp"
#include "ndmesh/core/error.hpp"
#include "ndmesh/plan/search.hpp"
#include "support/error_of.hpp"

namespace ndmesh::plan {
namespace {

using testing_support::error_of;

void expect_all_valid_and_fitting(const PlanModel& model, const Hardware& hw, const SearchOptions& o,
                                  const SearchResult& r) {
  ModelSpec spec = model.spec;
  spec.seq = o.workload.seq;
  double previous = 0;
  for (const Estimate& e : r.layouts) {
    const Layout& l = e.layout;
    EXPECT_EQ(l.gpus(), o.gpus);
    const auto probs = problems(parallel_config(l, o.workload, hw.gpus_per_node), &spec);
    EXPECT_TRUE(probs.empty()) << "tp=" << l.tp << " pp=" << l.pp << ": " << (probs.empty() ? "" : probs[0]);
    // Re-estimate from scratch rather than trusting the stored numbers.
    const Estimate again = estimate(model, hw, l, o.workload, o.precision);
    EXPECT_LE(again.memory.total, hw.usable_bytes());
    EXPECT_DOUBLE_EQ(again.time.total, e.time.total);
    EXPECT_GE(e.time.total, previous);
    previous = e.time.total;
    EXPECT_GT(e.mfu, 0);
    EXPECT_LE(e.mfu, hw.achievable_fraction);
  }
}

TEST(Search, Llama3_70bOn512H100) {
  const PlanModel model = model_preset("llama3-70b");
  const Hardware hw = hardware_preset("h100");
  const SearchOptions o{.gpus = 512, .workload = {.seq = 8192, .global_batch = 1024}, .top = 20};
  const auto start = std::chrono::steady_clock::now();
  const SearchResult r = search(model, hw, o);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_EQ(r.layouts.size(), 20u);
  EXPECT_FALSE(r.smallest.has_value());
  EXPECT_GT(r.invalid, 0);  // e.g. tp = 128 does not divide the 64 heads
  EXPECT_GT(r.too_big, 0);  // e.g. tp = pp = 1: 70B parameters x 16 bytes
  EXPECT_EQ(r.considered, r.invalid + r.too_big + r.fitting);
  expect_all_valid_and_fitting(model, hw, o, r);
  // 70B does not fit in 80 GB without splitting the model over at least 2 GPUs.
  for (const Estimate& e : r.layouts)
    EXPECT_GT(e.layout.tp * e.layout.pp * (e.layout.zero == 3 ? e.layout.dp : 1), 1);
  std::printf("search of %lld layouts took %.3f s\n", static_cast<long long>(r.considered), seconds);
}

TEST(Search, SmallModelsAndOddCounts) {
  const Hardware hw = hardware_preset("a100-80gb");
  for (std::int64_t gpus : {1, 6, 12, 64}) {
    const PlanModel model = model_preset("gpt3-1.7b");
    const SearchOptions o{.gpus = gpus, .workload = {.seq = 2048, .global_batch = 96}};
    const SearchResult r = search(model, hw, o);
    EXPECT_FALSE(r.layouts.empty()) << gpus;
    expect_all_valid_and_fitting(model, hw, o, r);
  }
}

TEST(Search, NothingFitsSaysHowFarOff) {
  // A trillion parameters need 16 TB of model states; 8 GPUs hold 640 GB.
  const PlanModel model = model_preset("gpt3-1t");
  const Hardware hw = hardware_preset("a100-80gb");
  const SearchOptions o{.gpus = 8, .workload = {.seq = 2048, .global_batch = 64}};
  const SearchResult r = search(model, hw, o);
  EXPECT_TRUE(r.layouts.empty());
  ASSERT_TRUE(r.smallest.has_value());
  EXPECT_GT(r.smallest->memory.total, hw.usable_bytes());
  // At least 16 bytes x 1e12 / 8 GPUs = 2 TB per GPU.
  EXPECT_GT(r.smallest->memory.total, 16 * 1.0e12 / 8 * 0.99);
}

TEST(Search, NothingValidListsProblems) {
  // 7 GPUs, 24 heads and 6 layers: tp = 7 does not divide the heads, pp = 7 leaves a
  // stage without a block, cp = 7 does not divide the sequence, and the global batch 5 is
  // not divisible by dp = 7.
  PlanModel model = model_preset("gpt3-1.7b");
  model.spec.layers = 6;
  const SearchOptions o{.gpus = 7, .workload = {.seq = 2048, .global_batch = 5}};
  const SearchResult r = search(model, hardware_preset("h100"), o);
  EXPECT_TRUE(r.layouts.empty());
  EXPECT_EQ(r.fitting, 0);
  EXPECT_FALSE(r.sample_problems.empty());
}

TEST(Search, ConstraintsFixTheDims) {
  const PlanModel model = model_preset("llama3-70b");
  const Hardware hw = hardware_preset("h100");
  SearchOptions o{.gpus = 64, .workload = {.seq = 8192, .global_batch = 256}, .top = 1000};
  o.constraints.tp = {4, 8};
  o.constraints.pp = {4};
  o.constraints.max_zero = 1;
  o.constraints.schedules = {Schedule::k1F1B, Schedule::kInterleaved};
  o.constraints.recomputes = {Recompute::kNone, Recompute::kSelective};
  o.attention = Attention::kFlash;
  const SearchResult r = search(model, hw, o);
  ASSERT_FALSE(r.layouts.empty());
  bool saw_tp4 = false, saw_tp8 = false;
  for (const Estimate& e : r.layouts) {
    const Layout& l = e.layout;
    EXPECT_TRUE(l.tp == 4 || l.tp == 8) << l.tp;
    saw_tp4 |= l.tp == 4;
    saw_tp8 |= l.tp == 8;
    EXPECT_EQ(l.pp, 4);
    EXPECT_EQ(l.dp * l.cp, 64 / (4 * l.tp));
    EXPECT_LE(l.zero, 1);
    EXPECT_TRUE(l.schedule == Schedule::k1F1B || l.schedule == Schedule::kInterleaved);
    EXPECT_NE(l.recompute, Recompute::kFull);
    EXPECT_TRUE(l.sequence_parallel);
    EXPECT_EQ(l.attention, Attention::kFlash);
  }
  EXPECT_TRUE(saw_tp4 && saw_tp8);
  EXPECT_EQ(o.constraints.text(), "tp=4,8 pp=4 zero<=1 schedule=1f1b,interleaved recompute=none,selective");
  // Without sequence parallelism.
  o.constraints.tp = {8};
  o.constraints.sequence_parallel = false;
  const SearchResult no_sp = search(model, hw, o);
  ASSERT_FALSE(no_sp.layouts.empty());
  for (const Estimate& e : no_sp.layouts) EXPECT_FALSE(e.layout.sequence_parallel);
  EXPECT_EQ(o.constraints.text(),
            "tp=8 pp=4 zero<=1 schedule=1f1b,interleaved recompute=none,selective sequence_parallel=off");
  // Fixing every dim and option leaves exactly one layout per micro-batch size.
  SearchOptions one{.gpus = 64, .workload = {.seq = 8192, .global_batch = 256}, .top = 1000};
  one.constraints = {.tp = {8},
                     .cp = {1},
                     .pp = {4},
                     .dp = {2},
                     .vpp = {1},
                     .micro_batch = {1},
                     .max_zero = 1,
                     .schedules = {Schedule::k1F1B},
                     .recomputes = {Recompute::kSelective}};
  const SearchResult r1 = search(model, hw, one);
  EXPECT_EQ(r1.considered, 2);  // ZeRO 0 and 1
  ASSERT_FALSE(r1.layouts.empty());
  EXPECT_EQ(r1.layouts.front().layout.dp, 2);
}

TEST(Search, ImpossibleConstraintsNameTheConflict) {
  const PlanModel model = model_preset("llama3-8b");  // 32 heads
  const Hardware hw = hardware_preset("h100");
  SearchOptions o{.gpus = 24, .workload = {.seq = 8192, .global_batch = 48}};
  o.constraints.tp = {3};
  std::string e = error_of([&] { search(model, hw, o); });
  EXPECT_NE(e.find("tp=3"), std::string::npos) << e;
  EXPECT_NE(e.find("heads=32"), std::string::npos) << e;
  // tp 8 x pp 4 = 32 does not divide 24 GPUs.
  o.constraints = {.tp = {8}, .pp = {4}};
  e = error_of([&] { search(model, hw, o); });
  EXPECT_NE(e.find("leave no layout"), std::string::npos) << e;
  EXPECT_NE(e.find("tp=8 pp=4"), std::string::npos) << e;
  // vpp 2 without the interleaved schedule.
  o.constraints = {.vpp = {2}, .schedules = {Schedule::k1F1B}};
  e = error_of([&] { search(model, hw, o); });
  EXPECT_NE(e.find("vpp=2"), std::string::npos) << e;
}

TEST(Search, BadOptionsAreConfigErrors) {
  const PlanModel model = model_preset("gpt3-1.7b");
  const Hardware hw = hardware_preset("h100");
  SearchOptions no_gpus{.gpus = 0, .workload = {.seq = 2048, .global_batch = 8}};
  EXPECT_THROW(search(model, hw, no_gpus), ConfigError);
  SearchOptions no_seq{.gpus = 8, .workload = {.seq = 0, .global_batch = 8}};
  EXPECT_THROW(search(model, hw, no_seq), ConfigError);
  SearchOptions no_top{.gpus = 8, .workload = {.seq = 2048, .global_batch = 8}, .top = 0};
  EXPECT_THROW(search(model, hw, no_top), ConfigError);
}

}  // namespace
}  // namespace ndmesh::plan
