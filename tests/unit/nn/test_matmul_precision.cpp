// Mixed precision at the matrix products (MatmulPrecision::kBf16): nn::Linear's forward,
// input gradient and weight gradient, and ops::gemm under every transpose and padded strides,
// against a double reference computed from the operands rounded to bfloat16 (nearest even).
//
// The bound: a product of two bf16 values (8 significant bits each) is exact in fp32, so the
// only error left is the fp32 accumulation of the k products and of what the result already
// held (beta C, the bias): in any summation order |got - ref| <= gamma_k S with
// gamma_k = k u / (1 - k u) <= (k + 1) u, u = 2^-24 and S the sum of the magnitudes of the
// terms (Higham, Accuracy and Stability of Numerical Algorithms, 3.1). The same layer in fp32
// misses that reference by the operands' rounding (up to 2^-8 of each term, random in sign,
// against the bound's k 2^-24 per term): the test asserts that it is more than 10 times the
// bound (measured: 31x at k = 300, 165x to 12000x elsewhere; the bf16 layer stays within 0.2x
// of it), so a rounding that is silently off fails.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <limits>
#include <vector>

#include <gtest/gtest.h>

#include "ndmesh/core/dtype.hpp"
#include "ndmesh/nn/block.hpp"
#include "ndmesh/nn/gelu.hpp"
#include "ndmesh/nn/layernorm.hpp"
#include "ndmesh/nn/linear.hpp"
#include "ndmesh/nn/mlp.hpp"
#include "ndmesh/tensor/ops.hpp"
#include "ndmesh/tensor/rng.hpp"

namespace ndmesh {
namespace {

constexpr double kUnit = 1.0 / (1 << 24);  // fp32's unit roundoff

double bf16(float x) { return static_cast<float>(BFloat16(x)); }

std::vector<float> normal(std::size_t n, std::uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(rng.normal());
  return v;
}

// A reference value and the sum of the magnitudes of its terms.
struct Ref {
  double value = 0, magnitude = 0;
  void add(double t) { value += t, magnitude += std::fabs(t); }
};

// Largest |got - ref| / ((terms + 1) u S) over the entries: <= 1 is within the bound.
double worst(const std::vector<float>& got, const std::vector<Ref>& ref, std::int64_t terms) {
  double w = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    w = std::max(w, std::fabs(got[i] - ref[i].value) /
                        (static_cast<double>(terms + 1) * kUnit * ref[i].magnitude + 1e-300));
  return w;
}

struct Shape {
  std::int64_t rows, in, out;
};

// Forward, input gradient (accumulated onto nonzero values), weight gradient (accumulated
// onto nonzero values) and bias gradient of a Linear<float> whose store says `precision`.
struct LinearRun {
  std::vector<float> out, dinp, dweight, dbias;
};

LinearRun run_linear(const Shape& s, MatmulPrecision precision, const std::vector<float>& inp,
                     const std::vector<float>& dout, const std::vector<float>& weight,
                     const std::vector<float>& bias, const std::vector<float>& dinp0,
                     const std::vector<float>& dweight0) {
  ParamStore<float> store;
  store.set_matmul_precision(precision);
  nn::Linear<float> lin(store, {.in = s.in, .out = s.out, .bias = true});
  store.allocate();
  std::copy(weight.begin(), weight.end(), store.mutable_param(lin.weight_id()));
  std::copy(bias.begin(), bias.end(), store.mutable_param(lin.bias_id()));
  std::copy(dweight0.begin(), dweight0.end(), store.grad(lin.weight_id()));
  LinearRun r;
  r.out.assign(static_cast<std::size_t>(s.rows * s.out), std::nanf(""));  // overwritten
  lin.forward(inp.data(), r.out.data(), s.rows);
  r.dinp = dinp0;
  lin.backward(dout.data(), inp.data(), r.dinp.data(), s.rows);
  r.dweight.assign(store.grad(lin.weight_id()), store.grad(lin.weight_id()) + s.out * s.in);
  r.dbias.assign(store.grad(lin.bias_id()), store.grad(lin.bias_id()) + s.out);
  return r;
}

TEST(MatmulPrecision, Bf16LinearIsTheFp32SumOfBf16RoundedProducts) {
  for (const Shape& s : {Shape{13, 67, 29}, Shape{5, 300, 7}, Shape{96, 33, 130}}) {
    const auto n_in = static_cast<std::size_t>(s.rows * s.in),
               n_out = static_cast<std::size_t>(s.rows * s.out);
    const auto n_w = static_cast<std::size_t>(s.out * s.in);
    const auto inp = normal(n_in, 1), dout = normal(n_out, 2), weight = normal(n_w, 3);
    const auto bias = normal(static_cast<std::size_t>(s.out), 4), dinp0 = normal(n_in, 5),
               dweight0 = normal(n_w, 6);
    const LinearRun got = run_linear(s, MatmulPrecision::kBf16, inp, dout, weight, bias, dinp0, dweight0);
    const LinearRun fp32 = run_linear(s, MatmulPrecision::kFp32, inp, dout, weight, bias, dinp0, dweight0);

    // The references from the rounded operands, in double.
    std::vector<Ref> out(n_out), dinp(n_in), dweight(n_w), dbias(static_cast<std::size_t>(s.out));
    for (std::int64_t r = 0; r < s.rows; ++r)
      for (std::int64_t o = 0; o < s.out; ++o) {
        Ref& y = out[static_cast<std::size_t>(r * s.out + o)];
        y.add(bias[static_cast<std::size_t>(o)]);
        const double d = dout[static_cast<std::size_t>(r * s.out + o)];
        // The bias gradient: fp32 sums of dout rounded, what the products read (on CUDA the
        // weight gradient's product sums it as it reads it).
        dbias[static_cast<std::size_t>(o)].add(bf16(static_cast<float>(d)));
        for (std::int64_t i = 0; i < s.in; ++i) {
          const double x = bf16(inp[static_cast<std::size_t>(r * s.in + i)]);
          const double w = bf16(weight[static_cast<std::size_t>(o * s.in + i)]);
          y.add(x * w);
          dinp[static_cast<std::size_t>(r * s.in + i)].add(bf16(static_cast<float>(d)) * w);
          dweight[static_cast<std::size_t>(o * s.in + i)].add(bf16(static_cast<float>(d)) * x);
        }
      }
    for (std::size_t i = 0; i < n_in; ++i) dinp[i].add(dinp0[i]);
    for (std::size_t i = 0; i < n_w; ++i) dweight[i].add(dweight0[i]);

    const std::string where =
        "rows=" + std::to_string(s.rows) + " in=" + std::to_string(s.in) + " out=" + std::to_string(s.out);
    EXPECT_LE(worst(got.out, out, s.in + 1), 1.0) << "forward " << where;
    EXPECT_LE(worst(got.dinp, dinp, s.out + 1), 1.0) << "input gradient " << where;
    EXPECT_LE(worst(got.dweight, dweight, s.rows + 1), 1.0) << "weight gradient " << where;
    EXPECT_LE(worst(got.dbias, dbias, s.rows), 1.0) << "bias gradient " << where;
    // fp32 misses the bf16 reference by far more than the bound: the rounding is really on.
    EXPECT_GT(worst(fp32.out, out, s.in + 1), 10.0) << "forward " << where;
    EXPECT_GT(worst(fp32.dinp, dinp, s.out + 1), 10.0) << "input gradient " << where;
    EXPECT_GT(worst(fp32.dweight, dweight, s.rows + 1), 10.0) << "weight gradient " << where;
    EXPECT_GT(worst(fp32.dbias, dbias, s.rows), 10.0) << "bias gradient " << where;
  }
}

// ops::gemm rounds exactly the stored operands: every transpose, row strides longer than the
// rows (whatever lies between the rows is never read), beta 0 over NaN and beta != 0.
TEST(MatmulPrecision, Bf16GemmEveryTransposeAndStride) {
  const std::int64_t m = 7, n = 11, k = 37;
  std::uint64_t seed = 10;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb)
      for (float beta : {0.0f, 0.5f}) {
        const std::int64_t a_rows = ta ? k : m, a_cols = ta ? m : k, b_rows = tb ? n : k, b_cols = tb ? k : n;
        const std::int64_t lda = a_cols + 3, ldb = b_cols + 5, ldc = n + 2;
        auto a = normal(static_cast<std::size_t>(a_rows * lda), seed++);
        auto b = normal(static_cast<std::size_t>(b_rows * ldb), seed++);
        for (std::int64_t r = 0; r < a_rows; ++r)
          for (std::int64_t c = a_cols; c < lda; ++c)
            a[static_cast<std::size_t>(r * lda + c)] = std::nanf("");
        for (std::int64_t r = 0; r < b_rows; ++r)
          for (std::int64_t c = b_cols; c < ldb; ++c)
            b[static_cast<std::size_t>(r * ldb + c)] = std::nanf("");
        auto c0 = normal(static_cast<std::size_t>(m * ldc), seed++);
        if (beta == 0.0f) std::fill(c0.begin(), c0.end(), std::nanf(""));
        auto at = [&](const std::vector<float>& x, std::int64_t ld, bool t, std::int64_t i, std::int64_t j) {
          return x[static_cast<std::size_t>(t ? j * ld + i : i * ld + j)];
        };
        std::vector<float> c = c0, c32 = c0;
        ops::gemm<float>(Device::kCpu, MatmulPrecision::kBf16, ta, tb, m, n, k, 0.75f, a.data(), lda,
                         b.data(), ldb, beta, c.data(), ldc);
        ops::gemm<float>(Device::kCpu, MatmulPrecision::kFp32, ta, tb, m, n, k, 0.75f, a.data(), lda,
                         b.data(), ldb, beta, c32.data(), ldc);
        std::vector<float> got, got32;
        std::vector<Ref> ref;
        for (std::int64_t i = 0; i < m; ++i)
          for (std::int64_t j = 0; j < n; ++j) {
            Ref y;
            if (beta != 0.0f) y.add(beta * static_cast<double>(c0[static_cast<std::size_t>(i * ldc + j)]));
            for (std::int64_t l = 0; l < k; ++l)
              y.add(0.75 * bf16(at(a, lda, ta, i, l)) * bf16(at(b, ldb, tb, l, j)));
            ref.push_back(y);
            got.push_back(c[static_cast<std::size_t>(i * ldc + j)]);
            got32.push_back(c32[static_cast<std::size_t>(i * ldc + j)]);
          }
        // alpha 0.75 and beta 0.5 add one rounding each of their products: k + 3 terms' worth.
        EXPECT_LE(worst(got, ref, k + 2), 1.0) << "trans_a=" << ta << " trans_b=" << tb << " beta=" << beta;
        EXPECT_GT(worst(got32, ref, k + 2), 10.0)
            << "trans_a=" << ta << " trans_b=" << tb << " beta=" << beta;
      }
}

// The rounding is BFloat16's on every kind of value: ties to even both ways, the largest
// floats to infinity, infinities, subnormals, NaN (as a 1 x 1 x k product with B = 1 and A
// one value and zeros, so C is the rounded value itself).
// Under bf16 products the MLP keeps its pre-activation and hidden activation in bfloat16
// (fc16, gelu16; the fp32 tensors stay empty), as fc's product writes them on a GPU (cuBLASLt's
// GELU epilogue with its aux): with t = fc's fp32 product + its bias rounded to bf16, fc16 is t
// rounded once and gelu16 is gelu(t) rounded once. The backward writes d pre in bf16, gelu' taken
// at the stored fc16, rounded once, and fc's products read it as it lies. Checked bit for bit
// against the layers' building blocks (ops::gemm, nn::Gelu, Linear's bf16 backward) run apart.
TEST(MatmulPrecision, Bf16MlpKeepsItsPreActivationAndHiddenInBf16) {
  const std::int64_t rows = 9, c = 24, f = 40;
  ParamStore<float> store;
  store.set_matmul_precision(MatmulPrecision::kBf16);
  const nn::Mlp<float> mlp(store, {.channels = c, .ffn = f});
  store.allocate();
  const auto p = normal(static_cast<std::size_t>(store.size()), 3);
  std::copy(p.begin(), p.end(), store.params().begin());
  EXPECT_TRUE(mlp.hidden_in_bf16());
  nn::MlpActivations<float> acts;
  acts.resize(rows, mlp.pre_width(), f, mlp.hidden_in_bf16());
  ASSERT_EQ(acts.hidden.numel() + acts.pre.numel(), 0);
  ASSERT_EQ(acts.hidden16.numel(), rows * f);
  ASSERT_EQ(acts.pre16.numel(), rows * f);
  const auto inp = normal(static_cast<std::size_t>(rows * c), 4), dout = normal(static_cast<std::size_t>(rows * c), 5);
  const auto n = static_cast<std::size_t>(rows * f);
  std::vector<float> out(inp.size()), dinp(inp.size());
  std::vector<BFloat16> scratch(n);
  mlp.forward(inp.data(), out.data(), acts, rows);
  // t = the product of the rounded operands in fp32, plus the bias rounded to bf16.
  const float* w = store.param(mlp.fc().weight_id());
  const float* bias = store.param(mlp.fc().bias_id());
  std::vector<float> t(n), gelu(n), hidden(n);
  ops::gemm<float>(false, true, rows, f, c, 1.0f,
                   ops::SharedOperand<float>(Device::kCpu, MatmulPrecision::kBf16, inp.data(), rows * c), c,
                   ops::SharedOperand<float>(Device::kCpu, MatmulPrecision::kBf16, w, f * c), c, 0.0f,
                   t.data(), f);
  for (std::size_t i = 0; i < n; ++i)
    t[i] += static_cast<float>(BFloat16(bias[i % static_cast<std::size_t>(f)]));
  nn::Gelu<float>::forward(t.data(), gelu.data(), rows * f);
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_EQ(acts.pre16.data()[i].bits, BFloat16(t[i]).bits) << "pre-activation, element " << i;
    ASSERT_EQ(acts.hidden16.data()[i].bits, BFloat16(gelu[i]).bits) << "hidden, element " << i;
    hidden[i] = static_cast<float>(acts.hidden16.data()[i]);
  }
  store.zero_grad();
  mlp.backward(dout.data(), inp.data(), acts, dinp.data(), scratch.data(), rows);
  const std::vector<float> grads(store.grads().begin(), store.grads().end());

  // Apart: proj's output and fp32 input gradient from the stored hidden, GELU's derivative at
  // the stored pre-activation, rounded once, then fc's backward from that bf16 gradient.
  std::vector<float> ref_out(out.size()), ref_dinp(dinp.size()), dhidden(n), pre(n);
  std::vector<BFloat16> dpre(n);
  mlp.proj().forward(acts.hidden16.data(), ref_out.data(), rows);
  store.zero_grad();
  mlp.proj().backward(dout.data(), acts.hidden16.data(), dhidden.data(), rows, nn::GradInto::kSet);
  for (std::size_t i = 0; i < n; ++i) pre[i] = static_cast<float>(acts.pre16.data()[i]);
  nn::Gelu<float>::backward(dhidden.data(), pre.data(), dhidden.data(), rows * f);
  for (std::size_t i = 0; i < n; ++i) {
    dpre[i] = BFloat16(dhidden[i]);
    ASSERT_EQ(scratch[i].bits, dpre[i].bits) << "d pre-activation, element " << i;
  }
  mlp.fc().backward(dpre.data(), f, inp.data(), ref_dinp.data(), rows, nn::GradInto::kSet);
  const std::vector<float> ref_grads(store.grads().begin(), store.grads().end());
  auto same_bits = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };
  EXPECT_TRUE(same_bits(out, ref_out)) << "output";
  EXPECT_TRUE(same_bits(dinp, ref_dinp)) << "input gradient";
  EXPECT_TRUE(same_bits(grads, ref_grads)) << "parameter gradients";
  // The fp32 scratch is the fp32 MLP's, not this one's.
  std::vector<float> scratch32(n);
  EXPECT_THROW(mlp.backward(dout.data(), inp.data(), acts, dinp.data(), scratch32.data(), rows),
               InternalError);
}

// Under bf16 products (without sequence parallelism) a block keeps its norms' outputs in
// bfloat16: LayerNorm's forward and the residual + LayerNorm pass write each output as the T
// forward computes it, rounded once; the statistics and the residual stay T, bit for bit.
TEST(MatmulPrecision, Bf16NormOutputsAreTheNormsRoundedOnce) {
  const std::int64_t rows = 7, c = 48;
  ParamStore<float> store;
  const nn::LayerNorm<float> ln(store, {.channels = c});
  store.allocate();
  const auto p = normal(static_cast<std::size_t>(store.size()), 6);
  std::copy(p.begin(), p.end(), store.params().begin());
  const auto x = normal(static_cast<std::size_t>(rows * c), 7), add = normal(x.size(), 8), bias = normal(c, 9);
  const auto n = x.size(), r = static_cast<std::size_t>(rows);
  std::vector<float> out(n), mean(r), rstd(r), res(n), mean16(r), rstd16(r), res16(n);
  std::vector<BFloat16> out16(n);
  auto rounded_once = [&](const char* what) {
    for (std::size_t i = 0; i < n; ++i)
      ASSERT_EQ(out16[i].bits, BFloat16(out[i]).bits) << what << ", element " << i;
    EXPECT_EQ(mean16, mean) << what;
    EXPECT_EQ(rstd16, rstd) << what;
  };
  ln.forward(x.data(), out.data(), mean.data(), rstd.data(), rows);
  ln.forward(x.data(), out16.data(), mean16.data(), rstd16.data(), rows);
  rounded_once("forward");
  ln.forward_residual(x.data(), add.data(), res.data(), out.data(), mean.data(), rstd.data(), rows, bias.data());
  ln.forward_residual(x.data(), add.data(), res16.data(), out16.data(), mean16.data(), rstd16.data(), rows,
                      bias.data());
  rounded_once("residual + norm");
  EXPECT_EQ(res16, res) << "the residual stays fp32";
}

// Under bf16 products a block keeps its attention's input, output and gradients in bfloat16
// (qkv16, atty16; scratch.datty16, dqkv16; the fp32 tensors stay empty), as cuDNN reads and
// writes them on a GPU:
//  - qkv16 and datty16 are products rounded once: within half a bf16 ulp (2^-8 relative) of
//    the exact product of the bf16 operands (qkv's bias rounded to bf16 too, added before the
//    rounding), plus fp32 accumulation's few 2^-24 of the sum of |terms|;
//  - atty16 is the attention core's fp32 output from qkv16 widened, rounded once (bit for bit);
//  - dqkv16 is the fp32 backward from the widened qkv16, atty16 and datty16, rounded once (bit
//    for bit), which the backward from the unrounded output is not.
// Selective recompute writes the same bits again.
TEST(MatmulPrecision, Bf16AttentionInputOutputAndGradientsAreStoredRoundedOnce) {
  const std::int64_t batch = 2, seq = 5, c = 16, rows = batch * seq;
  ParamStore<float> store;
  store.set_matmul_precision(MatmulPrecision::kBf16);
  const nn::Block<float> block(store, {.channels = c, .heads = 4, .kv_heads = 2, .ffn = 24});
  store.allocate();
  const auto p = normal(static_cast<std::size_t>(store.size()), 10);
  std::copy(p.begin(), p.end(), store.params().begin());
  nn::BlockActivations<float> acts;
  nn::BlockScratch<float> scratch;
  block.resize(acts, batch, seq);
  block.resize(scratch, batch, seq);
  const std::int64_t width = block.attention().out_width(), qw = block.attention().qkv_width();
  ASSERT_EQ(acts.atty.numel() + acts.qkv.numel() + scratch.dqkv.numel() + scratch.datty.numel(), 0);
  ASSERT_EQ(acts.atty16.numel(), rows * width);
  ASSERT_EQ(acts.qkv16.numel(), rows * qw);
  const auto x = normal(static_cast<std::size_t>(rows * c), 11), dout = normal(x.size(), 12);
  block.forward(x.data(), acts, batch, seq);
  // A product rounded once: |got - exact| within half an ulp plus the fp32 sum's error.
  const auto check_product = [](const char* what, const BFloat16* got, std::int64_t m, std::int64_t n,
                                std::int64_t k, auto a, auto b, auto bias) {
    for (std::int64_t r = 0; r < m; ++r)
      for (std::int64_t j = 0; j < n; ++j) {
        double exact = bias(j), terms = std::fabs(bias(j));
        for (std::int64_t q = 0; q < k; ++q) {
          exact += a(r, q) * b(q, j);
          terms += std::fabs(a(r, q) * b(q, j));
        }
        const double g = static_cast<float>(got[r * n + j]);
        ASSERT_LE(std::fabs(g - exact), 0x1p-8 * std::fabs(exact) + 2 * static_cast<double>(k + 1) * kUnit * terms)
            << what << " [" << r << ", " << j << "]: " << g << " for " << exact;
      }
  };
  const nn::Linear<float>& qkv = block.qkv();
  const float* wq = store.param(qkv.weight_id());
  const float* bq = store.param(qkv.bias_id());
  check_product(
      "qkv16", acts.qkv16.data(), rows, qw, c,
      [&](std::int64_t r, std::int64_t q) { return static_cast<double>(static_cast<float>(acts.ln1_16.data()[r * c + q])); },
      [&](std::int64_t q, std::int64_t j) { return bf16(wq[j * c + q]); }, [&](std::int64_t j) { return bf16(bq[j]); });
  // The core's fp32 output and statistics from the stored qkv, widened.
  const auto n = static_cast<std::size_t>(rows * width), nq = static_cast<std::size_t>(rows * qw);
  const auto widen = [](const BFloat16* v, std::size_t count) {
    std::vector<float> w(count);
    for (std::size_t i = 0; i < count; ++i) w[i] = static_cast<float>(v[i]);
    return w;
  };
  const std::vector<float> qkv32 = widen(acts.qkv16.data(), nq);
  std::vector<float> out(n), lse(static_cast<std::size_t>(acts.lse.numel()));
  block.attention().forward(qkv32.data(), out.data(), lse.data(), batch, seq);
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(acts.atty16.data()[i].bits, BFloat16(out[i]).bits) << "atty16 " << i;
  ASSERT_EQ(std::memcmp(lse.data(), acts.lse.data(), lse.size() * sizeof(float)), 0);
  std::vector<float> dx(x.size());
  store.zero_grad();
  block.backward(dout.data(), x.data(), acts, scratch, dx.data(), batch, seq);
  // d atty = d res1 (what the block's attention branch received) times proj's weight.
  const float* wp = store.param(block.proj().weight_id());
  check_product(
      "datty16", scratch.datty16.data(), rows, width, c,
      [&](std::int64_t r, std::int64_t q) { return bf16(scratch.dres1.data()[r * c + q]); },
      [&](std::int64_t q, std::int64_t j) { return bf16(wp[q * width + j]); }, [](std::int64_t) { return 0.0; });
  const std::vector<float> atty32 = widen(acts.atty16.data(), n), datty32 = widen(scratch.datty16.data(), n);
  std::vector<float> dqkv(nq, 0.0f);
  block.attention().backward(datty32.data(), qkv32.data(), atty32.data(), lse.data(), dqkv.data(), batch, seq);
  for (std::size_t i = 0; i < nq; ++i)
    ASSERT_EQ(scratch.dqkv16.data()[i].bits, BFloat16(dqkv[i]).bits) << "dqkv16 " << i;
  // The backward from the unrounded output differs (the test can tell the two apart).
  std::vector<float> from_fp32(nq, 0.0f);
  block.attention().backward(datty32.data(), qkv32.data(), out.data(), lse.data(), from_fp32.data(), batch, seq);
  EXPECT_NE(std::memcmp(from_fp32.data(), dqkv.data(), nq * sizeof(float)), 0);
  // Selective recompute: the same bits again.
  const std::vector<BFloat16> kept(acts.atty16.data(), acts.atty16.data() + n);
  std::fill(acts.atty16.data(), acts.atty16.data() + n, BFloat16(0.0f));
  block.recompute_attention(acts, batch, seq);
  EXPECT_EQ(std::memcmp(kept.data(), acts.atty16.data(), n * sizeof(BFloat16)), 0);
}

// The linear layer's bfloat16 entry points are its T ones on the same values: a backward from
// a bf16 output gradient (with a bias) equals the backward from that gradient widened, and a
// backward into a bf16 input gradient is the T one's gradient rounded once; the weight and
// bias gradients bit for bit in both (the same in all four: the products round d to bf16).
TEST(MatmulPrecision, Bf16LinearGradientsInAndOutAreTheFloatOnesRoundedOnce) {
  const std::int64_t rows = 7, in = 12, out = 10;
  ParamStore<float> store;
  store.set_matmul_precision(MatmulPrecision::kBf16);
  const nn::Linear<float> layer(store, {.in = in, .out = out, .name = "l"});
  store.allocate();
  const auto p = normal(static_cast<std::size_t>(store.size()), 30);
  std::copy(p.begin(), p.end(), store.params().begin());
  const auto x = normal(static_cast<std::size_t>(rows * in), 31), d = normal(static_cast<std::size_t>(rows * out), 32);
  std::vector<BFloat16> x16(x.size()), d16(d.size());
  std::vector<float> d_wide(d.size());
  for (std::size_t i = 0; i < x.size(); ++i) x16[i] = BFloat16(x[i]);
  for (std::size_t i = 0; i < d.size(); ++i) {
    d16[i] = BFloat16(d[i]);
    d_wide[i] = static_cast<float>(d16[i]);
  }
  const auto grads = [&] { return std::vector<float>(store.grads().begin(), store.grads().end()); };
  std::vector<float> dx_ref(x.size(), 0.0f), dx(x.size(), 0.0f);
  store.zero_grad();
  layer.backward(d_wide.data(), x16.data(), dx_ref.data(), rows, nn::GradInto::kSet);
  const auto g_ref = grads();
  store.zero_grad();
  layer.backward(d16.data(), x16.data(), dx.data(), rows, nn::GradInto::kSet);
  EXPECT_EQ(dx, dx_ref) << "input gradient from a bf16 output gradient";
  EXPECT_EQ(grads(), g_ref) << "weight and bias gradients from a bf16 output gradient";
  std::vector<BFloat16> dx16(x.size());
  store.zero_grad();
  layer.backward(d.data(), x16.data(), dx_ref.data(), rows, nn::GradInto::kSet);
  const auto g_ref2 = grads();
  store.zero_grad();
  layer.backward(d.data(), x16.data(), dx16.data(), rows);
  for (std::size_t i = 0; i < x.size(); ++i) ASSERT_EQ(dx16[i].bits, BFloat16(dx_ref[i]).bits) << "element " << i;
  EXPECT_EQ(grads(), g_ref2) << "weight and bias gradients beside a bf16 input gradient";
  // The products read d rounded to bf16 either way: the same weight and bias gradients.
  EXPECT_EQ(g_ref2, g_ref);
}

TEST(MatmulPrecision, Bf16RoundingIsBFloat16s) {
  const float values[] = {1.0f + 0x1p-8f,
                          1.0f + 0x3p-8f,
                          -(1.0f + 0x1p-8f),
                          1.0f + 0x1p-8f + 0x1p-20f,
                          3.4028235e38f,
                          -3.4028235e38f,
                          0x1p-140f,
                          0x1.ffp-127f,
                          1e-45f,
                          -0.0f,
                          0.1f,
                          std::numeric_limits<float>::infinity()};
  for (float v : values) {
    const std::vector<float> a = {v, 0.0f, 0.0f}, b = {1.0f, 1.0f, 1.0f};
    float c = std::nanf("");
    ops::gemm<float>(Device::kCpu, MatmulPrecision::kBf16, false, false, 1, 1, 3, 1.0f, a.data(), 3, b.data(),
                     1, 0.0f, &c, 1);
    const float want = static_cast<float>(BFloat16(v));
    EXPECT_TRUE(c == want || (std::isnan(c) && std::isnan(want)))
        << v << " became " << c << ", BFloat16 " << want;
  }
  const std::vector<float> a = {std::nanf(""), 0.0f}, b = {1.0f, 1.0f};
  float c = 0.0f;
  ops::gemm<float>(Device::kCpu, MatmulPrecision::kBf16, false, false, 1, 1, 2, 1.0f, a.data(), 2, b.data(),
                   1, 0.0f, &c, 1);
  EXPECT_TRUE(std::isnan(c)) << "NaN became " << c;
}

}  // namespace
}  // namespace ndmesh
