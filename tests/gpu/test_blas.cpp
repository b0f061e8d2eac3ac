// cuda::gemm (cuBLASLt, TF32 off) against ndmesh::gemm (OpenBLAS) on odd shapes, every
// transpose, padded leading dimensions, beta = 0 over a poisoned C and beta != 0 over a
// filled one; and Linear's forward composed on the device (gemm, then bias_forward)
// against nn::Linear<float>::forward. The bf16 products (gemm_bf16, gemm_bf16_f32) and
// their epilogues against a double reference on the same bf16 inputs. GPU only: the CPU
// emulator has no cuBLASLt.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "gpu_test.hpp"
#include "ndmesh/nn/cuda_ops.hpp"
#include "ndmesh/nn/linear.hpp"
#include "ndmesh/core/dtype.hpp"
#include "ndmesh/tensor/blas.hpp"

namespace ndmesh {
namespace {

using namespace testing;  // gpu_test.hpp

struct GemmCase {
  std::int64_t m, n, k;
};

TEST(CudaGemm, MatchesOpenBlasForEveryTransposeStrideAndBeta) {
  NDMESH_GPU_OR_SKIP();
  const GemmCase cases[] = {{7, 5, 3}, {33, 96, 129}, {129, 33, 771}, {1, 771, 96}};
  std::uint64_t seed = 1;
  for (const GemmCase& g : cases)
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb)
        for (float beta : {0.0f, 0.5f}) {
          // Stored shapes (row-major): A is m x k (k x m transposed), B is k x n (n x k);
          // each row stride is 3 past the row so that the strides are really used.
          const std::int64_t a_rows = ta ? g.k : g.m, a_cols = ta ? g.m : g.k;
          const std::int64_t b_rows = tb ? g.n : g.k, b_cols = tb ? g.k : g.n;
          const std::int64_t lda = a_cols + 3, ldb = b_cols + 3, ldc = g.n + 3;
          const float alpha = 0.75f;
          const auto a = normal(static_cast<std::size_t>(a_rows * lda), seed++);
          const auto b = normal(static_cast<std::size_t>(b_rows * ldb), seed++);
          // beta = 0 must not read C (BLAS): poison it; otherwise a real C to scale.
          const auto c0 = beta == 0.0f ? nans(static_cast<std::size_t>(g.m * ldc))
                                       : normal(static_cast<std::size_t>(g.m * ldc), seed++);
          std::vector<float> ref = c0;
          if (beta == 0.0f) std::fill(ref.begin(), ref.end(), 0.0f);
          gemm<float>(ta, tb, g.m, g.n, g.k, alpha, a.data(), lda, b.data(), ldb, beta, ref.data(), ldc);
          DeviceBuffer da = to_device(a), db = to_device(b), dc = to_device(c0);
          cuda::gemm(ta, tb, g.m, g.n, g.k, alpha, ptr<float>(da), lda, ptr<float>(db), ldb, beta,
                     ptr<float>(dc), ldc);
          std::vector<float> got = to_host<float>(dc, c0.size());
          // The padding columns of C past n are not part of the product: both sides keep
          // what was there (compare only the m x n block).
          std::vector<float> got_block, ref_block;
          for (std::int64_t i = 0; i < g.m; ++i)
            for (std::int64_t j = 0; j < g.n; ++j) {
              got_block.push_back(got[static_cast<std::size_t>(i * ldc + j)]);
              ref_block.push_back(ref[static_cast<std::size_t>(i * ldc + j)]);
            }
          // Each entry is a dot of k unit-normal products (size ~ sqrt k). Sequential fp32
          // sums carry a random-walk rounding error of about eps k / sqrt 2 (3e-5 at
          // k = 771); 2e-6 k is 10x above the largest of these over all entries and 1e4x
          // below what a wrong transpose or stride gives. TF32 (10-bit mantissas) would
          // err by about 5e-4 sqrt k per entry and fail it.
          EXPECT_TRUE(all_close(got_block, ref_block, 2e-6 * static_cast<double>(g.k), 1e-5))
              << "gemm(trans_a=" << ta << ", trans_b=" << tb << ", m=" << g.m << ", n=" << g.n
              << ", k=" << g.k << ", beta=" << beta << ")";
        }
}

TEST(CudaGemm, WithoutInnerDimensionScalesC) {
  NDMESH_GPU_OR_SKIP();
  const std::int64_t m = 7, n = 5, ldc = 9;
  const auto c0 = normal(static_cast<std::size_t>(m * ldc), 41);
  DeviceBuffer dc = to_device(c0);
  cuda::gemm(false, false, m, n, 0, 1.0f, nullptr, 1, nullptr, n, 0.5f, ptr<float>(dc), ldc);
  const auto got = to_host<float>(dc, c0.size());
  std::vector<float> ref = c0;
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) ref[static_cast<std::size_t>(i * ldc + j)] *= 0.5f;
  EXPECT_TRUE(all_close(got, ref, 0, 0)) << "C = 0.5 C exactly, padding untouched";
}

TEST(CudaGemm, GemmPlusBiasIsTheLinearForward) {
  NDMESH_GPU_OR_SKIP();
  for (const GemmCase& g : {GemmCase{7, 5, 5}, GemmCase{33, 771, 96}, GemmCase{129, 96, 771}}) {
    const std::int64_t rows = g.m, out = g.n, in = g.k;
    ParamStore<float> store;
    const nn::Linear<float> linear(store, {.in = in, .out = out});
    store.allocate();
    const auto params = normal(static_cast<std::size_t>(store.size()), 7, 0.2f);
    std::copy(params.begin(), params.end(), store.params().begin());
    const auto inp = normal(static_cast<std::size_t>(rows * in), 3);
    std::vector<float> ref(static_cast<std::size_t>(rows * out));
    linear.forward(inp.data(), ref.data(), rows);
    const float* w = store.param(linear.weight_id());
    const float* b = store.param(linear.bias_id());
    DeviceBuffer din = to_device(inp), dw = to_device(std::vector<float>(w, w + in * out)),
                 db = to_device(std::vector<float>(b, b + out)), dout = to_device(nans(ref.size()));
    // out[rows, out] = inp[rows, in] · Wᵀ, W row-major [out, in].
    cuda::gemm(false, true, rows, out, in, 1.0f, ptr<float>(din), in, ptr<float>(dw), in, 0.0f,
               ptr<float>(dout), out);
    cuda::bias_forward(ptr<float>(dout), ptr<float>(db), rows, out);
    // The bound above (2e-6 k) scaled by the weights' 0.2.
    EXPECT_TRUE(all_close(to_host<float>(dout, ref.size()), ref, 4e-7 * static_cast<double>(in), 1e-5))
        << "rows=" << rows << " in=" << in << " out=" << out;
  }
}

// ---------------------------------------------------------------- bf16 (tensor cores)

std::vector<BFloat16> bf16_of(const std::vector<float>& x) {
  std::vector<BFloat16> out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) out[i] = BFloat16(x[i]);
  return out;
}
double as_double(BFloat16 x) { return static_cast<double>(static_cast<float>(x)); }
double gelu(double x) { return 0.5 * x * (1 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }
double gelu_grad(double x) {
  const double a = 0.7978845608028654, t = std::tanh(a * (x + 0.044715 * x * x * x));
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * a * (1 + 3 * 0.044715 * x * x);
}

// |got - ref| <= rtol |ref| + acc_tol S for every element, S the sum of |terms| of the dot
// product (the fp32 accumulation's error bound: k terms, each rounding at most 2^-24
// relative of a partial sum below S: k 2^-24 S; acc_tol states it per test).
::testing::AssertionResult within(const std::vector<double>& got, const std::vector<double>& ref,
                                  const std::vector<double>& s, double rtol, double acc_tol,
                                  const std::vector<double>& abs = {}) {
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double bound = rtol * std::fabs(ref[i]) + acc_tol * s[i] + (abs.empty() ? 0.0 : abs[i]);
    if (!(std::fabs(got[i] - ref[i]) <= bound))
      return ::testing::AssertionFailure() << "element " << i << ": got " << got[i] << ", ref " << ref[i]
                                           << ", bound " << bound;
  }
  return ::testing::AssertionSuccess();
}

struct Bf16Product {  // row-major C[m, n] = A[m, k] B[n, k]^T (the linear forward's shape)
  std::int64_t m, n, k;
  std::vector<BFloat16> a, b;
  std::vector<double> ref, sum_abs;  // in double from the bf16 values
  Bf16Product(std::int64_t m_, std::int64_t n_, std::int64_t k_, std::uint64_t seed) : m(m_), n(n_), k(k_) {
    a = bf16_of(normal(static_cast<std::size_t>(m * k), seed));
    b = bf16_of(normal(static_cast<std::size_t>(n * k), seed + 1));
    ref.assign(static_cast<std::size_t>(m * n), 0.0);
    sum_abs.assign(ref.size(), 0.0);
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j)
        for (std::int64_t l = 0; l < k; ++l) {
          const double t =
              as_double(a[static_cast<std::size_t>(i * k + l)]) * as_double(b[static_cast<std::size_t>(j * k + l)]);
          ref[static_cast<std::size_t>(i * n + j)] += t;
          sum_abs[static_cast<std::size_t>(i * n + j)] += std::fabs(t);
        }
  }
};

std::vector<double> doubles(const std::vector<BFloat16>& x) {
  std::vector<double> out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) out[i] = as_double(x[i]);
  return out;
}

// Bounds: fp32 accumulation of k terms (k 2^-24 S, stated as 2^-22 S: 4x margin for the
// split-k and tree orders cuBLASLt may pick), then one bf16 rounding of each output (2^-8
// relative, 2^-7 to allow the neighbour when the fp32 result sits at a rounding midpoint);
// GELU and its derivative are 1.2-Lipschitz in the range drawn, so they carry the product's
// error over at most 1.2x: the GELU cases use rtol 2^-6. A missing bias, GELU or dGELU is
// off by O(1).
TEST(CudaGemmBf16, ProductsAndEpiloguesMatchADoubleReference) {
  NDMESH_GPU_OR_SKIP();
  const double kRound = 1.0 / 128, kAcc = std::ldexp(1.0, -22);
  for (const GemmCase& g : {GemmCase{64, 96, 128}, GemmCase{40, 24, 72}, GemmCase{8, 768, 768}}) {
    const Bf16Product p(g.m, g.n, g.k, 100 + static_cast<std::uint64_t>(g.k));
    const auto mn = static_cast<std::size_t>(g.m * g.n), ns = static_cast<std::size_t>(g.n);
    // The bias in C's type (bf16): cuBLASLt has no algorithm for an fp32 bias with a bf16 C.
    const std::vector<BFloat16> bias_bf16 = bf16_of(normal(ns, 7));
    const std::vector<double> bias = doubles(bias_bf16);
    DeviceBuffer da = to_device(p.a), db = to_device(p.b), dbias = to_device(bias_bf16);
    const std::string where = "m=" + std::to_string(g.m) + " n=" + std::to_string(g.n) + " k=" + std::to_string(g.k);

    DeviceBuffer c = to_device(bf16_of(nans(mn)));
    cuda::gemm_bf16(false, true, g.m, g.n, g.k, 1.0f, ptr<BFloat16>(da), g.k, ptr<BFloat16>(db), g.k, 0.0f,
                    ptr<BFloat16>(c), g.n);
    EXPECT_TRUE(within(doubles(to_host<BFloat16>(c, mn)), p.ref, p.sum_abs, kRound, kAcc)) << "plain " << where;

    std::vector<double> pre(mn), act(mn);
    for (std::size_t i = 0; i < mn; ++i) pre[i] = p.ref[i] + bias[i % ns], act[i] = gelu(pre[i]);
    cuda::gemm_bf16(false, true, g.m, g.n, g.k, 1.0f, ptr<BFloat16>(da), g.k, ptr<BFloat16>(db), g.k, 0.0f,
                    ptr<BFloat16>(c), g.n, cuda::GemmEpilogue::kBias, ptr<BFloat16>(dbias));
    EXPECT_TRUE(within(doubles(to_host<BFloat16>(c, mn)), pre, p.sum_abs, kRound, kAcc)) << "bias " << where;

    DeviceBuffer aux = to_device(bf16_of(nans(mn)));
    cuda::gemm_bf16(false, true, g.m, g.n, g.k, 1.0f, ptr<BFloat16>(da), g.k, ptr<BFloat16>(db), g.k, 0.0f,
                    ptr<BFloat16>(c), g.n, cuda::GemmEpilogue::kGeluAux, ptr<BFloat16>(dbias), ptr<BFloat16>(aux));
    const auto aux_host = to_host<BFloat16>(aux, mn);
    EXPECT_TRUE(within(doubles(aux_host), pre, p.sum_abs, kRound, kAcc)) << "gelu aux " << where;
    EXPECT_TRUE(within(doubles(to_host<BFloat16>(c, mn)), act, p.sum_abs, 2 * kRound, 1.2 * kAcc))
        << "gelu " << where;

    // dGELU with the bias gradient: C = product * gelu'(aux), dbias = column sums of C.
    // cuBLASLt's gelu' misses the tanh form's by up to kGeluAbs where tanh saturates (the
    // H200 run gave 0 where product x the tanh form's gelu' is 4.7e-6): |product| kGeluAbs more.
    // A missing dGELU is off by O(1) wherever |x| < 3.
    constexpr double kGeluAbs = 1.0 / 128;
    std::vector<double> dgelu(mn), dgelu_s(mn), dgelu_abs(mn), dbias_ref(ns, 0.0), dbias_s(ns, 0.0),
        dbias_abs(ns, 0.0);
    for (std::size_t i = 0; i < mn; ++i) {
      const double d = gelu_grad(as_double(aux_host[i]));
      dgelu[i] = p.ref[i] * d, dgelu_s[i] = p.sum_abs[i] * std::fabs(d);
      dgelu_abs[i] = kGeluAbs * std::fabs(p.ref[i]);
      dbias_ref[i % ns] += dgelu[i], dbias_s[i % ns] += dgelu_s[i] + std::fabs(dgelu[i]);
      dbias_abs[i % ns] += dgelu_abs[i];
    }
    DeviceBuffer ddbias = to_device(bf16_of(nans(ns)));  // the bias gradient in C's type too
    cuda::gemm_bf16(false, true, g.m, g.n, g.k, 1.0f, ptr<BFloat16>(da), g.k, ptr<BFloat16>(db), g.k, 0.0f,
                    ptr<BFloat16>(c), g.n, cuda::GemmEpilogue::kDGelu, nullptr, ptr<BFloat16>(aux),
                    ptr<BFloat16>(ddbias));
    EXPECT_TRUE(within(doubles(to_host<BFloat16>(c, mn)), dgelu, dgelu_s, 2 * kRound, 1.2 * kAcc, dgelu_abs))
        << "dgelu " << where;
    // The column sums may be taken before or after the rounding of C (2^-8 of the sum of
    // |terms| at most), then rounded to bf16 (2^-8 of the sum): 2^-7 of the sum of |terms|
    // covers both, 2^-8 relative the last rounding once more.
    const std::vector<double> got_dbias = doubles(to_host<BFloat16>(ddbias, ns));
    EXPECT_TRUE(within(got_dbias, dbias_ref, dbias_s, 1.0 / 256, kRound, dbias_abs)) << "dgelu bias gradient " << where;

    // The weight gradient into fp32 with beta 1: dW[n, k] += dout[m, n]^T inp[m, k], and
    // the bias gradient of dout (BGRADB) from the same read.
    const auto w0 = normal(static_cast<std::size_t>(g.n * g.k), 9);
    DeviceBuffer dw = to_device(w0), gb = to_device(nans(ns));
    // dout = C's shape [m, n] (the a of the product: trans_a), inp = A [m, k].
    const auto dout = bf16_of(normal(mn, 10));
    DeviceBuffer ddout = to_device(dout);
    cuda::gemm_bf16_f32(true, false, g.n, g.k, g.m, 1.0f, ptr<BFloat16>(ddout), g.n, ptr<BFloat16>(da), g.k, 1.0f,
                        ptr<float>(dw), g.k, cuda::GemmEpilogue::kBGradB, ptr<float>(gb));
    std::vector<double> wref(w0.begin(), w0.end()), ws(w0.size(), 0.0), gref(ns, 0.0), gs(ns, 0.0);
    for (std::int64_t i = 0; i < g.m; ++i)
      for (std::int64_t o = 0; o < g.n; ++o) {
        const double d = as_double(dout[static_cast<std::size_t>(i * g.n + o)]);
        gref[static_cast<std::size_t>(o)] += d, gs[static_cast<std::size_t>(o)] += std::fabs(d);
        for (std::int64_t l = 0; l < g.k; ++l) {
          const double t = d * as_double(p.a[static_cast<std::size_t>(i * g.k + l)]);
          wref[static_cast<std::size_t>(o * g.k + l)] += t, ws[static_cast<std::size_t>(o * g.k + l)] += std::fabs(t);
        }
      }
    for (std::size_t i = 0; i < ws.size(); ++i) ws[i] += std::fabs(w0[i]);  // beta C joins the sum
    const auto wh = to_host<float>(dw, w0.size()), gh = to_host<float>(gb, ns);
    EXPECT_TRUE(within(std::vector<double>(wh.begin(), wh.end()), wref, ws, 1e-6, kAcc)) << "weight gradient " << where;
    EXPECT_TRUE(within(std::vector<double>(gh.begin(), gh.end()), gref, gs, 1e-6, kAcc)) << "BGRADB " << where;
  }
}

// --precision bf16 on the device: a Linear whose store says MatmulPrecision::kBf16 casts both
// operands of each product to bf16 (cuda::cast, bit-exact with BFloat16) and runs
// gemm_bf16_f32; the CPU layer multiplies the same rounded values in fp32. Both sum the same
// exact products (8 x 8 significant bits fit fp32), in other orders: each within (k + 1) u S
// of the exact sum (u = 2^-24, S the sum of |terms|), the tensor cores' adder (truncating,
// Fasi et al. 2021) within twice that, so the two within 4 (k + 1) u S. The CPU's fp32 layer
// (no rounding) misses the device's result by far more somewhere: the rounding is on.
TEST(CudaGemmBf16, Bf16LinearOnTheDeviceIsTheCpuBf16Linear) {
  NDMESH_GPU_OR_SKIP();
  for (const GemmCase& g : {GemmCase{7, 5, 5}, GemmCase{33, 130, 96}, GemmCase{129, 96, 130}}) {
    const std::int64_t rows = g.m, out = g.n, in = g.k;
    const std::string where =
        "rows=" + std::to_string(rows) + " in=" + std::to_string(in) + " out=" + std::to_string(out);
    const auto inp = normal(static_cast<std::size_t>(rows * in), 3);
    const auto dout = normal(static_cast<std::size_t>(rows * out), 4);
    struct Run {
      std::vector<float> out, dinp, dweight;
    };
    auto run = [&](MatmulPrecision precision, Device device) {
      ParamStore<float> store;
      store.set_matmul_precision(precision);
      const nn::Linear<float> linear(store, {.in = in, .out = out});
      store.allocate();
      const auto params = normal(static_cast<std::size_t>(store.size()), 7);
      store.params_from_host(params.data());
      store.to(device);
      const std::size_t n_out = static_cast<std::size_t>(rows * out), n_in = static_cast<std::size_t>(rows * in);
      Run r;
      if (device == Device::kCpu) {
        r.out.assign(n_out, 0.0f), r.dinp.assign(n_in, 0.5f);
        linear.forward(inp.data(), r.out.data(), rows);
        linear.backward(dout.data(), inp.data(), r.dinp.data(), rows);
        const float* dw = store.grad(linear.weight_id());
        r.dweight.assign(dw, dw + in * out);
        return r;
      }
      DeviceBuffer din = to_device(inp), ddout = to_device(dout), dy = to_device(nans(n_out)),
                   ddinp = to_device(std::vector<float>(n_in, 0.5f));
      linear.forward(ptr<float>(din), ptr<float>(dy), rows);
      linear.backward(ptr<float>(ddout), ptr<float>(din), ptr<float>(ddinp), rows);
      r.out = to_host<float>(dy, n_out), r.dinp = to_host<float>(ddinp, n_in);
      const auto grads = store.grads();
      std::vector<float> host(grads.size());
      cuda::copy_to_host(host.data(), grads.data(), grads.size() * sizeof(float));
      const auto offset = static_cast<std::size_t>(store.view(linear.weight_id()).offset);
      r.dweight.assign(host.begin() + static_cast<std::ptrdiff_t>(offset),
                       host.begin() + static_cast<std::ptrdiff_t>(offset + static_cast<std::size_t>(in * out)));
      return r;
    };
    const Run gpu = run(MatmulPrecision::kBf16, Device::kCuda), cpu = run(MatmulPrecision::kBf16, Device::kCpu),
              fp32 = run(MatmulPrecision::kFp32, Device::kCpu);
    // S per element, from the rounded operands (the weights as the store holds them).
    ParamStore<float> store;
    const nn::Linear<float> shape(store, {.in = in, .out = out});
    store.allocate();
    const auto params = normal(static_cast<std::size_t>(store.size()), 7);
    const float* w = params.data() + store.view(shape.weight_id()).offset;
    const float* b = params.data() + store.view(shape.bias_id()).offset;
    auto r16 = [](float x) { return std::fabs(static_cast<double>(static_cast<float>(BFloat16(x)))); };
    std::vector<double> s_out(gpu.out.size()), s_dinp(gpu.dinp.size(), 0.5), s_dw(gpu.dweight.size(), 0.0);
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t o = 0; o < out; ++o) {
        const auto ro = static_cast<std::size_t>(r * out + o);
        s_out[ro] += std::fabs(b[o]);
        for (std::int64_t i = 0; i < in; ++i) {
          const auto ri = static_cast<std::size_t>(r * in + i), oi = static_cast<std::size_t>(o * in + i);
          s_out[ro] += r16(inp[ri]) * r16(w[oi]);
          s_dinp[ri] += r16(dout[ro]) * r16(w[oi]);
          s_dw[oi] += r16(dout[ro]) * r16(inp[ri]);
        }
      }
    const double u = std::ldexp(1.0, -24);
    auto d = [](const std::vector<float>& x) { return std::vector<double>(x.begin(), x.end()); };
    EXPECT_TRUE(within(d(gpu.out), d(cpu.out), s_out, 0, 4.0 * static_cast<double>(in + 2) * u))
        << "forward " << where;
    EXPECT_TRUE(within(d(gpu.dinp), d(cpu.dinp), s_dinp, 0, 4.0 * static_cast<double>(out + 2) * u))
        << "input gradient " << where;
    EXPECT_TRUE(within(d(gpu.dweight), d(cpu.dweight), s_dw, 0, 4.0 * static_cast<double>(rows + 2) * u))
        << "weight gradient " << where;
    EXPECT_FALSE(within(d(gpu.out), d(fp32.out), s_out, 0, 4.0 * static_cast<double>(in + 2) * u))
        << "the device's bf16 forward equals the fp32 one within the bound: not rounded " << where;
  }
}

}  // namespace
}  // namespace ndmesh
