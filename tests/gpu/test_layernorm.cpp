// cuda::layernorm_forward / layernorm_backward against nn::LayerNorm<float> at odd rows and
// channels, random (not 1/0) weight and bias, inputs with a non-zero mean, and every
// gradient pre-filled (the backward accumulates dinp, dweight and dbias).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gpu_test.hpp"
#include "ndmesh/core/dtype.hpp"
#include "ndmesh/nn/cuda_ops.hpp"
#include "ndmesh/nn/layernorm.hpp"

namespace ndmesh {
namespace {

using namespace testing;  // gpu_test.hpp

TEST(CudaLayerNorm, ForwardAndBackwardMatchTheCpu) {
  NDMESH_GPU_OR_SKIP();
  // 1031 rows of 96 (the 16-byte path): more than a row per warp in the one-pass backward (256
  // blocks of 4 warps).
  for (std::int64_t rows : {7, 33, 129, 1031})
    for (std::int64_t c : {5, 96, 771}) {
      if (rows == 1031 && c != 96) continue;
      ParamStore<float> store;
      const nn::LayerNorm<float> ln(store, {.channels = c});
      store.allocate();
      const auto params = normal(static_cast<std::size_t>(store.size()), 1, 0.5f);
      const auto grads = normal(params.size(), 2);
      std::copy(params.begin(), params.end(), store.params().begin());
      std::copy(grads.begin(), grads.end(), store.grads().begin());
      const float* w = store.param(store.find("ln.weight"));
      const float* b = store.param(store.find("ln.bias"));
      const auto sz = static_cast<std::size_t>(rows * c), cs = static_cast<std::size_t>(c);
      auto x = normal(sz, 3, 2.0f);
      for (float& v : x) v += 3.0f;  // a mean far from 0: the two-pass variance matters
      const auto dout = normal(sz, 4), dinp0 = normal(sz, 5);

      std::vector<float> out(sz), mean(static_cast<std::size_t>(rows)), rstd(mean.size()), dinp = dinp0;
      ln.forward(x.data(), out.data(), mean.data(), rstd.data(), rows);
      const float* dw_ref = store.grad(store.find("ln.weight"));
      const float* db_ref = store.grad(store.find("ln.bias"));
      const std::vector<float> dw0(dw_ref, dw_ref + c), db0(db_ref, db_ref + c);
      ln.backward(dout.data(), x.data(), mean.data(), rstd.data(), dinp.data(), rows);

      DeviceBuffer dx = to_device(x), dweight = to_device(std::vector<float>(w, w + c)),
                   dbias = to_device(std::vector<float>(b, b + c)), dout_gpu = to_device(nans(sz)),
                   dmean = to_device(nans(mean.size())), drstd = to_device(nans(mean.size()));
      cuda::layernorm_forward(ptr<float>(dout_gpu), ptr<float>(dmean), ptr<float>(drstd), ptr<float>(dx),
                              ptr<float>(dweight), ptr<float>(dbias), rows, c, 1e-5f);
      // Row sums of C terms in two orders (about eps sqrt C relative), then one division
      // and a square root: mean and rstd agree to ~1e-6 relative; out = xhat w + b with
      // |xhat| < 5 and |w| < 2 inherits ~1e-6 of that plus rounding. 1e-5 is 10x above.
      const std::string where = "rows=" + std::to_string(rows) + " C=" + std::to_string(c);
      EXPECT_TRUE(all_close(to_host<float>(dmean, mean.size()), mean, 1e-6, 1e-6)) << "mean " << where;
      EXPECT_TRUE(all_close(to_host<float>(drstd, rstd.size()), rstd, 0, 1e-5)) << "rstd " << where;
      EXPECT_TRUE(all_close(to_host<float>(dout_gpu, sz), out, 1e-5, 1e-5)) << "out " << where;

      // The backward from the CPU's mean and rstd, so that it is compared alone.
      DeviceBuffer ddout = to_device(dout), ddinp = to_device(dinp0), dm = to_device(mean),
                   dr = to_device(rstd), ddw = to_device(dw0), ddb = to_device(db0);
      cuda::layernorm_backward(ptr<float>(ddinp), ptr<float>(ddw), ptr<float>(ddb), ptr<float>(ddout),
                               ptr<float>(dx), ptr<float>(dweight), ptr<float>(dm), ptr<float>(dr), rows, c);
      // dinp: two row means of C terms (order differs) scaled by rstd (~0.5): 1e-5
      // covers them with a 10x margin. dweight, dbias: column sums over `rows` rows of
      // terms below ~5, bounded like bias_backward's (1e-6 rows, here times 5).
      EXPECT_TRUE(all_close(to_host<float>(ddinp, sz), dinp, 1e-5, 1e-5)) << "dinp " << where;
      EXPECT_TRUE(all_close(to_host<float>(ddw, cs), std::vector<float>(dw_ref, dw_ref + c),
                            5e-6 * static_cast<double>(rows), 1e-5))
          << "dweight " << where;
      EXPECT_TRUE(all_close(to_host<float>(ddb, cs), std::vector<float>(db_ref, db_ref + c),
                            1e-6 * static_cast<double>(rows), 1e-5))
          << "dbias " << where;
      // With the residual path's gradient given apart (the block's backward: dinp written from
      // it, never read): the same bits as accumulating into a copy of it.
      // Its column sums (a projection's deferred bias gradient) added in the same pass, within
      // bias_backward's bound of the CPU's sums (the block's rows are summed in another order).
      const auto sums0 = normal(cs, 6);
      DeviceBuffer ddres = to_device(dinp0), ddinp2 = to_device(nans(sz)), ddw2 = to_device(dw0),
                   ddb2 = to_device(db0), dsums = to_device(sums0);
      cuda::layernorm_backward(ptr<float>(ddinp2), ptr<float>(ddw2), ptr<float>(ddb2), ptr<float>(ddout),
                               ptr<float>(dx), ptr<float>(dweight), ptr<float>(dm), ptr<float>(dr), rows, c,
                               ptr<float>(ddres), ptr<float>(dsums));
      const auto accumulated = to_host<float>(ddinp, sz), written = to_host<float>(ddinp2, sz);
      EXPECT_EQ(std::memcmp(accumulated.data(), written.data(), sz * sizeof(float)), 0)
          << "dinp from the residual's gradient " << where;
      EXPECT_EQ(to_host<float>(ddres, sz), dinp0) << "the residual's gradient is read only, " << where;
      std::vector<float> sums_ref = sums0;
      for (std::int64_t j = 0; j < c; ++j) {
        double sum = 0;
        for (std::int64_t r = 0; r < rows; ++r) sum += dinp0[static_cast<std::size_t>(r * c + j)];
        sums_ref[static_cast<std::size_t>(j)] += static_cast<float>(sum);
      }
      const auto sums = to_host<float>(dsums, cs);
      EXPECT_TRUE(all_close(sums, sums_ref, 1e-6 * static_cast<double>(rows), 1e-5))
          << "the residual's column sums " << where;
      // In place (dresidual = dinp): the sums read it before the norm's gradient is added.
      DeviceBuffer dinplace = to_device(dinp0), dsums2 = to_device(sums0), ddw3 = to_device(dw0),
                   ddb3 = to_device(db0);
      cuda::layernorm_backward(ptr<float>(dinplace), ptr<float>(ddw3), ptr<float>(ddb3), ptr<float>(ddout),
                               ptr<float>(dx), ptr<float>(dweight), ptr<float>(dm), ptr<float>(dr), rows, c,
                               ptr<float>(dinplace), ptr<float>(dsums2));
      EXPECT_EQ(to_host<float>(dinplace, sz), accumulated) << "in place " << where;
      EXPECT_EQ(to_host<float>(dsums2, cs), sums) << "in place, the sums " << where;
    }
}

// The block's residual connection and its second norm in one pass (LayerNorm::forward_residual,
// in place as the block calls it, with and without the deferred bias of the layer before): the
// residual is the same fp32 adds in the same order on both devices (the same bits), the norm of it within the forward's bounds above; a residual left unwritten, or a
// norm of the unsummed rows, is off by O(1).
TEST(CudaLayerNorm, ResidualAndNormInOnePassMatchTheCpu) {
  NDMESH_GPU_OR_SKIP();
  const std::int64_t rows = 33, c = 96;
  ParamStore<float> cpu_store, gpu_store;
  const nn::LayerNorm<float> cpu_ln(cpu_store, {.channels = c}), gpu_ln(gpu_store, {.channels = c});
  cpu_store.allocate();
  gpu_store.allocate();
  const auto params = normal(static_cast<std::size_t>(cpu_store.size()), 1, 0.5f);
  std::copy(params.begin(), params.end(), cpu_store.params().begin());
  std::copy(params.begin(), params.end(), gpu_store.params().begin());
  gpu_store.to(Device::kCuda);
  const auto sz = static_cast<std::size_t>(rows * c), rs = static_cast<std::size_t>(rows);
  const auto x = normal(sz, 3, 2.0f), add = normal(sz, 4, 1.0f);
  std::vector<float> res = x, out(sz), mean(rs), rstd(rs);
  cpu_ln.forward_residual(res.data(), add.data(), res.data(), out.data(), mean.data(), rstd.data(), rows);
  std::vector<float> sum(sz);
  for (std::size_t i = 0; i < sz; ++i) sum[i] = x[i] + add[i];
  EXPECT_EQ(res, sum);

  DeviceBuffer dres = to_device(x), dadd = to_device(add), dout = to_device(nans(sz)), dmean = to_device(nans(rs)),
               drstd = to_device(nans(rs));
  gpu_ln.forward_residual(ptr<float>(dres), ptr<float>(dadd), ptr<float>(dres), ptr<float>(dout), ptr<float>(dmean),
                          ptr<float>(drstd), rows);
  EXPECT_EQ(to_host<float>(dres, sz), sum);
  EXPECT_TRUE(all_close(to_host<float>(dmean, rs), mean, 1e-6, 1e-6));
  EXPECT_TRUE(all_close(to_host<float>(drstd, rs), rstd, 0, 1e-5));
  EXPECT_TRUE(all_close(to_host<float>(dout, sz), out, 1e-5, 1e-5));

  // With the deferred bias of the layer that wrote x: (x + bias) + add on both devices.
  const auto x_bias = normal(static_cast<std::size_t>(c), 6);
  for (std::size_t i = 0; i < sz; ++i) sum[i] = (x[i] + x_bias[i % static_cast<std::size_t>(c)]) + add[i];
  res = x;
  cpu_ln.forward_residual(res.data(), add.data(), res.data(), out.data(), mean.data(), rstd.data(), rows,
                          x_bias.data());
  EXPECT_EQ(res, sum);
  DeviceBuffer dres2 = to_device(x), dbias = to_device(x_bias);
  gpu_ln.forward_residual(ptr<float>(dres2), ptr<float>(dadd), ptr<float>(dres2), ptr<float>(dout), ptr<float>(dmean),
                          ptr<float>(drstd), rows, ptr<float>(dbias));
  EXPECT_EQ(to_host<float>(dres2, sz), sum);
  EXPECT_TRUE(all_close(to_host<float>(dout, sz), out, 1e-5, 1e-5));
}

// The norms' outputs into bfloat16 (a block under bf16 products keeps them so): each the fp32
// kernel's output on the same device rounded once, bit for bit, the statistics and the
// residual the fp32 kernel's too; for the norm and for the residual + norm pass.
TEST(CudaLayerNorm, OutputsIntoBf16AreTheFp32KernelsRoundedOnce) {
  NDMESH_GPU_OR_SKIP();
  const std::int64_t rows = 33, c = 96;
  ParamStore<float> store;
  const nn::LayerNorm<float> ln(store, {.channels = c});
  store.allocate();
  const auto params = normal(static_cast<std::size_t>(store.size()), 1, 0.5f);
  store.params_from_host(params.data());
  store.to(Device::kCuda);
  const auto sz = static_cast<std::size_t>(rows * c), rs = static_cast<std::size_t>(rows);
  const auto x = normal(sz, 3, 2.0f), add = normal(sz, 4, 1.0f), x_bias = normal(static_cast<std::size_t>(c), 6);
  DeviceBuffer dx = to_device(x), dadd = to_device(add), dbias = to_device(x_bias);
  for (const bool residual : {false, true}) {
    const char* what = residual ? "residual + norm" : "norm";
    DeviceBuffer out = to_device(nans(sz)), mean = to_device(nans(rs)), rstd = to_device(nans(rs)),
                 res = to_device(nans(sz)), mean16 = to_device(nans(rs)), rstd16 = to_device(nans(rs)),
                 res16 = to_device(nans(sz)),
                 out16 = to_device(std::vector<BFloat16>(sz, BFloat16(std::nanf(""))));
    if (residual) {
      ln.forward_residual(ptr<float>(dx), ptr<float>(dadd), ptr<float>(res), ptr<float>(out), ptr<float>(mean),
                          ptr<float>(rstd), rows, ptr<float>(dbias));
      ln.forward_residual(ptr<float>(dx), ptr<float>(dadd), ptr<float>(res16), ptr<BFloat16>(out16),
                          ptr<float>(mean16), ptr<float>(rstd16), rows, ptr<float>(dbias));
      EXPECT_EQ(to_host<float>(res16, sz), to_host<float>(res, sz)) << what;
    } else {
      ln.forward(ptr<float>(dx), ptr<float>(out), ptr<float>(mean), ptr<float>(rstd), rows);
      ln.forward(ptr<float>(dx), ptr<BFloat16>(out16), ptr<float>(mean16), ptr<float>(rstd16), rows);
    }
    const auto wide = to_host<float>(out, sz);
    const auto got = to_host<BFloat16>(out16, sz);
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < sz; ++i) wrong += got[i].bits != BFloat16(wide[i]).bits;
    EXPECT_EQ(wrong, 0u) << what;
    EXPECT_EQ(to_host<float>(mean16, rs), to_host<float>(mean, rs)) << what;
    EXPECT_EQ(to_host<float>(rstd16, rs), to_host<float>(rstd, rs)) << what;
  }
}

}  // namespace
}  // namespace ndmesh
