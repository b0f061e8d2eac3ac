// parallelize + the pipeline executor + GradSync on in-process ranks (comm/inproc.hpp): one
// training step's synchronised gradients, loss and gradient norm under a layout equal the
// serial model's over the same global batch. Each rank checks the gradients it updates
// (all of them, or its ZeRO shard gathered over the gradient group) by parameter name
// against the serial model: tensor-parallel slices against the slice of the full tensor,
// pipeline chunks against their blocks, a tied head's copy of the token table against the
// table's whole gradient (the embedding-group sum). A failure names the rank, the chunk and
// the first differing tensor. Under ZeRO-3 the parameters are sharded too: each unit is
// gathered by the chunk's ParamGatherer around its use; with a mixture of experts under --ep the
// expert partition's gradients are gathered over the expert-data-parallel group, and under ZeRO-3
// each MoE block's experts are sharded over that group (GradSyncMoeZero3). The batch slicing
// here is written independently of the BatchSource (dp slice, micro-batches, cp positions), so
// the test checks the components that do it, not a copy of them.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "ndmesh/comm/inproc.hpp"
#include "ndmesh/comm/process_groups.hpp"
#include "ndmesh/parallel/grad_sync.hpp"
#include "ndmesh/parallel/parallelize.hpp"
#include "ndmesh/parallel/pp/executor.hpp"
#include "support/model_fixtures.hpp"

namespace ndmesh::parallel {
namespace {

using comm::Communicator;
using testing_support::Batch;

struct Case {
  std::string name;
  std::string mesh;  // Mesh::parse text, outer to inner
  std::int64_t micro_batch = 0;
  int zero = 0;
  bool sequence_parallel = false;
  Schedule schedule = Schedule::k1F1B;
  bool tied = true;
  std::int64_t experts = 0;  // a mixture of experts (aux loss 0: the micro-batches differ from serial's)
  std::int64_t ep = 1;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class GradSyncLayouts : public ::testing::TestWithParam<Case> {};

TrainOptions options_for(const Case& c) {
  TrainOptions o;
  o.model = testing_support::tiny_spec(4, c.tied);
  o.batch = 4;
  o.micro_batch = c.micro_batch;
  o.sequence_parallel = c.sequence_parallel;
  o.dp = {.bucket_mb = 256.0 * 4 / (1024 * 1024), .zero = c.zero};
  o.pp.schedule = c.schedule;
  if (c.experts > 0) {
    o.model.experts = c.experts;
    o.model.biases = false;
    o.model.aux_loss = 0;
    o.ep = c.ep;
  }
  return o;
}

double norm_of(const testing_support::SerialReference& ref) {
  double square = 0;
  for (float g : ref.model().params().grads()) square += static_cast<double>(g) * g;
  return std::sqrt(square);
}

// One training step of layout c on in-process ranks over `batch`, then after(world, sync,
// model, walk) on each rank. `take_loss`: StageHooks::take_loss (false: the loss stays in the
// heads, for GradSync::finish_step_from_heads).
template <typename After>
void one_step(const Case& c, const TrainOptions& o, const Batch& batch, bool take_loss, After&& after) {
  const Mesh mesh = Mesh::parse(c.mesh);
  comm::inproc::run(static_cast<int>(mesh.world_size()), [&](const Communicator& world) {
    testing_support::single_blas_thread();
    ProcessGroups groups(mesh, world);
    RankModel model = parallelize(o, groups);
    GradSync sync(model, groups, o.dp);
    std::vector<model::Model*> raw;
    for (auto& chunk : model.chunks) raw.push_back(chunk.get());
    pp::Executor executor(model.plan.schedule, model.plan.pp, raw);
    for (std::size_t k = 0; k < model.chunks.size(); ++k)
      model.chunks[k]->set_progress_hook([&, k] {
        sync.progress(static_cast<int>(k));
        executor.poll();
      });
    // This rank's micro-batch mb: its dp slice of the global batch, cut into micro-batches,
    // at its cp positions.
    const BatchLayout& l = model.plan.batch;
    pp::StageHooks hooks;
    hooks.data = [&](int mb, std::int32_t* tokens, std::int32_t* targets) {
      const Batch b = batch.slice(l.dp_rank * l.local_batch + mb * l.micro_batch, l.micro_batch)
                          .at_positions(l.positions);
      std::copy(b.tokens.begin(), b.tokens.end(), tokens);
      std::copy(b.targets.begin(), b.targets.end(), targets);
    };
    hooks.before_backward = [&](int k, bool last) { sync.begin_backward(k, last); };
    hooks.after_backward = [&](int k) { sync.end_backward(k); };
    hooks.take_loss = take_loss;
    sync.start_step();
    const pp::WalkResult walk = executor.train_step(hooks);
    after(world, sync, model, walk);
  });
}

TEST_P(GradSyncLayouts, OneStepEqualsTheSerialGradientsByName) {
  const Case& c = GetParam();
  const TrainOptions o = options_for(c);
  const Batch batch = testing_support::make_batch(o.model, o.batch, 21);
  const testing_support::SerialReference ref(o.model, batch);
  const double ref_norm = norm_of(ref);
  one_step(c, o, batch, true,
           [&](const Communicator& world, GradSync& sync, RankModel& model, const pp::WalkResult& walk) {
             const StepSums sums = sync.finish_step(walk.loss_sum);
             EXPECT_NEAR(sums.loss, ref.loss(), 1e-6 * ref.loss()) << c.name << ", rank " << world.rank();
             EXPECT_NEAR(sums.grad_norm, ref_norm, 1e-5 * ref_norm) << c.name << ", rank " << world.rank();
             for (std::size_t k = 0; k < model.chunks.size(); ++k) {
               model::Model& chunk = *model.chunks[k];
               // The gradients this rank updates; under ZeRO each element has one owner in the
               // group of its partition (the dense part's gradient group, the experts' edp
               // group), and a sum of zero-filled buffers gathers them.
               std::vector<float> mine(chunk.params().grads().begin(), chunk.params().grads().end());
               const std::int64_t dense = sync.expert_offset(k);
               for (GradReducer* reducer : {&sync.reducer(k), sync.expert_reducer(k)}) {
                 if (reducer == nullptr || reducer->zero() == 0) continue;
                 const std::int64_t base = reducer == &sync.reducer(k) ? 0 : dense;
                 const std::int64_t end = base == 0 ? dense : chunk.params().size();
                 std::fill(mine.begin() + base, mine.begin() + end, 0.0f);
                 reducer->for_each_owned(chunk.params().grads().data() + base, 0, end - base,
                                         [&](const float* g, std::int64_t n, std::int64_t at) {
                                           std::copy(g, g + n, mine.begin() + base + at);
                                         });
                 reducer->group().all_reduce(std::span<float>(mine).subspan(
                     static_cast<std::size_t>(base), static_cast<std::size_t>(end - base)));
               }
               EXPECT_TRUE(testing_support::same_by_name(chunk.params(), mine, ref.model().params(),
                                                         ref.model().params().grads()))
                   << c.name << ", rank " << world.rank() << ", chunk " << k;
             }
           });
}

// ZeRO-3 of the experts a rank stores over an expert-data-parallel group of 2 or more: after
// the step (every unit freed) the rank holds, of each MoE block's expert range, exactly its
// own block (the rest reads NaN or 0), and those blocks summed over edp are the serial model's
// parameters by name. (Before, a rank kept its experts whole: this failed.) Over an edp group
// of one the experts stay whole and nothing gathers them.
class GradSyncMoeZero3 : public GradSyncLayouts {};

TEST_P(GradSyncMoeZero3, KeepsOneBlockOfEachMoeBlocksExperts) {
  const Case& c = GetParam();
  const TrainOptions o = options_for(c);
  const Batch batch = testing_support::make_batch(o.model, o.batch, 21);
  const testing_support::SerialReference ref(o.model, batch);
  one_step(c, o, batch, true,
           [&](const Communicator& world, GradSync& sync, RankModel& model, const pp::WalkResult& walk) {
             sync.finish_step(walk.loss_sum);
             for (std::size_t k = 0; k < model.chunks.size(); ++k) {
               model::Model& chunk = *model.chunks[k];
               const GradReducer* e = sync.expert_reducer(k);
               ASSERT_NE(e, nullptr) << c.name << ", rank " << world.rank();
               const std::int64_t p = e->group().size(), r = e->group().rank();
               if (p == 1) {  // an edp group of one: the rank's experts whole, nothing gathered
                 EXPECT_EQ(sync.expert_gatherer(k), nullptr) << c.name;
                 continue;
               }
               ASSERT_NE(sync.expert_gatherer(k), nullptr) << c.name;
               ASSERT_FALSE(chunk.expert_ranges().empty()) << c.name;
               std::vector<float> all(chunk.params().params().begin(), chunk.params().params().end());
               const std::int64_t dense = sync.expert_offset(k);
               for (const nn::Segment& range : chunk.expert_ranges()) {
                 ASSERT_EQ(range.count % p, 0) << c.name;
                 const std::int64_t block = range.count / p, own = range.offset + r * block;
                 for (std::int64_t i = range.offset; i < range.offset + range.count; ++i) {
                   const float x = all[static_cast<std::size_t>(i)];
                   if (i >= own && i < own + block) continue;
                   ASSERT_TRUE(std::isnan(x) || x == 0.0f)
                       << c.name << ", rank " << world.rank() << ": expert element " << i << " resident ("
                       << x << ") outside the own block [" << own << ", " << own + block << ")";
                   all[static_cast<std::size_t>(i)] = 0.0f;
                 }
               }
               e->group().all_reduce(std::span<float>(all).subspan(static_cast<std::size_t>(dense)));
               // (The dense part is the dense gatherer's shard: only the expert views are compared.)
               for (const ParamView& v : chunk.params().views()) {
                 if (!v.expert) continue;
                 const int id = ref.model().params().find(v.name);
                 ASSERT_GE(id, 0) << v.name;
                 const float* serial = ref.model().params().param(id);
                 for (std::int64_t i = 0; i < v.numel; ++i)
                   ASSERT_EQ(all[static_cast<std::size_t>(v.offset + i)], serial[i])
                       << c.name << ", rank " << world.rank() << ", " << v.name << "[" << i << "]";
               }
             }
           });
}

// The trainer's path: the walk leaves the loss in the heads (StageHooks::take_loss false)
// and finish_step_from_heads(true) sums the loss and the norm's square over the world where
// they are (one all-reduce, each tp group's loss counted once) without reading them: on every
// rank they stay pending (loss and norm 0) until read_sums, which then gives the serial
// model's loss and norm, the same on every rank.
TEST_P(GradSyncLayouts, TheSumsLeftPendingAreTheWorldsLossAndNorm) {
  const Case& c = GetParam();
  const TrainOptions o = options_for(c);
  const Batch batch = testing_support::make_batch(o.model, o.batch, 21);
  const testing_support::SerialReference ref(o.model, batch);
  const double ref_norm = norm_of(ref);
  std::vector<StepSums> read(static_cast<std::size_t>(Mesh::parse(c.mesh).world_size()));
  one_step(
      c, o, batch, false, [&](const Communicator& world, GradSync& sync, RankModel&, const pp::WalkResult&) {
        StepSums sums = sync.finish_step_from_heads(true);
        ASSERT_NE(sums.pending, nullptr) << c.name << ", rank " << world.rank();
        EXPECT_EQ(sums.loss, 0.0) << "read before read_sums, " << c.name << ", rank " << world.rank();
        EXPECT_EQ(sums.grad_norm, 0.0) << "read before read_sums, " << c.name << ", rank " << world.rank();
        sync.read_sums(sums);
        EXPECT_EQ(sums.pending, nullptr);
        EXPECT_NEAR(sums.loss, ref.loss(), 1e-6 * ref.loss()) << c.name << ", rank " << world.rank();
        EXPECT_NEAR(sums.grad_norm, ref_norm, 1e-5 * ref_norm) << c.name << ", rank " << world.rank();
        read[static_cast<std::size_t>(world.rank())] = sums;
      });
  for (const StepSums& r : read) {
    EXPECT_EQ(r.loss, read.front().loss) << c.name;
    EXPECT_EQ(r.grad_norm, read.front().grad_norm) << c.name;
  }
}

std::string case_name(const ::testing::TestParamInfo<Case>& param_info) {
  std::string s;
  for (char ch : param_info.param.name) s += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
  return s;
}

// A mixture of experts under --ep 2 and ZeRO-3: the experts' edp group of 1 (dp 2) and 2.
const Case kMoeCases[] = {
    Case{"dp 2 ep 2 ZeRO 3 moe", "dp=2", 0, 3, false, Schedule::k1F1B, true, 4, 2},
    Case{"dp 4 ep 2 ZeRO 3 moe", "dp=4", 0, 3, false, Schedule::k1F1B, true, 4, 2},
    Case{"dp 2 cp 2 ep 2 ZeRO 3 moe", "dp=2,cp=2", 0, 3, false, Schedule::k1F1B, true, 4, 2},
    Case{"dp 4 ep 2 ZeRO 3 pp 2 moe", "dp=4,pp=2", 1, 3, false, Schedule::k1F1B, true, 4, 2}};

INSTANTIATE_TEST_SUITE_P(
    Layouts, GradSyncLayouts,
    ::testing::Values(
        Case{"serial", "dp=1"}, Case{"dp 2 micro-batches", "dp=2", 1}, Case{"tp 2", "tp=2"},
        Case{"tp 2 sequence parallel", "tp=2", 0, 0, true}, Case{"cp 2", "cp=2"},
        Case{"pp 2 tied", "pp=2", 1}, Case{"pp 2 untied zb-h1", "pp=2", 1, 0, false, Schedule::kZbH1, false},
        Case{"dp 2 ZeRO 1 tp 2 sp", "dp=2,tp=2", 1, 1, true},
        Case{"dp 2 ZeRO 2 pp 2 tied", "dp=2,pp=2", 1, 2}, Case{"dp 2 cp 2 ZeRO 1", "dp=2,cp=2", 0, 1},
        Case{"pp 2 tp 2 sp tied", "pp=2,tp=2", 1, 0, true}, Case{"dp 2 ZeRO 3 micro-batches", "dp=2", 1, 3},
        Case{"dp 2 ZeRO 3 tp 2 sp", "dp=2,tp=2", 1, 3, true},
        Case{"dp 2 ZeRO 3 pp 2 tied", "dp=2,pp=2", 1, 3},
        Case{"dp 2 ZeRO 3 pp 2 untied zb-h1", "dp=2,pp=2", 1, 3, false, Schedule::kZbH1, false},
        Case{"dp 2 cp 2 ZeRO 3", "dp=2,cp=2", 0, 3}, kMoeCases[0], kMoeCases[1], kMoeCases[2], kMoeCases[3]),
    case_name);

INSTANTIATE_TEST_SUITE_P(Layouts, GradSyncMoeZero3, ::testing::ValuesIn(kMoeCases), case_name);

}  // namespace
}  // namespace ndmesh::parallel
