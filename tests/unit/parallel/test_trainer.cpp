// The training runtime as one process (a layout of size 1 in every dim is the serial
// run): training to the entropy rate, determinism, exact resume from a checkpoint,
// mismatched checkpoints, the learning-rate schedule. Runs are a world of one (MPI
// singleton); multi-rank layouts are tested under mpirun in tests/mpi.
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <type_traits>
#include <vector>

#include <gtest/gtest.h>

#include "ndmesh/comm/communicator.hpp"
#include "ndmesh/comm/process_groups.hpp"
#include "ndmesh/core/error.hpp"
#include "ndmesh/model/data.hpp"
#include "ndmesh/model/checkpoint_dir.hpp"
#include "ndmesh/parallel/trainer.hpp"
#include "ndmesh/tensor/blas.hpp"

namespace ndmesh::parallel {
namespace {

namespace fs = std::filesystem;
using model::DataSource;
using model::MarkovOptions;
using model::MarkovSource;

ProcessGroups& serial_groups() {
  static ProcessGroups groups(Mesh({{"dp", 1}, {"pp", 1}, {"cp", 1}, {"tp", 1}}), comm::Communicator::world());
  return groups;
}

struct SerialRun : Trainer {
  SerialRun(TrainOptions o, std::unique_ptr<DataSource> d) : Trainer(std::move(o), std::move(d), serial_groups()) {}
};

TrainOptions small_run(std::int64_t steps) {
  return {.model = {.layers = 1, .hidden = 32, .heads = 2, .kv_heads = 1, .seq = 32, .vocab = 16},
          .batch = 8,
          .steps = steps,
          .lr = 1e-2,
          .warmup = 10,
          .seed = 1};
}

std::unique_ptr<DataSource> markov16() {
  return std::make_unique<MarkovSource>(MarkovOptions{.vocab = 16, .seed = 1, .sharpness = 2.5});
}

// The chunks' hooks point at the trainer's parts: a copy or a move would leave them dangling.
static_assert(!std::is_copy_constructible_v<Trainer> && !std::is_copy_assignable_v<Trainer> &&
                  !std::is_move_constructible_v<Trainer> && !std::is_move_assignable_v<Trainer>,
              "Trainer must be neither copyable nor movable");

TEST(Training, ReachesWithinTenPercentOfTheEntropyRate) {
  set_blas_threads(1);
  SerialRun t(small_run(150), markov16());
  const double entropy = *t.data().entropy_rate();
  const double start = t.evaluate(8);
  while (t.steps_done() < 150) t.step();
  const double end = t.evaluate(32);
  EXPECT_NEAR(start, std::log(16.0), 0.05);
  EXPECT_LT(end, 1.10 * entropy) << "entropy rate " << entropy;
  // A loss below the entropy rate on held-out data would mean a broken loss or data.
  EXPECT_GT(end, 0.97 * entropy);
}

std::vector<double> losses(Trainer& t, std::int64_t until) {
  std::vector<double> out;
  while (t.steps_done() < until) out.push_back(t.step().loss);
  return out;
}

TEST(Training, SameSeedAndThreadsGiveBitIdenticalLosses) {
  for (int threads : {1, 2}) {
    set_blas_threads(threads);
    SerialRun a(small_run(20), markov16()), b(small_run(20), markov16());
    auto la = losses(a, 20), lb = losses(b, 20);
    for (std::size_t i = 0; i < la.size(); ++i)
      EXPECT_EQ(la[i], lb[i]) << "step " << i + 1 << " threads " << threads;
    EXPECT_LT(la.back(), la.front());  // it does train
  }
  set_blas_threads(1);
  TrainOptions other = small_run(20);
  other.seed = 2;
  SerialRun a(small_run(20), markov16()), c(other, markov16());
  EXPECT_NE(losses(a, 1)[0], losses(c, 1)[0]);
}

struct TempFile {
  fs::path path = fs::temp_directory_path() / fmt::format("ndmesh_ckpt_{}_{}", ::getpid(), counter++);
  ~TempFile() { fs::remove_all(path); }
  static inline int counter = 0;
};

TEST(Checkpoint, SaveLoadContinueGivesTheUninterruptedLosses) {
  set_blas_threads(1);
  SerialRun whole(small_run(20), markov16());
  auto expected = losses(whole, 20);

  TempFile file;
  {
    SerialRun first(small_run(20), markov16());
    losses(first, 10);
    first.save(file.path.string());
  }
  // A checkpoint directory with its manifest, and no temporary directory left beside it.
  EXPECT_TRUE(model::is_checkpoint_dir(file.path.string()));
  EXPECT_FALSE(fs::exists(model::checkpoint_temp_dir(file.path.string())));
  TrainOptions resumed_options = small_run(20);
  resumed_options.seed = 99;  // the checkpoint, not the seed, decides the weights
  SerialRun resumed(resumed_options, markov16());
  resumed.load(file.path.string());
  EXPECT_EQ(resumed.steps_done(), 10);
  auto rest = losses(resumed, 20);
  ASSERT_EQ(rest.size(), 10u);
  for (std::size_t i = 0; i < rest.size(); ++i) EXPECT_EQ(rest[i], expected[10 + i]) << "step " << 11 + i;
}

TEST(Checkpoint, MismatchedRunIsAConfigErrorNamingTheField) {
  set_blas_threads(1);
  TempFile file;
  SerialRun a(small_run(5), markov16());
  a.step();
  a.save(file.path.string());
  TrainOptions wider = small_run(5);
  wider.model.hidden = 64;
  SerialRun b(wider, markov16());
  try {
    b.load(file.path.string());
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("hidden: checkpoint has 32, the run has 64"), std::string::npos)
        << e.what();
  }
  SerialRun c(small_run(5), std::make_unique<MarkovSource>(MarkovOptions{.vocab = 16, .seed = 2}));
  EXPECT_THROW(c.load(file.path.string()), ConfigError);
}

TEST(Trainer, ScheduleWarmsUpThenDecaysToTheFloor) {
  TrainOptions o = small_run(110);
  o.lr = 1.0;
  o.warmup = 10;
  o.min_lr_ratio = 0.1;
  SerialRun t(o, markov16());
  EXPECT_DOUBLE_EQ(t.lr_at(0), 0.1);
  EXPECT_DOUBLE_EQ(t.lr_at(9), 1.0);
  EXPECT_DOUBLE_EQ(t.lr_at(10), 1.0);
  EXPECT_NEAR(t.lr_at(60), 0.55, 1e-12);  // half way: floor + (1 - floor) / 2
  EXPECT_NEAR(t.lr_at(110), 0.1, 1e-12);
}

// A model's vocabulary may be larger than the data's (a preset's on a smaller source: those
// tokens are never seen), never smaller (the data's tokens could not be embedded).
TEST(Trainer, VocabularySmallerThanTheDataIsAConfigError) {
  TrainOptions o = small_run(5);
  o.model.vocab = 10;
  EXPECT_THROW(SerialRun(o, markov16()), ConfigError);
  o.model.vocab = 20;
  EXPECT_NO_THROW(SerialRun(o, markov16()));
}

TEST(Trainer, LayoutsNotImplementedYetAreRefusedNamingTheDim) {
  auto problems = unsupported_layout(Mesh({{"dp", 2}, {"pp", 1}, {"ep", 2}, {"tp", 1}}));
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].find("--ep=2"), std::string::npos) << problems[0];
  EXPECT_TRUE(unsupported_layout(Mesh({{"dp", 4}, {"pp", 1}, {"cp", 1}, {"tp", 1}})).empty());
  EXPECT_TRUE(unsupported_layout(Mesh({{"dp", 2}, {"pp", 1}, {"cp", 2}, {"tp", 2}})).empty());
  EXPECT_TRUE(unsupported_layout(Mesh({{"dp", 2}, {"pp", 2}, {"cp", 1}, {"tp", 2}})).empty());
}

TEST(Trainer, MicroBatchesGiveTheSameLossesAsOneBatch) {
  // Gradient accumulation: every token's loss weighs 1/(global tokens), so 4 micro-batches
  // of 2 give the gradients of one batch of 8 (up to float summation order).
  set_blas_threads(1);
  SerialRun whole(small_run(10), markov16());
  TrainOptions o = small_run(10);
  o.micro_batch = 2;
  SerialRun split(o, markov16());
  EXPECT_EQ(split.microbatches(), 4);
  // Losses within 1e-5; gradient norms within 1e-5 at step 1 (same weights) and 1e-4 later
  // (the bounds of tests/mpi/train_lib.sh).
  for (std::int64_t i = 0; i < 10; ++i) {
    const StepStats x = whole.step(), y = split.step();
    EXPECT_NEAR(y.loss, x.loss, 1e-5 * x.loss) << "step " << i + 1;
    EXPECT_NEAR(y.grad_norm, x.grad_norm, (i == 0 ? 1e-5 : 1e-4) * x.grad_norm) << "step " << i + 1;
  }
  o.micro_batch = 3;
  EXPECT_THROW(SerialRun(o, markov16()), ConfigError);
}

// --offload optimizer: files under --offload-dir on the CPU; on a GPU pinned host memory, so
// no folder (one given is refused, as is optimizer+params: ZeRO-3 runs on the CPU only).
TEST(TrainOptions, OffloadOnAGpuGoesToPinnedHostMemoryWithoutAFolder) {
  auto problems = [](Device device, Offload what, std::string dir, int zero) {
    TrainOptions o;
    o.device = device;
    o.offload = {.what = what, .dir = std::move(dir)};
    o.dp.zero = zero;
    std::string all;
    for (const std::string& p : train_option_problems(o)) all += p + "\n";
    return all;
  };
  EXPECT_EQ(problems(Device::kCuda, Offload::kOptimizer, "", 0), "");
  EXPECT_EQ(problems(Device::kCuda, Offload::kOptimizer, "", 1), "");
  EXPECT_EQ(problems(Device::kCpu, Offload::kOptimizer, "/tmp", 0), "");
  EXPECT_NE(problems(Device::kCpu, Offload::kOptimizer, "", 0).find("needs --offload-dir"), std::string::npos);
  EXPECT_NE(problems(Device::kCuda, Offload::kOptimizer, "/tmp", 0).find("--offload-dir=/tmp with --device cuda"),
            std::string::npos);
  EXPECT_NE(problems(Device::kCuda, Offload::kOptimizerParams, "", 3).find("--offload=optimizer+params with --device cuda"),
            std::string::npos);
}

// ZeRO-3 on a GPU gathers fp32 parameters into mappable device memory: accepted in fp32, with
// fp32 or bf16 gradient communication (rounded and widened on the device, GradReducer over
// ops::cast, as with ZeRO 0, 1 and 2); refused in one line with --precision bf16, whose bf16
// copy of the weights it does not gather.
// Every ZeRO stage with either gradient dtype and either precision is a valid GPU run (ZeRO-3
// with --precision bf16 rounds each gathered weight per product instead of keeping a copy).
TEST(TrainOptions, EveryZeroStageAndPrecisionIsAcceptedOnAGpu) {
  TrainOptions o;
  o.device = Device::kCuda;
  auto all = [&] {
    std::string s;
    for (const std::string& p : train_option_problems(o)) s += p + "\n";
    return s;
  };
  for (const bool bf16_grads : {false, true}) {
    o.dp.bf16 = bf16_grads;
    for (int zero : {0, 1, 2, 3}) {
      o.dp.zero = zero;
      EXPECT_EQ(all(), "") << "--zero " << zero << (bf16_grads ? " --grad-dtype bf16" : "");
    }
  }
  o.precision = Precision::kBf16;
  for (int zero : {0, 1, 2, 3}) {
    o.dp.zero = zero;
    EXPECT_EQ(all(), "") << "--precision bf16 --zero " << zero;
  }
  // What is refused on a GPU still is, with the precision and ZeRO-3 beside it.
  o.offload.what = Offload::kOptimizerParams;
  o.offload.dir = "/tmp";
  EXPECT_NE(all().find("--offload=optimizer+params with --device cuda"), std::string::npos) << all();
  o.device = Device::kCpu;
  EXPECT_EQ(all(), "");
}

}  // namespace
}  // namespace ndmesh::parallel
