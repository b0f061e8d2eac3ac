// cuda::adamw_update against nn::AdamW<float>::update over three steps: a store with a
// decayed matrix and an undecayed vector of odd sizes, gradients large enough that the
// global-norm clipping acts, the moments carried from step to step on both sides.
#include <cmath>
#include <cstdint>
#include <vector>

#include "gpu_test.hpp"
#include "ndmesh/nn/adamw.hpp"
#include "ndmesh/nn/cuda_ops.hpp"

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

}  // namespace
}  // namespace ndmesh
