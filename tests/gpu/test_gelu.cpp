// cuda::gelu_forward / gelu_backward against nn::Gelu<float> over inputs spread across
// [-8, 8] (both tails of the tanh), odd sizes, dinp pre-filled (the backward accumulates);
// and gelu_forward from fp32 into bf16 against the fp32 kernel rounded; the bf16 MLP's
// kernels (gelu_bias_forward, gelu_backward into bf16) against the fp32 kernels rounded.
#include <cmath>
#include <cstdint>
#include <utility>
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

// Under bf16 the MLP's fc where its GELU epilogue declines: t = p + bias (bf16) in float, pre
// and gelu(t) rounded once; and d pre = gelu'(pre) dout rounded once. Against the fp32 kernels
// on the same float values, rounded: bit for bit (the same float math, one rounding each).
TEST(CudaGelu, Bf16MlpKernelsAreTheFp32KernelsRoundedOnce) {
  NDMESH_GPU_OR_SKIP();
  for (const auto& [rows, cols] : {std::pair<std::int64_t, std::int64_t>{1, 7}, {13, 96}, {33, 771}}) {
    const auto sz = static_cast<std::size_t>(rows * cols);
    const auto p = normal(sz, 4, 2.5f), dout = normal(sz, 5);
    std::vector<BFloat16> bias(static_cast<std::size_t>(cols));
    for (std::size_t j = 0; j < bias.size(); ++j) bias[j] = BFloat16(normal(bias.size(), 6)[j]);
    std::vector<float> t(sz);
    for (std::size_t i = 0; i < sz; ++i) t[i] = p[i] + static_cast<float>(bias[i % bias.size()]);
    DeviceBuffer dt = to_device(t), dgelu = to_device(nans(sz));
    cuda::gelu_forward(ptr<float>(dgelu), ptr<float>(dt), rows * cols);
    const auto gelu = to_host<float>(dgelu, sz);
    DeviceBuffer dp = to_device(p), db = to_device(bias),
                 dpre = to_device(std::vector<BFloat16>(sz, BFloat16(std::nanf("")))),
                 dact = to_device(std::vector<BFloat16>(sz, BFloat16(std::nanf(""))));
    cuda::gelu_bias_forward(ptr<BFloat16>(dact), ptr<BFloat16>(dpre), ptr<float>(dp), ptr<BFloat16>(db), rows,
                            cols);
    const auto pre = to_host<BFloat16>(dpre, sz), act = to_host<BFloat16>(dact, sz);
    std::size_t wrong_pre = 0, wrong_act = 0;
    for (std::size_t i = 0; i < sz; ++i) {
      wrong_pre += pre[i].bits != BFloat16(t[i]).bits;
      wrong_act += act[i].bits != BFloat16(gelu[i]).bits;
    }
    EXPECT_EQ(wrong_pre, 0u) << "pre-activation, " << rows << " x " << cols;
    EXPECT_EQ(wrong_act, 0u) << "gelu, " << rows << " x " << cols;

    // d pre at the stored pre-activation: the fp32 backward (in place, so written) from pre
    // widened, rounded once.
    std::vector<float> pre32(sz);
    for (std::size_t i = 0; i < sz; ++i) pre32[i] = static_cast<float>(pre[i]);
    DeviceBuffer dpre32 = to_device(pre32), dd = to_device(dout),
                 dd16 = to_device(std::vector<BFloat16>(sz, BFloat16(std::nanf(""))));
    cuda::gelu_backward(ptr<float>(dd), ptr<float>(dd), ptr<float>(dpre32), rows * cols);
    const auto dref = to_host<float>(dd, sz);
    DeviceBuffer dd_again = to_device(dout);
    cuda::gelu_backward(ptr<BFloat16>(dd16), ptr<float>(dd_again), ptr<BFloat16>(dpre), rows * cols);
    const auto d16 = to_host<BFloat16>(dd16, sz);
    std::size_t wrong_d = 0;
    for (std::size_t i = 0; i < sz; ++i) wrong_d += d16[i].bits != BFloat16(dref[i]).bits;
    EXPECT_EQ(wrong_d, 0u) << "d pre-activation, " << rows << " x " << cols;
  }
}

}  // namespace
}  // namespace ndmesh
