// The Linear layer's bias on the device against nn::Linear<float>: bias_forward
// (add_bias) and bias_backward (backward_bias, accumulating into a filled gradient). The
// layer's products are cuda::gemm, tested with the whole forward in test_blas.
#include <cstdint>
#include <vector>

#include "gpu_test.hpp"
#include "ndmesh/nn/cuda_ops.hpp"
#include "ndmesh/nn/linear.hpp"

namespace ndmesh {
namespace {

using namespace testing;  // gpu_test.hpp

struct Shape {
  std::int64_t rows, in, out;
};
constexpr Shape kShapes[] = {{7, 5, 5}, {33, 96, 771}, {129, 771, 96}};

// A Linear in its own store, with random weight, bias and gradients.
struct Layer {
  ParamStore<float> store;
  nn::Linear<float> linear;
  explicit Layer(const Shape& s) : linear(store, {.in = s.in, .out = s.out}) {
    store.allocate();
    const auto p = normal(static_cast<std::size_t>(store.size()), 7, 0.2f), g = normal(p.size(), 8);
    std::copy(p.begin(), p.end(), store.params().begin());
    std::copy(g.begin(), g.end(), store.grads().begin());
  }
  std::vector<float> bias() const {
    const float* b = store.param(linear.bias_id());
    return {b, b + linear.options().out};
  }
  std::vector<float> bias_grad() const {
    const float* b = store.grad(linear.bias_id());
    return {b, b + linear.options().out};
  }
};

TEST(CudaLinear, BiasForwardIsAddBias) {
  NDMESH_GPU_OR_SKIP();
  for (const Shape& s : kShapes) {
    Layer layer(s);
    const auto out0 = normal(static_cast<std::size_t>(s.rows * s.out), 1);
    std::vector<float> ref = out0;
    layer.linear.add_bias(ref.data(), s.rows);
    DeviceBuffer out = to_device(out0), bias = to_device(layer.bias());
    cuda::bias_forward(ptr<float>(out), ptr<float>(bias), s.rows, s.out);
    // One float add per element on both sides: the same bits.
    EXPECT_TRUE(same_bits(to_host<float>(out, out0.size()), ref)) << "rows=" << s.rows << " cols=" << s.out;
  }
}

TEST(CudaLinear, BiasBackwardAccumulatesColumnSums) {
  NDMESH_GPU_OR_SKIP();
  for (const Shape& s : kShapes) {
    Layer layer(s);
    const auto dout = normal(static_cast<std::size_t>(s.rows * s.out), 2);
    DeviceBuffer d = to_device(dout), dbias = to_device(layer.bias_grad());
    layer.linear.backward_bias(dout.data(), s.rows);
    cuda::bias_backward(ptr<float>(dbias), ptr<float>(d), s.rows, s.out);
    // Sums of `rows` unit normals (plus the filled gradient) in two orders: rounding of
    // about eps rows / sqrt 2 (1e-5 at 129 rows); 1e-6 rows leaves 10x margin, and a
    // missed or doubled row is off by ~1.
    EXPECT_TRUE(all_close(to_host<float>(dbias, static_cast<std::size_t>(s.out)), layer.bias_grad(),
                          1e-6 * static_cast<double>(s.rows), 1e-6))
        << "rows=" << s.rows << " cols=" << s.out;
  }
}

}  // namespace
}  // namespace ndmesh
