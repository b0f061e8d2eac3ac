// cuda::gelu_forward / gelu_backward against nn::Gelu<float> over inputs spread across
// [-8, 8] (both tails of the tanh), odd sizes, dinp pre-filled (the backward accumulates);
// and gelu_forward from fp32 into bf16 against the fp32 kernel rounded.
#include <cmath>
#include <cstdint>
#include <vector>

#include "gpu_test.hpp"
#include "ndmesh/core/dtype.hpp"
#include "ndmesh/nn/cuda_ops.hpp"
#include "ndmesh/nn/gelu.hpp"

namespace ndmesh {
namespace {

using namespace testing;  // gpu_test.hpp

TEST(CudaGelu, ForwardAndBackwardMatchTheCpu) {
  NDMESH_GPU_OR_SKIP();
  for (std::int64_t n : {1, 7, 1031, 33 * 771}) {
    const auto sz = static_cast<std::size_t>(n);
    const auto x = normal(sz, 1, 2.5f), dout = normal(sz, 2), dinp0 = normal(sz, 3);
    std::vector<float> out(sz), dinp = dinp0;
    nn::Gelu<float>::forward(x.data(), out.data(), n);
    nn::Gelu<float>::backward(dout.data(), x.data(), dinp.data(), n);
    DeviceBuffer dx = to_device(x), dd = to_device(dout), dout_gpu = to_device(nans(sz)),
                 dinp_gpu = to_device(dinp0);
    cuda::gelu_forward(ptr<float>(dout_gpu), ptr<float>(dx), n);
    cuda::gelu_backward(ptr<float>(dinp_gpu), ptr<float>(dd), ptr<float>(dx), n);
    // The two tanh differ by about 1e-7 absolute (the CPU's 1 - 2/(exp(2u) + 1) cancels
    // near 0, CUDA's tanhf errs by 2 ulp). The forward multiplies that by x/2: under 1e-6
    // absolute for |x| < 10, and 1e-6 relative covers large outputs (gelu(x) ~ x). The
    // derivative multiplies it by up to x a (1 + 3 k x²) ~ 10 (before 1 - t² rounds to 0)
    // and by |dout| < 5: under 1e-5 absolute. A wrong formula is off by 1e-2 or more.
    EXPECT_TRUE(all_close(to_host<float>(dout_gpu, sz), out, 1e-6, 1e-6)) << "gelu_forward n=" << n;
    EXPECT_TRUE(all_close(to_host<float>(dinp_gpu, sz), dinp, 1e-5, 1e-6)) << "gelu_backward n=" << n;
    // From fp32 into bf16 (the MLP's hidden activation under bf16): the fp32 kernel's values
    // rounded once, bit for bit (the same float math, then BFloat16's rounding on the store).
    const std::vector<float> gpu_out = to_host<float>(dout_gpu, sz);
    DeviceBuffer d16 = to_device(std::vector<BFloat16>(sz, BFloat16(std::nanf(""))));
    cuda::gelu_forward(ptr<BFloat16>(d16), ptr<float>(dx), n);
    const auto got16 = to_host<BFloat16>(d16, sz);
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < sz; ++i) wrong += got16[i].bits != BFloat16(gpu_out[i]).bits;
    EXPECT_EQ(wrong, 0u) << "gelu_forward into bf16, n=" << n;
  }
}

}  // namespace
}  // namespace ndmesh
