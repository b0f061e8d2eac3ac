// Building a ZeRO-3 model allocates sharded from the start (issue 60 item 5): a rank's
// resident set while its model is built (parallelize, the gradient sync that frees what the
// rank does not keep, the optimizer) grows by its shard of the parameters and the one
// tensor that initialisation draws at a time, not by the full parameter and gradient
// buffers. Two in-process ranks (comm/inproc.hpp) build a dp=2 ZeRO-3 model of about 46 MB
// of parameters; the process's peak resident set (VmHWM, reset through
// /proc/self/clear_refs first) may grow by at most 2 x (shard + largest tensor) + slack.
// Then, on a tiny model, the blocks a rank keeps hold the initial values of the layout
// without ZeRO.
#include <algorithm>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "ndmesh/comm/inproc.hpp"
#include "ndmesh/comm/process_groups.hpp"
#include "ndmesh/parallel/grad_sync.hpp"
#include "ndmesh/parallel/optimizer.hpp"
#include "ndmesh/parallel/parallelize.hpp"
#include "support/model_fixtures.hpp"

namespace ndmesh::parallel {
namespace {

// A field of /proc/self/status in bytes ("VmRSS", "VmHWM").
std::int64_t status_bytes(const std::string& key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key + ":", 0) == 0) return std::stoll(line.substr(key.size() + 1)) * 1024;
  ADD_FAILURE() << key << " not in /proc/self/status";
  return 0;
}

TrainOptions zero3_options(const ModelSpec& spec) {
  TrainOptions o{.model = spec, .batch = 2, .micro_batch = 1, .steps = 1, .seed = 3};
  o.dp.zero = 3;
  return o;
}

TEST(Zero3BuildMemory, PeakIsTheShardPlusOneTensor) {
  ModelSpec spec = with_arch(ModelSpec{}, "gpt2");
  spec.layers = 3, spec.hidden = 512, spec.heads = 8, spec.seq = 16, spec.vocab = 4096;
  constexpr int kRanks = 2;
  const Mesh mesh = Mesh::parse("dp=2");
  std::vector<std::int64_t> size(kRanks), largest(kRanks);
  const std::int64_t before = status_bytes("VmRSS");
  {
    std::ofstream clear("/proc/self/clear_refs");
    clear << "5";  // VmHWM := VmRSS
  }
  ASSERT_LE(status_bytes("VmHWM"), before + (4 << 20)) << "the peak was not reset by /proc/self/clear_refs";
  comm::inproc::run(kRanks, [&](const comm::Communicator& world) {
    testing_support::single_blas_thread();
    ProcessGroups groups(mesh, world);
    const TrainOptions o = zero3_options(spec);
    RankModel model = parallelize(o, groups);
    GradSync sync(model, groups, o.dp);
    Optimizer optimizer(model, sync, o.adamw);
    const auto r = static_cast<std::size_t>(world.rank());
    ASSERT_EQ(model.chunks.size(), 1u);
    size[r] = model.chunks[0]->params().size();
    for (const ParamView& v : model.chunks[0]->params().views())
      largest[r] = std::max(largest[r], v.full_numel());
    world.barrier();  // both models built before either is taken down
  });
  const std::int64_t grown = status_bytes("VmHWM") - before;
  const std::int64_t full = size[0] * 4;
  // The buffers must be over glibc's largest mmap threshold (32 MiB), so that the
  // allocation itself cannot come from pages the process touched before.
  ASSERT_GT(full, 32 << 20);
  std::int64_t allowed = 24 << 20;  // threads, groups, activations, allocator slack
  for (int r = 0; r < kRanks; ++r) allowed += (size[r] / kRanks + largest[r]) * 4;
  EXPECT_LE(grown, allowed) << "building grew the resident set by " << (grown >> 20)
                            << " MiB; the two ranks' "
                            << "shards and one tensor each are " << ((allowed >> 20) - 24)
                            << " MiB; the full buffers are " << (full >> 20) << " MiB per rank";
  std::cout << "peak growth " << (grown >> 20) << " MiB, allowed " << (allowed >> 20) << " MiB, full params "
            << (full >> 20) << " MiB per rank\n";
}

// What a rank keeps of each unit range (GradReducer::shard) holds the initial value of the
// same parameter and element in the same layout without ZeRO (whose initialisation writes
// every element): a tp slice, a padded vocabulary's rows (tiny_spec's 14 tokens padded to
// 64), a pipeline stage's copy of the tied token table.
TEST(Zero3BuildMemory, KeptBlocksHoldTheInitialValuesOfTheLayoutWithoutZero) {
  const ModelSpec spec = testing_support::tiny_spec();
  for (const char* layout : {"dp=2", "dp=2,tp=2", "dp=2,pp=2"}) {
    const Mesh mesh = Mesh::parse(layout);
    comm::inproc::run(static_cast<int>(mesh.world_size()), [&](const comm::Communicator& world) {
      testing_support::single_blas_thread();
      ProcessGroups groups(mesh, world);
      TrainOptions o = zero3_options(spec);
      o.batch = 4;
      RankModel model = parallelize(o, groups);
      GradSync sync(model, groups, o.dp);
      o.dp.zero = 0;
      const RankModel reference = parallelize(o, groups);
      ASSERT_EQ(model.chunks.size(), reference.chunks.size());
      for (std::size_t c = 0; c < model.chunks.size(); ++c) {
        const ParamStore<float>& store = model.chunks[c]->params();
        const ParamStore<float>& ref = reference.chunks[c]->params();
        std::int64_t checked = 0;
        for (const nn::Segment& own : sync.reducer(c).shard())
          for (const ParamView& v : store.views()) {
            const std::int64_t lo = std::max(own.offset, v.offset);
            const std::int64_t hi = std::min(own.offset + own.count, v.offset + v.numel);
            const int id = ref.find(v.name);
            ASSERT_GE(id, 0) << v.name;
            ASSERT_EQ(ref.view(id).shape, v.shape) << v.name;
            for (std::int64_t i = lo; i < hi; ++i, ++checked)
              ASSERT_EQ(store.params()[static_cast<std::size_t>(i)], ref.param(id)[i - v.offset])
                  << layout << ": " << v.name << " element " << (i - v.offset) << " on rank " << world.rank();
          }
        EXPECT_GT(checked, store.parameter_count() / 4) << layout << ", rank " << world.rank();
      }
    });
  }
}

}  // namespace
}  // namespace ndmesh::parallel
