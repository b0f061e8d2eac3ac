// GradReducer on in-process jobs of 1 to 4 ranks (comm/inproc.hpp):
//  - with a real model's backward driving it (grads-final watermarks, progress hooks),
//    every option (overlap, progress thread, ZeRO 1, 2 and 3, micro-batches, every all-reduce
//    algorithm, bf16) gives each element of the gradient, on exactly one owner, the serial
//    model's gradient over the whole batch; a failure names the tensor;
//  - buckets start only above the watermark and in order, and no earlier: what the model
//    writes below it after the call still counts;
//  - no-sync micro-batches only accumulate; ZeRO's shards cover the buffer once and
//    gather_params hands every rank every owner's block;
//  - ZeRO-3: the ParamGatherer holds a unit's parameters exactly between its Begin and End
//    events (freed ranges read NaN or zero, never the values), prefetches the next unit,
//    keeps the units after the forward when told, and a shared range until its last user;
//  - the progress thread completes the buckets alone, also after an idle gap longer than
//    the timeout (issue 22 item 4: its clock restarts when it is handed work).
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "ndmesh/comm/inproc.hpp"
#include "ndmesh/parallel/dp/grad_reducer.hpp"
#include "support/model_fixtures.hpp"

namespace ndmesh::parallel {
namespace {

using comm::AllReduceAlgorithm;
using comm::Communicator;
using testing_support::Batch;
using testing_support::SerialReference;

struct Case {
  std::string name;
  int ranks = 2;
  int micro = 1;  // micro-batches per step
  DataParallelOptions options;
  bool buckets = false;  // ZeRO 2 in bucket_mb buckets, not per unit (the trainer's path on a GPU)
};

// Bytes of a bucket of `floats` elements, as bucket_mb.
double mb_of(std::int64_t floats) { return static_cast<double>(floats * 4) / (1024.0 * 1024.0); }

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class GradReducerModel : public ::testing::TestWithParam<Case> {};

// Each rank trains on its slice of a global batch of 12 sequences, in `micro` micro-batches,
// with the reducer hooked into the model as the trainer hooks it; the gradients it owns
// afterwards are gathered (each element from its one owner) and compared by name with the
// serial model's over the whole batch.
TEST_P(GradReducerModel, OwnedGradientsEqualTheSerialRunByName) {
  const Case& c = GetParam();
  const ModelSpec spec = testing_support::tiny_spec();
  const std::int64_t global = 12, local = global / c.ranks, micro = local / c.micro;
  ASSERT_EQ(micro * c.micro * c.ranks, global) << c.name;
  const Batch batch = testing_support::make_batch(spec, global, 5);
  const SerialReference ref(spec, batch);
  comm::inproc::run(c.ranks, [&](const Communicator& world) {
    testing_support::single_blas_thread();
    const int r = world.rank(), p = world.size();
    const bool zero3 = c.options.zero == 3 && p > 1;
    // ZeRO 2 and 3 reduce per unit, as the trainer does on the CPU (parallel/dp/apply.cpp).
    const bool per_unit = c.options.zero >= 2 && p > 1 && !c.buckets;
    const StoreOptions store{.pad_to = c.options.zero > 0 ? p : 1, .pad_units = per_unit};
    model::Decoder gpt(spec, {.batch = micro, .fuse_closing_add = !per_unit}, {}, {}, store);
    gpt.set_loss_weight(1.0 / static_cast<double>(global * spec.seq));
    GradReducer reducer(world, gpt.params().size(), c.options,
                        per_unit ? gpt.unit_ranges() : std::vector<nn::Segment>{});
    EXPECT_EQ(reducer.per_unit(), per_unit) << c.name;
    // ZeRO-3: the parameters sharded like the gradients, gathered around each unit's use.
    std::unique_ptr<ParamGatherer> gatherer;
    if (zero3) {
      gatherer = std::make_unique<ParamGatherer>(world, gpt.params().params().data(), gpt.unit_ranges(), gpt.units(),
                                                 gpt.backward_units(), c.options.zero3);
      gpt.set_unit_hook([&](model::UnitEvent e, int unit) { gatherer->on_unit(e, unit); });
    }
    gpt.set_grads_final_hook([&](std::int64_t from) { reducer.grads_final(from); });
    gpt.set_progress_hook([&] { reducer.progress(); });
    // bf16: the bound on a sum of p bf16-rounded terms needs the magnitudes of the terms
    // reduced: the per-rank gradients (of each micro-batch under ZeRO 2, which reduces every
    // micro-batch), summed over ranks and micro-batches.
    std::vector<float> abs_sum(static_cast<std::size_t>(gpt.params().size()), 0.0f);
    if (c.options.bf16) {
      model::Decoder plain(spec, {.batch = micro, .fuse_closing_add = !per_unit}, {}, {}, store);
      plain.set_loss_weight(1.0 / static_cast<double>(global * spec.seq));
      plain.params().zero_grad();
      for (int m = 0; m < c.micro; ++m) {
        const Batch b = batch.slice(r * local + m * micro, micro);
        plain.forward(b.tokens.data(), b.targets.data());
        plain.backward();
        if (c.options.zero >= 2 || m + 1 == c.micro) {
          for (std::size_t i = 0; i < abs_sum.size(); ++i) abs_sum[i] += std::abs(plain.params().grads()[i]);
          plain.params().zero_grad();
        }
      }
      world.all_reduce(std::span<float>(abs_sum));
    }
    gpt.params().zero_grad();
    reducer.zero_shard_grads();
    for (int m = 0; m < c.micro; ++m) {
      reducer.begin_backward(gpt.params().grads().data(), m + 1 == c.micro);
      const Batch b = batch.slice(r * local + m * micro, micro);
      gpt.forward(b.tokens.data(), b.targets.data());
      gpt.backward();
      reducer.finish_backward();
    }
    // Without ZeRO every rank owns every element; with it, each element has one owner,
    // and a sum of zero-filled buffers gathers them (and counts the coverage too).
    std::vector<float> owned(gpt.params().grads().begin(), gpt.params().grads().end());
    if (reducer.zero() > 0) {
      std::fill(owned.begin(), owned.end(), 0.0f);
      reducer.for_each_owned(
          gpt.params().grads().data(), 0, gpt.params().size(),
          [&](const float* g, std::int64_t n, std::int64_t at) { std::copy(g, g + n, owned.begin() + at); });
      world.all_reduce(std::span<float>(owned));
    }
    if (!c.options.bf16) {
      EXPECT_TRUE(testing_support::same_by_name(gpt.params(), owned, ref.model().params(),
                                                ref.model().params().grads()))
          << c.name << ", rank " << r;
      return;
    }
    // bf16: each of the p terms is rounded to bf16 once and each partial sum once more,
    // so an element is within about p * u * sum_r |g_r| of the exact sum (u = 2^-8, the
    // unit roundoff of bf16's 8-bit significand), on top of the fp32 tolerance of the
    // other cases (summation order).
    const double u = std::ldexp(1.0, -8);
    const testing_support::Tolerance fp32;
    const auto& want = ref.model().params().grads();
    std::int64_t bad = 0;
    for (const ParamView& v : gpt.params().views()) {
      // The serial model's offset of the same parameter (ZeRO-3 pads the units).
      const std::int64_t shift = ref.model().params().view(ref.model().params().find(v.name)).offset - v.offset;
      double max_want = 0;
      for (std::int64_t i = v.offset; i < v.offset + v.numel; ++i)
        max_want = std::max(max_want, std::abs(static_cast<double>(want[i + shift])));
      for (std::int64_t i = v.offset; i < v.offset + v.numel; ++i) {
        const double bound = (p + 1) * u * abs_sum[static_cast<std::size_t>(i)] +
                             fp32.rel * std::abs(want[i + shift]) + fp32.scale * max_want;
        if (std::abs(owned[static_cast<std::size_t>(i)] - want[i + shift]) > bound && bad++ == 0)
          ADD_FAILURE() << fmt::format(
              "{}, rank {}: first differing tensor {} element {}: {:.6g} vs serial {:.6g}, "
              "bound {:.3g}",
              c.name, r, v.name, i - v.offset, owned[static_cast<std::size_t>(i)], want[i + shift], bound);
      }
    }
    EXPECT_EQ(bad, 0) << c.name << ", rank " << r;
  });
}

const double kSmall = mb_of(256);  // several buckets for the tiny model (about 4k parameters)

INSTANTIATE_TEST_SUITE_P(
    Options, GradReducerModel,
    ::testing::Values(
        Case{"one rank", 1, 1, {}}, Case{"dp 2", 2, 1, {}},
        Case{"dp 3, small buckets", 3, 1, {.bucket_mb = kSmall}},
        Case{"dp 4, micro-batches", 4, 3, {.bucket_mb = kSmall}},
        Case{"no overlap", 2, 1, {.bucket_mb = kSmall, .overlap = false}},
        Case{"no overlap, micro-batches", 2, 2, {.bucket_mb = kSmall, .overlap = false}},
        Case{"no progress thread", 3, 2, {.bucket_mb = kSmall, .progress_thread = false}},
        Case{"no progress thread, ring",
             2,
             1,
             {.bucket_mb = kSmall, .algorithm = AllReduceAlgorithm::kRing, .progress_thread = false}},
        Case{"ZeRO 1", 3, 2, {.bucket_mb = kSmall, .zero = 1}},
        Case{"ZeRO 2", 4, 3, {.bucket_mb = kSmall, .zero = 2}},
        Case{"ZeRO 2, no overlap", 2, 2, {.bucket_mb = kSmall, .overlap = false, .zero = 2}},
        Case{"ZeRO 2 in buckets", 3, 2, {.bucket_mb = kSmall, .zero = 2}, true},
        Case{"bf16 ZeRO 2 in buckets", 2, 2, {.bucket_mb = kSmall, .zero = 2, .bf16 = true}, true},
        Case{"ring", 4, 1, {.bucket_mb = kSmall, .algorithm = AllReduceAlgorithm::kRing}},
        Case{"ring, dp 3", 3, 1, {.bucket_mb = kSmall, .algorithm = AllReduceAlgorithm::kRing}},
        Case{"tree", 4, 1, {.bucket_mb = kSmall, .algorithm = AllReduceAlgorithm::kTree}},
        Case{"tree, micro-batches", 4, 3, {.bucket_mb = kSmall, .algorithm = AllReduceAlgorithm::kTree}},
        Case{"hierarchical",
             4,
             1,
             {.bucket_mb = kSmall, .algorithm = AllReduceAlgorithm::kHierarchical, .ranks_per_node = 2}},
        Case{"bf16", 3, 1, {.bucket_mb = kSmall, .bf16 = true}},
        Case{"bf16 ZeRO 1", 2, 2, {.bucket_mb = kSmall, .zero = 1, .bf16 = true}},
        Case{"bf16 ZeRO 2", 4, 3, {.bucket_mb = kSmall, .zero = 2, .bf16 = true}},
        Case{"ZeRO 3", 2, 1, {.zero = 3}},
        Case{"ZeRO 3, dp 3, micro-batches", 3, 2, {.zero = 3}},
        Case{"ZeRO 3, dp 4, no prefetch", 4, 3, {.zero = 3, .zero3 = {.prefetch = false}}},
        Case{"ZeRO 3, keep after forward",
             2,
             2,
             {.overlap = false, .zero = 3, .zero3 = {.reshard_after_forward = false}}},
        Case{"bf16 ZeRO 3", 3, 2, {.zero = 3, .bf16 = true}}),
    [](const ::testing::TestParamInfo<Case>& param_info) {
      std::string s;
      for (char ch : param_info.param.name) s += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
      return s;
    });

// Rank r's gradient element i before the reduction: small integers, exact in any order.
float local_grad(int r, std::int64_t i) { return static_cast<float>((r + 1) * ((i % 7) - 3)); }
float summed(int p, std::int64_t i) { return static_cast<float>(p * (p + 1) / 2 * ((i % 7) - 3)); }

TEST(GradReducer, BucketsStartInOrderOnlyAboveTheWatermark) {
  comm::inproc::run(3, [](const Communicator& world) {
    const int r = world.rank(), p = world.size();
    const std::int64_t n = 1000;  // buckets of 96 from the end: the last one holds 40
    GradReducer reducer(world, n, {.bucket_mb = mb_of(96), .progress_thread = false});
    ASSERT_EQ(reducer.buckets(), 11u);
    std::vector<float> g(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) g[static_cast<std::size_t>(i)] = local_grad(r, i);
    reducer.begin_backward(g.data(), true);
    // Final from 950: no bucket (the last one is [904, 1000)); from 904: one; from 500:
    // those above 520 (five); the watermark need not fall on a bucket boundary.
    for (auto [from, started] :
         {std::pair<std::int64_t, std::int64_t>{950, 0}, {904, 1}, {500, 5}, {0, 11}}) {
      if (from < 904) {
        // The "backward" writes more gradient just below the watermark before reporting it.
        for (std::int64_t i = from; i < std::min<std::int64_t>(from + 10, n); ++i)
          g[static_cast<std::size_t>(i)] += 1.0f;
      }
      reducer.grads_final(from);
      const std::int64_t bytes = started == 11 ? n * 4 : started * 96 * 4;
      EXPECT_EQ(reducer.reduced_bytes(), bytes) << "final from " << from;
    }
    reducer.finish_backward();
    for (std::int64_t i = 0; i < n; ++i) {
      const bool bumped = (i >= 500 && i < 510) || (i < 10);
      ASSERT_EQ(g[static_cast<std::size_t>(i)], summed(p, i) + (bumped ? static_cast<float>(p) : 0.0f)) << i;
    }
  });
}

TEST(GradReducer, NoSyncMicroBatchesOnlyAccumulate) {
  comm::inproc::run(2, [](const Communicator& world) {
    const int r = world.rank();
    const std::int64_t n = 300;
    GradReducer reducer(world, n, {.bucket_mb = mb_of(64)});
    std::vector<float> g(static_cast<std::size_t>(n), 0.0f);
    for (int m = 0; m < 3; ++m) {
      reducer.begin_backward(g.data(), m == 2);
      for (std::int64_t i = 0; i < n; ++i) g[static_cast<std::size_t>(i)] += local_grad(r, i);
      reducer.grads_final(0);
      reducer.finish_backward();
      if (m < 2) {
        EXPECT_EQ(reducer.reduced_bytes(), 0) << "micro-batch " << m;
        for (std::int64_t i = 0; i < n; ++i)
          ASSERT_EQ(g[static_cast<std::size_t>(i)], static_cast<float>(m + 1) * local_grad(r, i));
      }
    }
    EXPECT_EQ(reducer.reduced_bytes(), n * 4);
    for (std::int64_t i = 0; i < n; ++i) ASSERT_EQ(g[static_cast<std::size_t>(i)], 3.0f * summed(2, i));
  });
}

TEST(GradReducer, ZeroShardsCoverTheBufferOnceAndGatherParams) {
  for (int zero : {1, 2})
    comm::inproc::run(4, [&](const Communicator& world) {
      const int r = world.rank(), p = world.size();
      const std::int64_t n = 4 * 131;  // a multiple of the group size, buckets of 48
      GradReducer reducer(world, n, {.bucket_mb = mb_of(48), .zero = zero});
      // The shard: each bucket's block r, ascending; together the ranks own each element once.
      std::vector<std::int64_t> owner(static_cast<std::size_t>(n), 0);
      for (const nn::Segment& s : reducer.shard())
        for (std::int64_t i = s.offset; i < s.offset + s.count; ++i)
          owner[static_cast<std::size_t>(i)] += 1 << (4 * r);
      world.all_reduce(std::span<std::int64_t>(owner));
      for (std::int64_t i = 0; i < n; ++i) {
        const std::int64_t o = owner[static_cast<std::size_t>(i)];
        ASSERT_TRUE(o == 1 || o == 16 || o == 256 || o == 4096) << "element " << i << " has owners " << o;
      }
      // Two micro-batches: ZeRO 2 reduce-scatters each into the shard; ZeRO 1 once.
      std::vector<float> g(static_cast<std::size_t>(n), 0.0f);
      reducer.zero_shard_grads();
      for (int m = 0; m < 2; ++m) {
        reducer.begin_backward(g.data(), m == 1);
        for (std::int64_t i = 0; i < n; ++i) g[static_cast<std::size_t>(i)] += local_grad(r, i);
        reducer.grads_final(0);
        reducer.finish_backward();
      }
      std::int64_t seen = 0;
      reducer.for_each_owned(g.data(), 0, n, [&](const float* x, std::int64_t count, std::int64_t at) {
        for (std::int64_t k = 0; k < count; ++k) ASSERT_EQ(x[k], 2.0f * summed(p, at + k)) << "zero " << zero;
        seen += count;
      });
      EXPECT_EQ(seen, n / p);
      // gather_params: every rank ends with each owner's block.
      std::vector<float> params(static_cast<std::size_t>(n), -1.0f);
      for (const nn::Segment& s : reducer.shard())
        for (std::int64_t i = s.offset; i < s.offset + s.count; ++i)
          params[static_cast<std::size_t>(i)] = static_cast<float>(i);
      reducer.gather_params(params.data());
      for (std::int64_t i = 0; i < n; ++i)
        ASSERT_EQ(params[static_cast<std::size_t>(i)], static_cast<float>(i));
    });
}

// ZeRO-3, and ZeRO-2 given the units: a unit's reduce-scatter, once complete, is added to
// the shard and its full-size range handed back during the backward (at the next hook), not
// after it: while unit k is written the units above it are already gone, so the work
// space's measured resident peak is about one unit, not the buffer; two micro-batches
// accumulate in the shard.
TEST(GradReducer, Zero2And3RetireEachUnitDuringTheBackward) {
  for (int zero : {2, 3}) {
    for (bool thread : {false, true}) {
      comm::inproc::run(2, [&](const Communicator& world) {
        const int r = world.rank(), p = world.size();
        const auto page = static_cast<std::int64_t>(sysconf(_SC_PAGESIZE));
        const std::int64_t unit = 16 * page / 4, units = 8, n = unit * units;
        std::vector<nn::Segment> ranges;
        for (std::int64_t k = 0; k < units; ++k) ranges.push_back({k * unit, unit});
        // Pages of its own (mmap): untouched ones are not resident, as in the trainer's buffer.
        void* mem = mmap(nullptr, static_cast<std::size_t>(n * 4), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                         -1, 0);
        ASSERT_NE(mem, MAP_FAILED);
        float* g = static_cast<float*>(mem);
        GradReducer reducer(world, n, {.zero = zero, .progress_thread = thread}, ranges);
        ASSERT_TRUE(reducer.per_unit());
        // Unit k is retired when its part of the shard holds the sum over m + 1 micro-batches
        // (reading the released range itself would map the zero page, which mincore counts).
        auto retired = [&](std::int64_t k, int m) {
          bool all = true;
          reducer.for_each_owned(g, k * unit, unit, [&](const float* x, std::int64_t count, std::int64_t at) {
            for (std::int64_t i = 0; i < count; ++i)
              all = all && x[i] == static_cast<float>(m + 1) * summed(p, k * unit + at + i);
          });
          return all;
        };
        reducer.zero_shard_grads();
        for (int m = 0; m < 2; ++m) {
          reducer.begin_backward(g, m == 1);
          for (std::int64_t k = units; k-- > 0;) {
            for (std::int64_t i = k * unit; i < (k + 1) * unit; ++i) g[i] += local_grad(r, i);
            reducer.grads_final(k * unit);
            // The "backward" goes on: polled between its sub-layers, the unit is retired.
            const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
            while (!retired(k, m) && std::chrono::steady_clock::now() < deadline) {
              reducer.progress();
              std::this_thread::sleep_for(std::chrono::microseconds(50));
            }
            ASSERT_TRUE(retired(k, m)) << "ZeRO " << zero << ": unit " << k << " still held during the backward, thread "
                                       << thread;
          }
          reducer.finish_backward();
        }
        // Sampled as each unit ends: that unit, the others retired (plus a page at each edge).
        EXPECT_GT(reducer.peak_workspace_bytes(), 0);
        EXPECT_LE(reducer.peak_workspace_bytes(), unit * 4 + 2 * page) << "ZeRO " << zero << ", thread " << thread;
        std::int64_t seen = 0;
        reducer.for_each_owned(g, 0, n, [&](const float* x, std::int64_t count, std::int64_t at) {
          for (std::int64_t k = 0; k < count; ++k) ASSERT_EQ(x[k], 2.0f * summed(p, at + k)) << at + k;
          seen += count;
        });
        EXPECT_EQ(seen, n / p);
        munmap(mem, static_cast<std::size_t>(n * 4));
      });
    }
  }
}

TEST(ParamGatherer, HoldsAUnitExactlyBetweenItsEventsAndPrefetchesTheNext) {
  using model::UnitEvent;
  for (int p : {2, 3})
    for (bool keep : {false, true})
      comm::inproc::run(p, [&](const Communicator& world) {
        const int r = world.rank();
        // Three ranges of 3 pages each (whole pages freed, NaN on the shared ones); unit 2
        // also reads range 0 (a tied head).
        const std::int64_t len = 3 * 1024 * p;
        const std::vector<nn::Segment> ranges = {{0, len}, {len, len}, {2 * len, len}};
        const std::vector<model::ParamUnit> units = {{"embed", model::UnitKind::kEmbedding, {0}},
                                                     {"block.0", model::UnitKind::kBlock, {1}},
                                                     {"head", model::UnitKind::kHead, {2, 0}}};
        const auto value = [](std::int64_t i) { return static_cast<float>(i % 1000) + 1.0f; };
        std::vector<float> params(static_cast<std::size_t>(3 * len));
        for (std::int64_t i = 0; i < 3 * len; ++i) params[static_cast<std::size_t>(i)] = value(i);
        ParamGatherer g(world, params.data(), ranges, units, {2, 1}, {.reshard_after_forward = !keep});
        // state[k]: 1 range k reads its values everywhere; 0 only on the own block (freed);
        // -1 a gather in flight (not looked at).
        auto check = [&](std::vector<int> state, const char* when) {
          for (std::size_t k = 0; k < 3; ++k) {
            const nn::Segment own = g.shard()[k];
            ASSERT_EQ(own.count, len / p);
            ASSERT_EQ(own.offset, ranges[k].offset + r * len / p);
            if (state[k] < 0) continue;
            for (std::int64_t i = ranges[k].offset; i < ranges[k].offset + len; ++i) {
              const bool mine = i >= own.offset && i < own.offset + own.count;
              const float x = params[static_cast<std::size_t>(i)];
              if (state[k] == 1 || mine)
                ASSERT_EQ(x, value(i)) << when << ": range " << k << " element " << i;
              else
                ASSERT_TRUE(std::isnan(x) || x == 0.0f) << when << ": range " << k << " element " << i << " = " << x;
            }
          }
        };
        const int kept = keep ? 1 : 0, kept_or_flight = keep ? 1 : -1;
        check({0, 0, 0}, "after construction");
        g.on_unit(UnitEvent::kForwardBegin, 0);  // gathers 0, prefetches 1
        EXPECT_EQ(g.gathers(), 2);
        check({1, -1, 0}, "embed forward");
        g.on_unit(UnitEvent::kForwardEnd, 0);
        g.on_unit(UnitEvent::kForwardBegin, 1);  // prefetched; prefetches the head's 2 (and 0 unless kept)
        check({kept_or_flight, 1, -1}, "block forward");
        g.on_unit(UnitEvent::kForwardEnd, 1);
        g.on_unit(UnitEvent::kForwardBegin, 2);
        check({1, kept, 1}, "head forward");
        g.on_unit(UnitEvent::kForwardEnd, 2);
        EXPECT_EQ(g.gathers(), keep ? 3 : 4);
        check({kept, kept, kept}, "after the forward");
        g.on_unit(UnitEvent::kBackwardBegin, 2);  // prefetches block 0 (unless kept)
        check({1, kept_or_flight, 1}, "head backward");
        g.on_unit(UnitEvent::kBackwardEnd, 2);
        g.on_unit(UnitEvent::kBackwardBegin, 1);
        check({0, 1, 0}, "block backward");
        g.on_unit(UnitEvent::kBackwardEnd, 1);
        check({0, 0, 0}, "after the backward");
        EXPECT_EQ(g.gathers(), keep ? 3 : 7);
        // The most elements of other ranks' blocks resident at once: all three ranges (the
        // block's forward prefetches the head's two).
        EXPECT_EQ(g.peak_gathered_elements(), 3 * len / p * (p - 1));
        g.free_all();
        check({0, 0, 0}, "free_all");
      });
}

// Waits up to `limit` for the progress thread to have seen `want` completions, without
// polling the reductions from this thread.
bool thread_completes(const GradReducer& reducer, std::int64_t want, double limit) {
  const auto t0 = std::chrono::steady_clock::now();
  while (reducer.thread_completions() < want) {
    if (std::chrono::steady_clock::now() - t0 > std::chrono::duration<double>(limit)) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

TEST(GradReducer, TheProgressThreadCompletesBucketsAloneAfterAnIdleGapLongerThanTheTimeout) {
  // Timeout 0.5 s, gap 0.7 s. Rank 1 starts each step 50 ms after rank 0, so rank 0's
  // thread polls at least once without completing; a thread whose clock ran through the
  // gap gave up at that poll and left rank 0's buckets to finish_backward.
  comm::inproc::run(
      2,
      [](const Communicator& world) {
        const int r = world.rank();
        const std::int64_t n = 512;
        GradReducer reducer(world, n, {.bucket_mb = mb_of(128)});
        ASSERT_TRUE(reducer.progress_thread());
        std::vector<float> g(static_cast<std::size_t>(n));
        for (int step = 0; step < 2; ++step) {
          if (step == 1)
            std::this_thread::sleep_for(std::chrono::milliseconds(700));  // evaluation, a checkpoint
          if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(50));
          for (std::int64_t i = 0; i < n; ++i) g[static_cast<std::size_t>(i)] = local_grad(r, i);
          reducer.begin_backward(g.data(), true);
          reducer.grads_final(0);  // hands all four buckets to the thread
          EXPECT_TRUE(thread_completes(reducer, 4 * (step + 1), 10.0))
              << "rank " << r << " step " << step << ": the progress thread completed "
              << reducer.thread_completions() << " buckets";
          reducer.finish_backward();
          for (std::int64_t i = 0; i < n; ++i) ASSERT_EQ(g[static_cast<std::size_t>(i)], summed(2, i));
        }
      },
      {.timeout_s = 0.5});
}

TEST(GradReducer, AReductionThatCannotCompleteTimesOutOnceNotTwice) {
  // Timeout 0.5 s; rank 1 never reduces. Rank 0's progress thread polls for 0.5 s and gives
  // up; finish_backward then ends the job at once (after a grace of 0.05 s) instead of
  // waiting a second timeout of its own (it took 1.0 s before).
  double seconds = 0;
  std::string what;
  try {
    comm::inproc::run(
        2,
        [&](const Communicator& world) {
          const std::int64_t n = 512;
          GradReducer reducer(world, n, {.bucket_mb = mb_of(128)});
          std::vector<float> g(static_cast<std::size_t>(n), 1.0f);
          if (world.rank() == 1) {
            std::this_thread::sleep_for(std::chrono::milliseconds(1500));
            return;
          }
          ASSERT_TRUE(reducer.progress_thread());
          reducer.begin_backward(g.data(), true);
          const auto t0 = std::chrono::steady_clock::now();
          reducer.grads_final(0);
          try {
            reducer.finish_backward();
          } catch (...) {
            seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            throw;
          }
        },
        {.timeout_s = 0.5});
  } catch (const comm::TimeoutError& e) {
    what = e.what();
  }
  EXPECT_NE(what.find("all_reduce on group "), std::string::npos) << what;
  EXPECT_NE(what.find("timed out after 0.5 s: gradient bucket 0 of 4 (and 3 more)"), std::string::npos) << what;
  EXPECT_GE(seconds, 0.5);
  EXPECT_LT(seconds, 0.9) << "a second timeout ran after the progress thread's";
}

}  // namespace
}  // namespace ndmesh::parallel
