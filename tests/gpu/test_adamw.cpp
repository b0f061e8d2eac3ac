// cuda::adamw_update against nn::AdamW<float>::update over three steps: a store with a
// decayed matrix and an undecayed vector of odd sizes, gradients large enough that the
// global-norm clipping acts, the moments carried from step to step on both sides.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "gpu_test.hpp"
#include "ndmesh/core/dtype.hpp"
#include "ndmesh/nn/adamw.hpp"
#include "ndmesh/nn/cuda_ops.hpp"
#include "ndmesh/tensor/ops.hpp"

namespace ndmesh {
namespace {

using namespace testing;  // gpu_test.hpp

TEST(CudaAdamW, ThreeStepsMatchTheCpu) {
  NDMESH_GPU_OR_SKIP();
  ParamStore<float> store;
  const int matrix = store.add("w", {33, 31}, true), vector = store.add("b", {771}, false);
  store.allocate();
  const auto w0 = normal(static_cast<std::size_t>(store.size()), 1, 0.1f);
  std::copy(w0.begin(), w0.end(), store.params().begin());
  const nn::AdamWOptions options{.clip_norm = 1.0};
  nn::AdamW<float> cpu(store, options);

  const auto n = static_cast<std::size_t>(store.size());
  DeviceBuffer w = to_device(w0), m = to_device(std::vector<float>(n, 0.0f)),
               v = to_device(std::vector<float>(n, 0.0f));
  for (int step = 1; step <= 3; ++step) {
    const auto g = normal(n, 10 + static_cast<std::uint64_t>(step));  // norm ~ 40: clipped to 1
    std::copy(g.begin(), g.end(), store.grads().begin());
    const double lr = 1e-2 / step;
    // The norm the caller computes (cuda::square_sum on the device; test_elementwise checks it).
    const double norm = std::sqrt(nn::AdamW<float>::grad_square_sum(store));
    cpu.update(store, lr, norm);

    DeviceBuffer dg = to_device(g);
    const double clip = norm > options.clip_norm ? options.clip_norm / norm : 1.0;
    const double c1 = 1.0 - std::pow(options.beta1, step), c2 = 1.0 - std::pow(options.beta2, step);
    for (int id : {matrix, vector}) {
      const ParamView& view = store.view(id);
      const double decay = view.decay ? options.weight_decay : 0.0;
      cuda::adamw_update(ptr<float>(w) + view.offset, ptr<float>(dg) + view.offset,
                         ptr<float>(m) + view.offset, ptr<float>(v) + view.offset, view.numel, lr,
                         options.beta1, options.beta2, options.eps, decay, clip, c1, c2);
    }
    // Each element is the same sequence of IEEE double operations on both sides (the
    // kernel contracts nothing into an FMA), rounded once to float: equal. One float ulp
    // (rtol 2^-23) allows a host build that contracts; a wrong term is off by far more.
    // Padding elements are updated by neither side (zero on both).
    const auto pick = [&](const std::vector<float>& all) {
      std::vector<float> out;
      for (int id : {matrix, vector}) {
        const ParamView& view = store.view(id);
        out.insert(out.end(), all.begin() + view.offset, all.begin() + view.offset + view.numel);
      }
      return out;
    };
    const std::vector<float> cpu_w(store.params().begin(), store.params().end());
    const std::vector<float> cpu_m(cpu.m().begin(), cpu.m().end()), cpu_v(cpu.v().begin(), cpu.v().end());
    EXPECT_TRUE(all_close(pick(to_host<float>(w, n)), pick(cpu_w), 0, 1.2e-7))
        << "parameters after step " << step;
    EXPECT_TRUE(all_close(pick(to_host<float>(m, n)), pick(cpu_m), 0, 1.2e-7))
        << "first moment after step " << step;
    EXPECT_TRUE(all_close(pick(to_host<float>(v, n)), pick(cpu_v), 0, 1.2e-7))
        << "second moment after step " << step;
  }
}

// nn::AdamW on a CUDA store: every parameter tensor in one adamw_update_multi launch, the
// CPU's update bit for bit (the same IEEE double operations per element; 1.2e-7 relative,
// one float ulp, allows a host build that contracts, as above). A piece updated twice, or
// one skipped, or a decay on the wrong tensor is off by far more.
TEST(CudaAdamW, TheLayerOnCudaIsOneLaunchThatMatchesTheCpu) {
  NDMESH_GPU_OR_SKIP();
  auto build = [](ParamStore<float>& store) {
    store.add("w", {33, 31}, true);
    store.add("b", {771}, false);
    store.add("w2", {5000}, true);  // over one chunk of the multi-tensor kernel
    store.allocate();
  };
  ParamStore<float> cpu_store, gpu_store;
  build(cpu_store);
  build(gpu_store);
  const auto n = static_cast<std::size_t>(cpu_store.size());
  const auto w0 = normal(n, 1, 0.1f);
  std::copy(w0.begin(), w0.end(), cpu_store.params().begin());
  gpu_store.params_from_host(w0.data());
  gpu_store.to(Device::kCuda);
  const nn::AdamWOptions options{.clip_norm = 1.0};
  nn::AdamW<float> cpu(cpu_store, options), gpu(gpu_store, options);
  for (int step = 1; step <= 3; ++step) {
    const auto g = normal(n, 20 + static_cast<std::uint64_t>(step));
    std::copy(g.begin(), g.end(), cpu_store.grads().begin());
    cuda::copy_to_device(gpu_store.grads().data(), g.data(), n * sizeof(float));
    const double norm = std::sqrt(nn::AdamW<float>::grad_square_sum(cpu_store));
    cpu.update(cpu_store, 1e-2 / step, norm);
    gpu.update(gpu_store, 1e-2 / step, norm);
    const std::vector<float> cpu_w(cpu_store.params().begin(), cpu_store.params().end());
    EXPECT_TRUE(all_close(gpu_store.params_to_host(), cpu_w, 0, 1.2e-7)) << "parameters after step " << step;
  }
}

// The norm handed over as its square in device memory (what the trainer does on one GPU, so
// that nothing waits for the device before the update is enqueued): the multi-tensor kernel
// computes the clipping factor itself, the same correctly rounded square root and division
// as nn::AdamW on the host, so the parameters are those of the update given the norm read
// back, bit for bit; with the moments in pinned host memory the update reads the square back
// itself. Three regimes: the norm over clip_norm (the factor acts), under it (the factor is
// 1), and clip_norm 0 (never clips). A kernel that ignored the square would update with the
// factor 1 and be off by ~40x in the first regime.
TEST(CudaAdamW, ANormLeftOnTheDeviceClipsAsTheNormReadBack) {
  NDMESH_GPU_OR_SKIP();
  for (const auto& [grad_scale, clip_norm] : {std::pair{1.0f, 1.0}, std::pair{1e-3f, 1.0}, std::pair{1.0f, 0.0}}) {
    auto build = [](ParamStore<float>& store) {
      store.add("w", {33, 31}, true);
      store.add("b", {771}, false);
      store.add("w2", {5000}, true);
      store.allocate();
    };
    ParamStore<float> read_back, on_device, pinned;
    for (ParamStore<float>* s : {&read_back, &on_device, &pinned}) build(*s);
    const auto n = static_cast<std::size_t>(read_back.size());
    const auto w0 = normal(n, 4, 0.1f);
    for (ParamStore<float>* s : {&read_back, &on_device, &pinned}) {
      s->params_from_host(w0.data());
      s->to(Device::kCuda);
    }
    const nn::AdamWOptions options{.clip_norm = clip_norm};
    nn::AdamW<float> a(read_back, options), b(on_device, options), c(pinned, options);
    c.offload_to_host(777);
    DeviceBuffer square(sizeof(double));
    for (int step = 1; step <= 3; ++step) {
      auto g = normal(n, 40 + static_cast<std::uint64_t>(step));
      for (float& x : g) x *= grad_scale;
      for (ParamStore<float>* s : {&read_back, &on_device, &pinned})
        cuda::copy_to_device(s->grads().data(), g.data(), n * sizeof(float));
      const std::vector<std::pair<const float*, std::int64_t>> runs = {{read_back.grads().data(), read_back.size()}};
      ops::square_sum_many_into<float>(ptr<double>(square), runs, Device::kCuda);
      double host_square = 0;
      cuda::copy_to_host(&host_square, square.data(), sizeof host_square);
      a.update(read_back, 1e-2 / step, std::sqrt(std::max(0.0, host_square)));
      b.update(on_device, 1e-2 / step, nn::GradNorm::of_square_sum(ptr<double>(square)));
      c.update(pinned, 1e-2 / step, nn::GradNorm::of_square_sum(ptr<double>(square)));
      const std::vector<float> want = read_back.params_to_host();
      const std::vector<float> got = on_device.params_to_host(), got_pinned = pinned.params_to_host();
      std::size_t wrong = 0, wrong_pinned = 0;
      for (std::size_t i = 0; i < n; ++i) {
        wrong += std::memcmp(&want[i], &got[i], sizeof(float)) != 0;
        wrong_pinned += std::memcmp(&want[i], &got_pinned[i], sizeof(float)) != 0;
      }
      EXPECT_EQ(wrong, 0u) << "elements unlike the update with the norm read back, step " << step << ", norm "
                           << std::sqrt(host_square) << ", clip_norm " << clip_norm;
      EXPECT_EQ(wrong_pinned, 0u) << "pinned offload, step " << step << ", clip_norm " << clip_norm;
    }
  }
}

// Under bf16 products on a GPU the store keeps a bfloat16 copy of the parameters, and the
// optimizer step writes it in the same launch: after each step the copy is current without a
// cast (refresh counts none) and holds every new parameter rounded to bfloat16, bit for bit
// BFloat16's rounding of the fp32 result. An optimizer over a shard of the store (ZeRO) writes
// only its segments: the copy is then stale (the next forward casts it whole).
TEST(CudaAdamW, TheStepWritesTheBf16CopyOfTheWeights) {
  NDMESH_GPU_OR_SKIP();
  ParamStore<float> store;
  store.add("w", {33, 31}, true);
  store.add("b", {771}, false);
  store.allocate();
  const auto n = static_cast<std::size_t>(store.size());
  const auto w0 = normal(n, 1, 0.1f);
  store.params_from_host(w0.data());
  store.to(Device::kCuda);
  store.keep_bf16_copy();
  nn::AdamW<float> adam(store, {.clip_norm = 1.0});
  for (int step = 1; step <= 2; ++step) {
    const auto g = normal(n, 30 + static_cast<std::uint64_t>(step));
    cuda::copy_to_device(store.grads().data(), g.data(), n * sizeof(float));
    adam.update(store, 1e-2, 1.0);
    ASSERT_NE(store.param_bf16(0), nullptr) << "the step left the copy stale, step " << step;
    const std::vector<float> w = store.params_to_host();
    std::vector<BFloat16> w16(n);
    cuda::copy_to_host(w16.data(), store.param_bf16(0), n * sizeof(BFloat16));
    std::size_t wrong = 0;
    for (const ParamView& v : store.views())
      for (std::int64_t i = v.offset; i < v.offset + v.numel; ++i)
        wrong += w16[static_cast<std::size_t>(i)].bits != BFloat16(w[static_cast<std::size_t>(i)]).bits;
    EXPECT_EQ(wrong, 0u) << "elements of the copy that are not the new weight rounded, step " << step;
  }
  EXPECT_EQ(store.bf16_refreshes(), 0);
  nn::AdamW<float> shard(store, {.clip_norm = 1.0}, {nn::Segment{0, 16}});
  shard.update(store, 1e-2, 1.0);
  EXPECT_EQ(store.param_bf16(0), nullptr) << "a shard's step left the whole copy current";
}

// --offload optimizer on a GPU (nn::PinnedOffload): the moments and the master copy in
// pinned host memory, the gradients copied to the host in chunks (small ones here, so that
// pieces straddle chunk edges and the two staging buffers alternate), the CPU loop, the
// parameters copied back. The same arithmetic as the CPU optimizer, so bit for bit its
// parameters and moments: over the whole store and over a shard of segments whose gradients
// come packed (ZeRO-2's segment_grads, here in device memory); after step 2 both sides load
// new parameters and moments (a checkpoint): the master is read from the device again.
// The copies are counted: per step every owned element's gradient to the host and its
// parameter back, plus the master's reads.
TEST(CudaAdamW, PinnedHostOffloadIsTheCpuUpdateBitForBit) {
  NDMESH_GPU_OR_SKIP();
  for (bool shard : {false, true}) {
    auto build = [](ParamStore<float>& store) {
      store.add("w", {33, 31}, true);
      store.add("b", {771}, false);
      store.add("w2", {5000}, true);
      store.allocate();
    };
    ParamStore<float> cpu_store, gpu_store;
    build(cpu_store);
    build(gpu_store);
    const auto n = static_cast<std::size_t>(cpu_store.size());
    const auto w0 = normal(n, 3, 0.1f);
    std::copy(w0.begin(), w0.end(), cpu_store.params().begin());
    gpu_store.params_from_host(w0.data());
    gpu_store.to(Device::kCuda);
    // The shard: two segments across the tensors' edges (a ZeRO shard of a padded buffer).
    std::vector<nn::Segment> segments;
    if (shard) segments = {{900, 1500}, {4000, static_cast<std::int64_t>(n) - 4100}};
    std::int64_t owned = 0;
    for (const nn::Segment& seg : segments) owned += seg.count;
    const nn::AdamWOptions options{.clip_norm = 1.0};
    nn::AdamW<float> cpu(cpu_store, options, segments), gpu(gpu_store, options, segments);
    gpu.offload_to_host(777);
    ASSERT_NE(gpu.pinned(), nullptr);
    EXPECT_TRUE(gpu.m().empty());
    // Elements the pieces cover (parameters, not padding), the bytes each step moves.
    std::int64_t covered = 0;
    for (const ParamView& view : cpu_store.views())
      for (const nn::Segment& seg : shard ? segments : std::vector<nn::Segment>{{0, cpu_store.size()}})
        covered += std::max<std::int64_t>(
            0, std::min(seg.offset + seg.count, view.offset + view.numel) - std::max(seg.offset, view.offset));
    std::int64_t master_reads = 1;
    for (int step = 1; step <= 4; ++step) {
      const auto g = normal(n, 30 + static_cast<std::uint64_t>(step));
      std::copy(g.begin(), g.end(), cpu_store.grads().begin());
      cuda::copy_to_device(gpu_store.grads().data(), g.data(), n * sizeof(float));
      // Packed gradients of the shard (segment_grads), on the host for the CPU, on the device for the GPU.
      std::vector<float> packed;
      for (const nn::Segment& seg : segments) packed.insert(packed.end(), g.begin() + seg.offset, g.begin() + seg.offset + seg.count);
      DeviceBuffer packed_device = to_device(packed);
      const double norm = std::sqrt(nn::AdamW<float>::grad_square_sum(cpu_store));
      cpu.update(cpu_store, 1e-2 / step, norm, shard ? packed.data() : nullptr);
      gpu.update(gpu_store, 1e-2 / step, norm, shard ? ptr<float>(packed_device) : nullptr);
      const std::vector<float> cpu_w(cpu_store.params().begin(), cpu_store.params().end());
      const std::vector<float> gpu_w = gpu_store.params_to_host();
      ASSERT_EQ(std::memcmp(gpu_w.data(), cpu_w.data(), n * sizeof(float)), 0)
          << "parameters after step " << step << (shard ? " (shard)" : "");
      std::vector<float> cm, cv, gm, gv;
      cpu.moments_to_host(cm, cv);
      gpu.moments_to_host(gm, gv);
      ASSERT_EQ(cm, gm) << "first moment after step " << step;
      ASSERT_EQ(cv, gv) << "second moment after step " << step;
      EXPECT_EQ(gpu.pinned()->bytes_to_device, 4 * covered * step);
      EXPECT_EQ(gpu.pinned()->bytes_to_host, 4 * covered * (step + master_reads));
      if (step == 2) {  // a checkpoint load: new parameters and moments on both sides
        const auto w1 = normal(n, 99, 0.1f);
        std::copy(w1.begin(), w1.end(), cpu_store.params().begin());
        cuda::copy_to_device(gpu_store.params().data(), w1.data(), n * sizeof(float));
        for (float& x : cm) x *= 0.5f;
        cpu.moments_from_host(cm.data(), cv.data());
        gpu.moments_from_host(cm.data(), cv.data());
        cpu.set_steps(2);
        gpu.set_steps(2);
        ++master_reads;
      }
    }
    EXPECT_EQ(owned > 0, shard);
  }
}

}  // namespace
}  // namespace ndmesh
