// Whole training runs on CUDA device memory under every strategy, on in-process ranks: the
// Trainer (parallelize, the batch source's token uploads, the pipeline executor, GradSync,
// the optimizer) with --device cuda on a tiny model, its groups on the staged communicator
// (every device buffer copied through host memory, as NDMESH_BACKEND=gloo|mpi runs on GPUs),
// three steps, each step's loss and gradient norm against the serial CPU run of the same
// options. The kernels' own tests compare each kernel with its CPU twin; this one finds what
// only composition shows: a layer whose device twin misses a tensor-parallel case, a host
// loop over device memory, a buffer uploaded twice or not at all.
//
// In-process ranks exchange host memory, so this runs in the emulator only (gpu_emulated.*,
// where device memory is host memory, made inaccessible to host code outside kernels and
// copies by the emulator's guard, so that a host access fails as it would on a GPU); on a GPU, scripts/gpu_nccl.sh runs the layouts over
// NCCL and the staged backend in separate processes.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <unistd.h>

#include "emulated_staging.hpp"
#include "gpu_test.hpp"
#include "ndmesh/comm/inproc.hpp"
#include "ndmesh/comm/process_groups.hpp"
#include "ndmesh/comm/staged.hpp"
#include "ndmesh/model/data.hpp"
#include "ndmesh/parallel/grad_sync.hpp"
#include "ndmesh/parallel/parallelize.hpp"
#include "ndmesh/parallel/trainer.hpp"
#include "ndmesh/tensor/device.hpp"
#include "support/model_fixtures.hpp"
#ifdef NDMESH_HAVE_ELASTIC
#include "support/elastic_replicas.hpp"
#endif

namespace ndmesh {
namespace {

// The start of a test whose in-process ranks exchange device memory through host copies
// (this file is built for the emulator only, where device memory is host memory: CMake's
// tests/gpu). Host code that reads or writes device memory (a host loop over gradients, a
// std::copy of a device buffer) stops the test with the emulator's message instead of passing
// because device memory happens to be host memory here.
#define NDMESH_EMULATED_RANKS() \
  do {                          \
    NDMESH_GPU_OR_SKIP();       \
    emu::guard_device_memory(); \
  } while (0)

using parallel::TrainOptions;
using testing::EmulatedStaging;

struct Case {
  std::string name;
  std::string mesh;  // Mesh::parse text, outer to inner
  std::int64_t micro_batch = 0;
  int zero = 0;
  bool sequence_parallel = false;
  Schedule schedule = Schedule::k1F1B;
  bool tied = true;
  std::int64_t virtual_stages = 1;
  comm::AllReduceAlgorithm algorithm = comm::AllReduceAlgorithm::kMpi;
  nn::Recompute recompute = nn::Recompute::kNone;
  parallel::Offload offload = parallel::Offload::kNone;
  parallel::Precision precision = parallel::Precision::kFp32;
  bool grad_bf16 = false;  // --grad-dtype bf16: its reference is the CPU run of the same
                           // layout (the rounding of the reduced buckets is the layout's)
  // bf16 over a model wide enough (hidden 64) that the device's other summation orders round
  // to other bf16 values now and then: the project's bf16 layout bounds (tests/mpi/train_bf16.sh).
  bool bf16_layout_bounds = false;
  std::int64_t hidden = 16;  // ZeRO-3: wide enough that a rank's freed part of a block spans
                             // whole chunks of mappable memory (a page in the emulator)
  bool llama = false;  // --arch llama (RMSNorm, SwiGLU of width 32, rotary positions, no biases, untied)
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

constexpr int kSteps = 3;

TrainOptions options_of(const Case& c) {
  TrainOptions o;
  o.model = testing_support::tiny_spec(4, c.tied);
  o.model.hidden = c.hidden;
  if (c.llama) {
    o.model = with_arch(o.model, "llama");
    o.model.ffn = 32;
  }
  o.batch = 4;
  o.micro_batch = c.micro_batch;
  o.steps = kSteps;
  o.lr = 1e-2;
  o.sequence_parallel = c.sequence_parallel;
  o.dp = {.bucket_mb = 256.0 * 4 / (1024 * 1024), .zero = c.zero};
  o.pp.schedule = c.schedule;
  o.pp.virtual_stages = c.virtual_stages;
  o.dp.algorithm = c.algorithm;
  o.recompute = c.recompute;
  o.offload.what = c.offload;
  o.precision = c.precision;
  o.dp.bf16 = c.grad_bf16;
  return o;
}

struct Steps {
  std::vector<double> loss, norm;
  double eval = 0;  // Trainer::evaluate(1) after the steps
  double grads = 0, grad_workspace = 0;  // Trainer::memory()'s, after the steps
};

// Every rank's per-step (loss, norm) of `steps` steps after loading checkpoint `load` (when
// given), then saving to `save` (when given); rank 0's are returned (they are the same on
// every rank: StepStats says so, and the test checks it).
//
// CUDA runs are tagless (comm::inproc::JobOptions): point-to-point messages match in issue
// order per peer, as on NCCL, so a pipeline or ring whose two sides post in different orders
// fails here (a size mismatch, a wrong result or a timeout naming the group) instead of on
// the GPU.
Steps train(const TrainOptions& o, const Mesh& mesh, Device device, int steps = kSteps,
            const std::string& load = "", const std::string& save = "") {
  std::vector<Steps> runs(static_cast<std::size_t>(mesh.world_size()));
  const comm::inproc::JobOptions job{.timeout_s = 60, .tagless = device == Device::kCuda};
  comm::inproc::run(static_cast<int>(mesh.world_size()), [&](const comm::Communicator& world) {
    testing_support::single_blas_thread();
    TrainOptions mine = o;
    mine.device = device;
    ProcessGroups groups(mesh, device == Device::kCuda && world.size() > 1
                                   ? comm::staged(world, std::make_shared<EmulatedStaging>())
                                   : world);
    parallel::Trainer trainer(
        mine, std::make_unique<model::MarkovSource>(model::MarkovOptions{.vocab = o.model.vocab, .seed = 3}),
        groups);
    if (!load.empty()) trainer.load(load);
    Steps& r = runs[static_cast<std::size_t>(world.rank())];
    for (int s = 0; s < steps; ++s) {
      const parallel::StepStats st = trainer.step();
      r.loss.push_back(st.loss);
      r.norm.push_back(st.grad_norm);
    }
    r.eval = trainer.evaluate(1);
    r.grads = trainer.memory().grads;
    r.grad_workspace = trainer.memory().grad_workspace;
    if (!save.empty()) trainer.save(save);
  }, job);
  for (const Steps& r : runs) {
    EXPECT_EQ(r.loss, runs.front().loss) << "ranks disagree on the loss";
    EXPECT_EQ(r.norm, runs.front().norm) << "ranks disagree on the gradient norm";
    EXPECT_EQ(r.eval, runs.front().eval) << "ranks disagree on the evaluation loss";
  }
  return runs.front();
}

class CudaTrainLayouts : public ::testing::TestWithParam<Case> {};

TEST_P(CudaTrainLayouts, ThreeStepsEqualTheSerialCpuRun) {
  NDMESH_EMULATED_RANKS();  // gpu_nccl.sh runs the layouts on a GPU
  const Case& c = GetParam();
  const TrainOptions o = options_of(c);
  TrainOptions serial = o;  // what only a layout has, left out
  serial.sequence_parallel = false;
  serial.pp.schedule = Schedule::k1F1B;
  serial.pp.virtual_stages = 1;
  serial.dp.algorithm = comm::AllReduceAlgorithm::kMpi;
  serial.offload.what = parallel::Offload::kNone;
  const Steps want = c.grad_bf16 ? train(o, Mesh::parse(c.mesh), Device::kCpu)
                                  : train(serial, Mesh::parse("dp=1"), Device::kCpu);
  const Steps got = train(o, Mesh::parse(c.mesh), Device::kCuda);
  ASSERT_EQ(got.loss.size(), want.loss.size());
  // The device kernels sum in other orders than the CPU loops (blocks, warps, the ring's
  // merges) and the layout splits the sums again: the project's bounds for layouts (loss
  // 1e-5, norm 1e-5 at step 1 and 1e-4 later); a wrong shard, mask or missing reduction is
  // off by 1e-2 and more. bf16 runs meet the same bounds against the CPU's bf16 run (measured
  // 2e-8 in loss and norm), which a run without the rounding misses: fp32 differs from bf16
  // here by 2e-5 in the loss and 5e-4 in the step-1 norm. At hidden 64 they meet the bf16
  // layout bounds (loss 2e-4, step-1 norm 1e-5, later norms 5e-3; measured up to 1.6e-4,
  // 4.2e-6 and 7.2e-4 for the bf16 ZeRO-3 cases, and dp 2 with micro-batches misses 1e-5 under
  // every ZeRO stage alike), which a run without the rounding misses: 5.1e-4 in the step-1
  // norm, 1.2e-3 in the step-3 loss.
  const double lb = c.bf16_layout_bounds ? 2e-4 : 1e-5;
  for (int s = 0; s < kSteps; ++s) {
    const double nb = s == 0 ? 1e-5 : c.bf16_layout_bounds ? 5e-3 : 1e-4;
    EXPECT_NEAR(got.loss[s], want.loss[s], lb * want.loss[s]) << c.name << ", step " << s + 1;
    EXPECT_NEAR(got.norm[s], want.norm[s], nb * want.norm[s]) << c.name << ", step " << s + 1;
  }
  EXPECT_NEAR(got.eval, want.eval, lb * want.eval) << c.name << ", evaluation";
}

// ZeRO 2 and 3 on a GPU keep the full-size gradient work space in mappable memory and back a
// unit's chunks only from its backward's begin until its reduce-scatter retires
// (GradReducer::own_workspace), so over 8 blocks the backward holds about two blocks' worth
// (25%, plus the chunks shared at the units' edges), not the model's; the whole buffer
// stayed resident before. Measured as on the CPU: the most bytes backed at a grads-final hook.
TEST(CudaTrainMemory, ZeroTwoAndThreeBackAboutTwoUnitsOfTheGradientWorkSpace) {
  NDMESH_EMULATED_RANKS();  // gpu_nccl.sh's dp2-zero3 on a GPU
  for (int zero : {2, 3}) {
    TrainOptions o =
        options_of(Case{.name = "", .mesh = "dp=2", .micro_batch = 1, .zero = zero, .hidden = 64});
    o.model.layers = 8;
    const Steps got = train(o, Mesh::parse("dp=2"), Device::kCuda, 2);
    const double full = 2 * got.grads;  // ZeRO 2/3 over 2 ranks keep half of the gradients
    EXPECT_GT(got.grad_workspace, 0.1 * full) << "ZeRO-" << zero;
    EXPECT_LT(got.grad_workspace, 0.4 * full) << "ZeRO-" << zero << ": the work space stays backed";
  }
}

// Building a ZeRO-3 model on a GPU backs only each rank's kept blocks of the parameters
// (issue 60 item 5 on the device): the store's mappable buffers start without backing,
// ParamStore::to backs and uploads the kept ranges from the host buffer itself (no full host
// copy), and the gradient work space is backed unit by unit later. Before, every rank backed
// its full parameters and gradients until GradSync gave the rest back. Four ranks of dp 4
// build (parallelize, GradSync) a 12-block model of about 2.7 MB of parameters; the
// emulator's device peak over the build (every rank's allocations together) may be the
// ranks' shards of the parameters and of the reduced gradients, plus 1 MiB of slack
// (activation work spaces): a quarter of the ranks' full parameters and gradients.
TEST(CudaTrainMemory, ZeroThreeBuildsWithOnlyItsShardsOnTheDevice) {
  NDMESH_EMULATED_RANKS();
  TrainOptions o = options_of(Case{.name = "", .mesh = "dp=4", .micro_batch = 1, .zero = 3, .hidden = 128});
  o.model.layers = 12;
  o.device = Device::kCuda;
  constexpr int kRanks = 4;
  std::vector<std::int64_t> size(kRanks), shard(kRanks);
  const std::int64_t before = cuda::allocator_stats().allocated_bytes;
  comm::inproc::run(kRanks, [&](const comm::Communicator& world) {
    testing_support::single_blas_thread();
    ProcessGroups groups(Mesh::parse("dp=4"), comm::staged(world, std::make_shared<EmulatedStaging>()));
    parallel::RankModel model = parallel::parallelize(o, groups);
    parallel::GradSync sync(model, groups, o.dp);
    const auto r = static_cast<std::size_t>(world.rank());
    size[r] = model.chunks[0]->params().size();
    for (const nn::Segment& s : sync.reducer(0).shard()) shard[r] += s.count;
    world.barrier();  // every rank built before any is taken down
  }, {.timeout_s = 60, .tagless = true});
  const std::int64_t peak = cuda::allocator_stats().peak_allocated_bytes - before;
  std::int64_t allowed = 1 << 20;
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(shard[static_cast<std::size_t>(r)] * kRanks, size[0]);
    allowed += 2 * shard[static_cast<std::size_t>(r)] * static_cast<std::int64_t>(sizeof(float));
  }
  // What the ranks backed before: each its full parameters and gradients.
  const std::int64_t full = kRanks * 2 * size[0] * static_cast<std::int64_t>(sizeof(float));
  ASSERT_GT(full, 2 * allowed) << "the model is too small for the test to tell";
  EXPECT_LE(peak, allowed) << "building backed " << (peak >> 10) << " KiB of device memory; the ranks' shards of "
                           << "parameters and gradients are " << ((allowed - (1 << 20)) >> 10)
                           << " KiB; their full parameters and gradients " << (full >> 10) << " KiB";
  std::cout << "device peak over the build " << (peak >> 10) << " KiB, allowed " << (allowed >> 10)
            << " KiB, the ranks' full parameters and gradients " << (full >> 10) << " KiB\n";
}

// A run resumed from the checkpoint of step `from` continues `whole`, the uninterrupted run:
// the losses within 1e-5 and the gradient norms within 1e-4 at every step it took.
void expect_continues(const Steps& resumed, const Steps& whole, std::size_t from, const std::string& what) {
  ASSERT_EQ(resumed.loss.size() + from, whole.loss.size()) << what;
  for (std::size_t s = 0; s < resumed.loss.size(); ++s) {
    EXPECT_NEAR(resumed.loss[s], whole.loss[s + from], 1e-5 * whole.loss[s + from])
        << what << ", step " << s + from + 1;
    EXPECT_NEAR(resumed.norm[s], whole.norm[s + from], 1e-4 * whole.norm[s + from])
        << what << ", step " << s + from + 1;
  }
}

// A checkpoint written by CUDA ranks under one layout loads on CUDA under another and on
// the CPU, and both continue the uninterrupted CPU run (checkpoints are host copies in one
// format for every device).
TEST(CudaTrainCheckpoint, WrittenOnCudaLoadsUnderAnotherLayoutAndOnTheCpu) {
  NDMESH_EMULATED_RANKS();
  TrainOptions o = options_of(Case{"", ""});
  o.steps = 4;
  const Steps whole = train(o, Mesh::parse("dp=1"), Device::kCpu, 4);
  const std::string dir = ::testing::TempDir() + "ndmesh_cuda_ckpt_" + std::to_string(::getpid());
  TrainOptions a = o;
  a.sequence_parallel = true;
  a.dp.zero = 1;
  train(a, Mesh::parse("dp=2,tp=2"), Device::kCuda, 2, "", dir);
  TrainOptions b = o;
  b.micro_batch = 1;
  const Steps on_cuda = train(b, Mesh::parse("pp=2"), Device::kCuda, 2, dir);
  const Steps on_cpu = train(o, Mesh::parse("dp=1"), Device::kCpu, 2, dir);
  std::filesystem::remove_all(dir);
  expect_continues(on_cuda, whole, 2, "cuda pp 2");
  expect_continues(on_cpu, whole, 2, "cpu");
}

// ZeRO-3 on CUDA keeps only each rank's blocks of the parameters: a checkpoint written by
// ZeRO-3 CUDA ranks gathers them, loads into ZeRO-3 CUDA ranks (each writes its own blocks back
// into device memory, the rest staying freed) and on the CPU, and both continue the
// uninterrupted CPU run.
TEST(CudaTrainCheckpoint, ZeroThreeOnCudaSavesAndLoadsItsShards) {
  NDMESH_EMULATED_RANKS();
  TrainOptions o = options_of(Case{.name = "", .mesh = "", .hidden = 64});
  o.steps = 4;
  const Steps whole = train(o, Mesh::parse("dp=1"), Device::kCpu, 4);
  const std::string dir = ::testing::TempDir() + "ndmesh_cuda_zero3_ckpt_" + std::to_string(::getpid());
  TrainOptions z = o;
  z.dp.zero = 3;
  train(z, Mesh::parse("dp=2"), Device::kCuda, 2, "", dir);
  const Steps on_cuda = train(z, Mesh::parse("dp=2"), Device::kCuda, 2, dir);
  const Steps on_cpu = train(o, Mesh::parse("dp=1"), Device::kCpu, 2, dir);
  std::filesystem::remove_all(dir);
  expect_continues(on_cuda, whole, 2, "cuda ZeRO-3");
  expect_continues(on_cpu, whole, 2, "cpu");
}

// Under bf16 on CUDA the products read the bfloat16 copy of the weights that the optimizer
// step writes; a checkpoint load writes the parameters another way, which must make that copy
// stale (the next forward casts the loaded weights). A CUDA trainer that has taken a step
// (its copy current) loads the checkpoint of step 2 and continues the uninterrupted CPU bf16
// run. A copy left current would hold the weights after its own first step instead (the loss
// of step 3 then is off by far more than the bounds).
TEST(CudaTrainCheckpoint, Bf16LoadedIntoARunningTrainerResumesFromTheLoadedWeights) {
  NDMESH_EMULATED_RANKS();
  Case c{"", "dp=1"};
  c.precision = parallel::Precision::kBf16;
  TrainOptions o = options_of(c);
  o.steps = 4;
  const Steps whole = train(o, Mesh::parse("dp=1"), Device::kCpu, 4);
  const std::string dir = ::testing::TempDir() + "ndmesh_cuda_bf16_ckpt_" + std::to_string(::getpid());
  train(o, Mesh::parse("dp=1"), Device::kCpu, 2, "", dir);
  Steps resumed;
  comm::inproc::run(1, [&](const comm::Communicator& world) {
    testing_support::single_blas_thread();
    TrainOptions mine = o;
    mine.device = Device::kCuda;
    ProcessGroups groups(Mesh::parse("dp=1"), world);
    parallel::Trainer trainer(
        mine, std::make_unique<model::MarkovSource>(model::MarkovOptions{.vocab = o.model.vocab, .seed = 3}), groups);
    trainer.step();
    trainer.load(dir);
    for (int s = 0; s < 2; ++s) {
      const parallel::StepStats st = trainer.step();
      resumed.loss.push_back(st.loss);
      resumed.norm.push_back(st.grad_norm);
    }
  }, {.timeout_s = 60, .tagless = true});
  std::filesystem::remove_all(dir);
  expect_continues(resumed, whole, 2, "cuda bf16 after a load");
}

// ndmesh's own all-reduce programs sum received chunks in host loops: on CUDA they are
// refused in one line (the device communicator's all-reduce is NCCL's ring or tree).
#ifdef NDMESH_HAVE_ELASTIC
// Elastic replicas on (emulated) GPUs (docs/elastic.md): replicas of `mesh` with --device cuda,
// their groups on the staged device communicator, the sum across replicas staged through host
// memory around the generation's host group (GradSync), under an in-process coordinator.
// Replica 2 joins after step 1 (it heals from a donor through the state dict: parameters and
// moments downloaded, broadcast, uploaded) and replica 1 leaves after step 3 (the others'
// reduction fails, the step is redone without it): every committed step equals the serial CPU
// run within the layout bounds (loss 1e-5, norm 1e-5 at step 1, 1e-4 later). Replicas of one
// rank: the device communicators inside a replica are those of every GPU layout (the layout
// tests above); `mesh` "tp=2" passes as well, in 19 s instead of 5 on this machine.
void expect_elastic_equals_serial(const std::string& mesh, TrainOptions o, std::int64_t steps) {
  o.batch = 6;  // 6 micro-batches: two for each of 3 replicas
  o.micro_batch = 1;
  o.steps = steps;
  const Steps want = train(o, Mesh::parse("dp=1"), Device::kCpu, static_cast<int>(steps));
  TrainOptions device = o;
  device.device = Device::kCuda;
  const testing_support::ReplicaOutcome out = testing_support::run_replicas(
      {.replicas = 3,
       .min_replicas = 2,
       .steps = steps,
       .leaver = 1,
       .leave_after = 3,
       .late = 2,
       .join_after = 1,
       .mesh = mesh,
       .options = device,
       .data = [&o] { return std::make_unique<model::MarkovSource>(model::MarkovOptions{.vocab = o.model.vocab, .seed = 3}); },
       .groups_world = [](const comm::Communicator& world) {
         return world.size() > 1 ? comm::staged(world, std::make_shared<EmulatedStaging>()) : world;
       },
       .job = {.timeout_s = 60, .tagless = true}});
  for (std::size_t r = 0; r < 3; ++r)
    for (std::size_t s = 0; s < static_cast<std::size_t>(steps); ++s) {
      if (std::isnan(out.losses[r][s])) continue;
      const double nb = s == 0 ? 1e-5 : 1e-4;
      EXPECT_NEAR(out.losses[r][s], want.loss[s], 1e-5 * want.loss[s]) << mesh << " replica " << r << " step " << s + 1;
      EXPECT_NEAR(out.norms[r][s], want.norm[s], nb * want.norm[s]) << mesh << " replica " << r << " step " << s + 1;
    }
  // Every step committed by replica 0; replica 2 committed some after healing, with all three
  // computing one of them; the last step without replica 1.
  for (std::size_t s = 0; s < static_cast<std::size_t>(steps); ++s)
    EXPECT_FALSE(std::isnan(out.losses[0][s])) << mesh << " step " << s + 1;
  EXPECT_FALSE(std::isnan(out.losses[2][static_cast<std::size_t>(steps) - 1])) << mesh << ": replica 2 never healed";
  EXPECT_NE(std::find(out.replicas.begin(), out.replicas.end(), 3), out.replicas.end()) << mesh;
  EXPECT_EQ(out.replicas.back(), 2) << mesh;
}

TEST(CudaElasticReplicas, JoinHealAndLeaveEqualTheSerialCpuRun) {
  NDMESH_EMULATED_RANKS();
  TrainOptions o = options_of(Case{"", ""});
  o.model.layers = 1;  // the emulator's time: about 0.3 s a step of each replica here
  expect_elastic_equals_serial("dp=1", o, 4);
}
#endif

TEST(CudaTrainOptions, HostAllReduceProgramsAreRefused) {
  NDMESH_GPU_OR_SKIP();
  for (auto a : {comm::AllReduceAlgorithm::kRing, comm::AllReduceAlgorithm::kTree,
                 comm::AllReduceAlgorithm::kHierarchical, comm::AllReduceAlgorithm::kAdaptive}) {
    Case c{"dp 2", "dp=2"};
    c.algorithm = a;
    const std::string name(comm::algorithm_name(a));
    try {
      train(options_of(c), Mesh::parse(c.mesh), Device::kCuda);
      ADD_FAILURE() << "--allreduce " << name << " with --device cuda was not refused";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("--allreduce=" + name + " with --device cuda"), std::string::npos)
          << e.what();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, CudaTrainLayouts,
    ::testing::Values(
        Case{"serial", "dp=1"}, Case{"dp 2 micro-batches", "dp=2", 1}, Case{"tp 2", "tp=2"},
        Case{"tp 2 sequence parallel", "tp=2", 0, 0, true}, Case{"cp 2", "cp=2"},
        Case{"pp 2 tied", "pp=2", 1},
        Case{"pp 2 interleaved", "pp=2", 1, 0, false, Schedule::kInterleaved, true, 2},
        Case{"pp 2 untied zb-h1", "pp=2", 1, 0, false, Schedule::kZbH1, false},
        Case{"dp 2 ZeRO 1 tp 2 sp", "dp=2,tp=2", 1, 1, true},
        Case{"dp 2 ZeRO 2 pp 2 tied", "dp=2,pp=2", 1, 2}, Case{"dp 2 cp 2 ZeRO 2", "dp=2,cp=2", 0, 2},
        Case{"pp 2 tp 2 sp tied", "pp=2,tp=2", 1, 0, true},
        Case{"dp 2 full recompute", "dp=2", 0, 0, false, Schedule::k1F1B, true, 1,
             comm::AllReduceAlgorithm::kMpi, nn::Recompute::kFull},
        Case{"tp 2 sp selective recompute", "tp=2", 0, 0, true, Schedule::k1F1B, true, 1,
             comm::AllReduceAlgorithm::kMpi, nn::Recompute::kSelective},
        Case{"dp 2 ZeRO 1 offload optimizer", "dp=2", 0, 1, false, Schedule::k1F1B, true, 1,
             comm::AllReduceAlgorithm::kMpi, nn::Recompute::kNone, parallel::Offload::kOptimizer},
        Case{"dp 2 pp 2 tp 2 sp", "dp=2,pp=2,tp=2", 1, 1, true},
        Case{.name = "bf16 serial", .mesh = "dp=1", .precision = parallel::Precision::kBf16},
        Case{.name = "bf16 dp 2 tp 2 sp ZeRO 2",
             .mesh = "dp=2,tp=2",
             .zero = 2,
             .sequence_parallel = true,
             .precision = parallel::Precision::kBf16},
        Case{.name = "bf16 pp 2 cp 2",
             .mesh = "pp=2,cp=2",
             .micro_batch = 1,
             .precision = parallel::Precision::kBf16},
        // The optimizer's bf16 weight copy where another writer makes it stale every step
        // (the pinned offload's copy back) and under the split backward's deferred products.
        Case{.name = "bf16 offload optimizer",
             .mesh = "dp=1",
             .offload = parallel::Offload::kOptimizer,
             .precision = parallel::Precision::kBf16},
        Case{.name = "bf16 pp 2 untied zb-h1",
             .mesh = "pp=2",
             .micro_batch = 1,
             .schedule = Schedule::kZbH1,
             .tied = false,
             .precision = parallel::Precision::kBf16},
        Case{.name = "bf16 gradient communication dp 2 ZeRO 2",
             .mesh = "dp=2",
             .micro_batch = 1,
             .zero = 2,
             .grad_bf16 = true},
        // ZeRO-3 on the device: the parameters in mappable memory, each unit gathered
        // before use and its chunks given back after (parallel::ParamGatherer).
        Case{.name = "dp 2 ZeRO 3 micro-batches", .mesh = "dp=2", .micro_batch = 1, .zero = 3, .hidden = 64},
        Case{.name = "dp 2 ZeRO 3 pp 2 tied", .mesh = "dp=2,pp=2", .micro_batch = 1, .zero = 3, .hidden = 64},
        // The weight half of zb-h1's split backward writes gradients outside the unit events:
        // its records back their units first (the model's grads-write hook).
        Case{.name = "dp 2 ZeRO 2 pp 2 untied zb-h1",
             .mesh = "dp=2,pp=2",
             .micro_batch = 1,
             .zero = 2,
             .schedule = Schedule::kZbH1,
             .tied = false,
             .hidden = 64},
        Case{.name = "dp 2 ZeRO 3 pp 2 untied zb-h1",
             .mesh = "dp=2,pp=2",
             .micro_batch = 1,
             .zero = 3,
             .schedule = Schedule::kZbH1,
             .tied = false,
             .hidden = 64},
        Case{.name = "dp 2 cp 2 ZeRO 3 tp 2 sp",
             .mesh = "dp=2,cp=2,tp=2",
             .zero = 3,
             .sequence_parallel = true,
             .hidden = 64},
        // bf16 products under ZeRO-3: no bf16 copy of the weights (it would be full-size);
        // each product rounds its gathered weight.
        Case{.name = "bf16 dp 2 ZeRO 3 micro-batches",
             .mesh = "dp=2",
             .micro_batch = 1,
             .zero = 3,
             .precision = parallel::Precision::kBf16,
             .bf16_layout_bounds = true,
             .hidden = 64},
        Case{.name = "bf16 dp 2 tp 2 sp ZeRO 3",
             .mesh = "dp=2,tp=2",
             .zero = 3,
             .sequence_parallel = true,
             .precision = parallel::Precision::kBf16,
             .bf16_layout_bounds = true,
             .hidden = 64},
        Case{.name = "bf16 gradient communication dp 2 ZeRO 3",
             .mesh = "dp=2",
             .micro_batch = 1,
             .zero = 3,
             .grad_bf16 = true,
             .hidden = 64},
        // Llama: the RMSNorm, SwiGLU and rotary kernels (fp32 and bf16) under the layouts
        // that split them (tp's heads and MLP columns, cp's positions, pp's untied head).
        Case{.name = "llama serial", .mesh = "dp=1", .llama = true},
        Case{.name = "llama tp 2 sp", .mesh = "tp=2", .sequence_parallel = true, .llama = true},
        Case{.name = "llama cp 2", .mesh = "cp=2", .llama = true},
        Case{.name = "llama dp 2 ZeRO 3 pp 2 zb-h1",
             .mesh = "dp=2,pp=2",
             .micro_batch = 1,
             .zero = 3,
             .schedule = Schedule::kZbH1,
             .hidden = 64,
             .llama = true},
        Case{.name = "llama bf16 serial", .mesh = "dp=1", .precision = parallel::Precision::kBf16, .llama = true},
        Case{.name = "llama bf16 dp 2 tp 2 sp",
             .mesh = "dp=2,tp=2",
             .sequence_parallel = true,
             .precision = parallel::Precision::kBf16,
             .llama = true}),
    [](const ::testing::TestParamInfo<Case>& param_info) {
      std::string s;
      for (char ch : param_info.param.name) s += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
      return s;
    });

// Kernel times over whole steps (ndmesh train --kernel-times): the layers' kernels, products
// and the optimizer are each a row, and the host waits for the GPU once a step whatever the
// micro-batches, after the optimizer step: the loss (summed on the device over the
// micro-batches) and the gradient norm, read together.
TEST(CudaTrainKernelTimes, AStepsOperationsAreRowsAndItsHostWaitsAreCounted) {
  NDMESH_GPU_OR_SKIP();
  for (parallel::Precision precision : {parallel::Precision::kFp32, parallel::Precision::kBf16}) {
    Case c{"serial", "dp=1"};
    c.precision = precision;
    constexpr int kMicro = 2;
    c.micro_batch = 2;  // of the batch of 4
    TrainOptions o = options_of(c);
    o.device = Device::kCuda;
    constexpr int kTimed = 2;
    cuda::KernelTimes t;
    comm::inproc::run(1, [&](const comm::Communicator& world) {
      testing_support::single_blas_thread();
      ProcessGroups groups(Mesh::parse(c.mesh), world);
      parallel::Trainer trainer(
          o, std::make_unique<model::MarkovSource>(model::MarkovOptions{.vocab = o.model.vocab, .seed = 3}), groups);
      trainer.step();  // plans and first allocations
      cuda::kernel_times_start();
      for (int s = 0; s < kTimed; ++s) trainer.step();
      t = cuda::kernel_times_stop();
    }, {.timeout_s = 60, .tagless = true});
    std::int64_t products = 0, calls = 0;
    std::string table;
    for (const cuda::KernelTime& r : t.rows) {
      calls += r.calls;
      if (r.name.rfind("gemm ", 0) == 0) products += r.calls;
      table += "  " + std::to_string(r.calls / kTimed) + " x " + r.name + "\n";
    }
    const std::string what = std::string(parallel::precision_name(precision)) + ":\n" + table;
    auto has = [&](const std::string& part) {
      for (const cuda::KernelTime& r : t.rows)
        if (r.name.find(part) != std::string::npos) return true;
      return false;
    };
    // The loss and its gradient in one kernel over the logits (the whole vocabulary on the
    // rank): no cross-entropy passes, no probabilities.
    for (const char* part : {"layernorm", "residual_layernorm_forward", "attention", "gelu", "classifier_forward_backward", "adamw", "embedding"})
      EXPECT_TRUE(has(part)) << "no row names " << part << " in\n" << what;
    EXPECT_FALSE(has("cross_entropy")) << what;
    // 4 layers x (4 products forward + 8 backward) + the head's 3 (tied), every micro-batch;
    // under bf16 the head's forward writes bfloat16 logits.
    EXPECT_EQ(products, kTimed * kMicro * (4 * 12 + 3)) << what;
    EXPECT_EQ(has("gemm bf16 "), precision == parallel::Precision::kBf16) << what;
    // Under bf16 the biases that are not deferred (qkv, fc) and their gradients go into the
    // products (cuBLASLt epilogues): per layer qkv's product with its bias, fc's with its bias
    // and GELU (writing the pre-activation and the hidden in bf16), 2 weight gradients with the
    // bias gradient, and GELU's derivative in the input gradient of the MLP's second product
    // (writing d pre in bf16). No GELU kernel runs, forward or backward.
    std::int64_t fused_bias = 0, fused_gelu = 0, fused_bias_grad = 0, fused_dgelu = 0;
    for (const cuda::KernelTime& r : t.rows) {
      const auto ends = [&](const std::string& tail) { return r.name.ends_with(tail); };
      fused_bias += ends(" +bias") ? r.calls : 0;
      fused_gelu += ends(" +gelu") ? r.calls : 0;
      fused_bias_grad += ends(" +bias grad") ? r.calls : 0;
      fused_dgelu += ends(" +dgelu") ? r.calls : 0;
    }
    const std::int64_t fused = precision == parallel::Precision::kBf16 ? kTimed * kMicro * 4 : 0;
    EXPECT_EQ(fused_bias, fused) << what;
    EXPECT_EQ(fused_gelu, fused) << what;
    EXPECT_EQ(has("gelu_forward") || has("gelu_bias_forward"), precision == parallel::Precision::kFp32)
        << what;
    EXPECT_EQ(fused_bias_grad, 2 * fused) << what;
    EXPECT_EQ(fused_dgelu, fused) << what;  // proj's input gradient through GELU's derivative
    EXPECT_EQ(has("gelu_backward"), precision == parallel::Precision::kFp32) << what;
    // Under bf16 each product rounds its two operands, except that a linear layer's backward
    // rounds its output's gradient once for both of its products (16 layers: 4 x 4), the
    // head's backward reads the logits' gradient as the classifier stored it (bfloat16), and
    // the products that read a weight (each layer's forward and input gradient: 16 x 2, and
    // the head's two, the tied token table) read the bfloat16 copy the optimizer step wrote
    // (no cast of the whole copy inside a step either: it would be one more a step), the
    // two that read the MLP's hidden activation (proj's forward and weight gradient, 4 x 2)
    // read it as GELU stored it, in bf16, the four that read a norm's output (qkv's and
    // fc's forward and weight gradient, 4 x 4) read it as the norm stored it, in bf16, the
    // two that read the attention output (proj's forward and weight gradient, 4 x 2) read it
    // as stored in bf16, and qkv's backward reads its output's gradient as the attention
    // backward stored it, in bf16 (-4), as fc's backward reads d pre as proj's input gradient
    // wrote it (-4). The attention's input, output and gradients are bf16
    // tensors (qkv's product and proj's input gradient write them rounded once, no cast):
    // on a GPU cuDNN reads and writes them as they are; the emulator's flash kernel (fp32,
    // no cuDNN here) widens qkv for the forward and qkv, the output and its gradient for
    // the backward (4 casts from bfloat16 a layer), and rounds its output and d qkv once
    // (+4, +4).
    std::int64_t casts = 0, widenings = 0;
    for (const cuda::KernelTime& r : t.rows) {
      if (r.name == "cast to bfloat16") casts += r.calls;
      if (r.name == "cast from bfloat16") widenings += r.calls;
    }
    EXPECT_EQ(casts, precision == parallel::Precision::kBf16
                         ? 2 * products - kTimed * kMicro * (16 + 2) - kTimed * kMicro * (16 * 2 + 2) -
                               kTimed * kMicro * 4 * 2 - kTimed * kMicro * 4 * 4 - kTimed * kMicro * 4 * 2 -
                               kTimed * kMicro * 4 - kTimed * kMicro * 4 + kTimed * kMicro * 4 * 2
                         : 0)
        << what;
    EXPECT_EQ(widenings, precision == parallel::Precision::kBf16 ? kTimed * kMicro * 4 * 4 : 0) << what;
    // A step zeroes only what is accumulated into: the gradients (once), and per micro-batch
    // each layer's d qkv (the attention backward adds into it) and the final norm's input
    // gradient. Everything else is written (the logits' gradient by the classifier, GELU's
    // in place, the products' input gradients with beta 0, a block's d input from its
    // residual path, the loss's sum by its first micro-batch).
    std::int64_t memsets = 0;
    for (const cuda::KernelTime& r : t.rows)
      if (r.name == "memset") memsets += r.calls;
    EXPECT_EQ(memsets, kTimed * (1 + kMicro * (4 + 1))) << what;
    EXPECT_GT(t.seconds, 0.0);
    // One host wait a step, at its end: the loss and the gradient norm stay on the device
    // (the optimizer's kernel clips with the norm's square where it is) and are read together
    // once the optimizer step is enqueued. A read of either before the update would be a
    // second wait, inside the step.
    EXPECT_EQ(t.host_waits, kTimed) << "host waits: " << t.host_waits / kTimed << " a step\n" << what;
    std::printf("%s: %lld operations and %lld host waits a step of %d micro-batches\n%s",
                parallel::precision_name(precision), static_cast<long long>(calls / kTimed),
                static_cast<long long>(t.host_waits / kTimed), kMicro, table.c_str());
  }
}

}  // namespace
}  // namespace ndmesh
