// The split backward of the zero-bubble schedules (--schedule zb-h1) on the device:
// nn::Linear::backward under a DeferWeightGrads computes only the input gradient and keeps
// a copy of dout in device memory (the caller's buffer is reused before the weight half);
// DeferredWeightGrads::run adds the weight and bias gradients through the device path. The
// result must be the whole backward's, bit for bit (the same products on the same inputs).
#include <cstdint>
#include <limits>
#include <vector>

#include "gpu_test.hpp"
#include "ndmesh/nn/linear.hpp"

namespace ndmesh {
namespace {

using namespace testing;  // gpu_test.hpp

struct Shape {
  std::int64_t rows, in, out;
};

// A Linear with random parameters, moved to the device (its gradients start at zero).
struct Layer {
  ParamStore<float> store;
  nn::Linear<float> linear;
  explicit Layer(const Shape& s) : linear(store, {.in = s.in, .out = s.out}) {
    store.allocate();
    const auto p = normal(static_cast<std::size_t>(store.size()), 7, 0.2f);
    std::copy(p.begin(), p.end(), store.params().begin());
    store.to(Device::kCuda);
  }
  std::vector<float> grad(int id, std::int64_t n) const {
    std::vector<float> host(static_cast<std::size_t>(n));
    cuda::copy_to_host(host.data(), store.grad(id), host.size() * sizeof(float));
    return host;
  }
};

TEST(CudaSplitBackward, DeferredWeightGradsEqualTheWholeBackward) {
  NDMESH_GPU_OR_SKIP();
  for (const Shape s : {Shape{7, 5, 5}, Shape{33, 96, 71}}) {
    Layer whole(s), split(s);
    const auto inp_h = normal(static_cast<std::size_t>(s.rows * s.in), 1);
    const auto dout_h = normal(static_cast<std::size_t>(s.rows * s.out), 2);
    const auto dinp_h = normal(inp_h.size(), 3);  // accumulated into
    DeviceBuffer inp = to_device(inp_h), dout = to_device(dout_h), dinp_whole = to_device(dinp_h),
                 dinp_split = to_device(dinp_h);

    whole.linear.backward(ptr<float>(dout), ptr<float>(inp), ptr<float>(dinp_whole), s.rows);

    nn::DeferredWeightGrads<float> deferred;
    const std::int64_t before = cuda::allocator_stats().allocated_bytes;
    {
      nn::DeferWeightGrads<float> defer(deferred);
      split.linear.backward(ptr<float>(dout), ptr<float>(inp), ptr<float>(dinp_split), s.rows);
    }
    ASSERT_FALSE(deferred.empty());
    // The copy of dout is device memory from the caching allocator...
    EXPECT_GE(cuda::allocator_stats().allocated_bytes - before,
              static_cast<std::int64_t>(dout_h.size() * sizeof(float)));
    // ... and nothing of the weight half ran yet.
    const std::vector<float> zeros(static_cast<std::size_t>(s.out * s.in), 0.0f);
    EXPECT_TRUE(same_bits(split.grad(split.linear.weight_id(), s.out * s.in), zeros));
    // The caller reuses its buffer: the weight half must read the copy.
    cuda::copy_to_device(ptr<float>(dout), nans(dout_h.size()).data(), dout_h.size() * sizeof(float));
    deferred.run();
    EXPECT_TRUE(deferred.empty());

    EXPECT_TRUE(
        same_bits(to_host<float>(dinp_split, inp_h.size()), to_host<float>(dinp_whole, inp_h.size())));
    EXPECT_TRUE(same_bits(split.grad(split.linear.weight_id(), s.out * s.in),
                          whole.grad(whole.linear.weight_id(), s.out * s.in)))
        << "rows=" << s.rows << " in=" << s.in << " out=" << s.out;
    EXPECT_TRUE(
        same_bits(split.grad(split.linear.bias_id(), s.out), whole.grad(whole.linear.bias_id(), s.out)));
  }
}

}  // namespace
}  // namespace ndmesh
