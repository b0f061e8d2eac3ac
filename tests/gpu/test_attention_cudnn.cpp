// cuda::attention_forward_cudnn / attention_backward_cudnn (cuDNN's fused flash attention in
// bf16, attention_cudnn.cpp) against cuda::attention_forward / attention_backward (the fp32
// flash kernel) on the same bf16-rounded inputs: multi-head, grouped-query and multi-query
// (heads/kv_heads 4/4, 6/2, 8/2, 4/1), head dims 64 and 128, sequences of 77 to 512 rows
// (not all multiples of 64), dqkv written by cuDNN over NaN (the flash kernel adds into
// zeros), and two backward runs compared bit for bit (cuDNN's deterministic algorithm). GPU
// only: cuDNN cannot run in the emulator, and this test is built only where cuDNN attention
// is (NDMESH_CUDNN).
//
// The bound, from bf16 rounding. Both sides read the same bf16 q, k, v (and dO), and a product
// of two bf16 values is exact in fp32, so the scores S, the statistics (max, sum, lse) and
// dP = dO Vᵀ agree up to fp32 summation order and exp (a few 1e-7 relative). What cuDNN
// rounds and the fp32 kernel does not, each to bf16 with a relative error of at most
// u = 2^-8 (round to nearest):
//  - forward: P before P V, and O when it is stored. With P's normaliser l summed in fp32,
//    |O' - O| <= u sum_j P_ij |V_jd| + u |O|;
//  - backward: P before dV = Pᵀ dO and dS before dQ = dS K and dK = dSᵀ Q, and each gradient
//    when it is stored (with grouped-query heads perhaps once per query head before the sum
//    over the group, which the first term bounds again): |dV' - dV| <= 2u sum |P| |dO| + u |dV|,
//    |dQ' - dQ| <= 2u sum_j |dS_ij| |K_j| + u |dQ|, |dK' - dK| <= 2u sum_i |dS_ij| |Q_i| + u |dK|.
// The sums of absolute values are computed here in double from the same bf16 inputs (P and dS
// from the flash kernel's lse and out); the bound is that times 1.25 (the fp32 noise above and
// rounding ties), plus 2e-5 absolute. A wrong mask, head, group or scale changes outputs by
// P_ij |V_j| for a whole key (about 1/seq of |V| or more) in every row it touches, above the
// bound for most elements; lse to 5e-5 absolute (a key too many or too few moves it by
// about 1/seq).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "gpu_test.hpp"
#include "ndmesh/core/dtype.hpp"
#include "ndmesh/core/error.hpp"
#include "ndmesh/nn/cuda_ops.hpp"

namespace ndmesh {
namespace {

using namespace testing;  // gpu_test.hpp

constexpr double kU = 1.0 / 256;  // bf16's unit roundoff (8 significant bits, to nearest)

struct Case {
  std::int64_t batch, seq, heads, kv_heads, head_dim;
};

std::string describe(const Case& c) {
  return "batch=" + std::to_string(c.batch) + " seq=" + std::to_string(c.seq) +
         " heads=" + std::to_string(c.heads) + "/" + std::to_string(c.kv_heads) +
         " head_dim=" + std::to_string(c.head_dim);
}

std::vector<float> rounded(std::vector<float> v) {
  for (float& x : v) x = static_cast<float>(BFloat16(x));
  return v;
}

// The bound of each element: 1.25 (k u sums + u |ref - base|) + 2e-5, where ref - base is
// the kernel's own contribution (the backward accumulates onto base).
std::vector<double> bound(const std::vector<double>& sums, double k, const std::vector<float>& ref,
                          const std::vector<float>* base) {
  std::vector<double> b(ref.size());
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double own = std::fabs(static_cast<double>(ref[i]) - (base ? (*base)[i] : 0.0));
    b[i] = 1.25 * (k * kU * sums[i] + kU * own) + 2e-5;
  }
  return b;
}

::testing::AssertionResult within(const std::vector<float>& got, const std::vector<float>& ref,
                                  const std::vector<double>& b) {
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (!(std::fabs(static_cast<double>(got[i]) - ref[i]) <= b[i]) && bad++ == 0) first = i;
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << got.size() << " elements beyond the bf16 bound; first at [" << first << "]: got "
         << got[first] << ", ref " << ref[first] << ", bound " << b[first];
}

// The sums of absolute values the bounds need, in double, from the bf16 inputs and the fp32
// kernel's lse and out: [out-shaped] sum_j P |V|; [qkv-shaped] dQ: sum_j |dS| |K|, dK: sum
// over the group's heads and queries of |dS| |Q|, dV: of P |dO|.
void magnitudes(const Case& c, const std::vector<float>& qkv, const std::vector<float>& dout,
                const std::vector<float>& out, const std::vector<float>& lse, std::vector<double>& out_sums,
                std::vector<double>& grad_sums) {
  const std::int64_t H = c.heads, KV = c.kv_heads, hd = c.head_dim, S = c.seq, W = (H + 2 * KV) * hd;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  out_sums.assign(static_cast<std::size_t>(c.batch * S * H * hd), 0.0);
  grad_sums.assign(static_cast<std::size_t>(c.batch * S * W), 0.0);
  std::vector<double> p(static_cast<std::size_t>(S)), ds(static_cast<std::size_t>(S));
  for (std::int64_t b = 0; b < c.batch; ++b)
    for (std::int64_t h = 0; h < H; ++h) {
      const std::int64_t g = h / (H / KV);
      for (std::int64_t i = 0; i < S; ++i) {
        const float* q = &qkv[static_cast<std::size_t>((b * S + i) * W + h * hd)];
        const float* o = &out[static_cast<std::size_t>((b * S + i) * H * hd + h * hd)];
        const float* d_o = &dout[static_cast<std::size_t>((b * S + i) * H * hd + h * hd)];
        const double l = lse[static_cast<std::size_t>((b * H + h) * S + i)];
        double delta = 0;
        for (std::int64_t d = 0; d < hd; ++d) delta += static_cast<double>(o[d]) * d_o[d];
        for (std::int64_t j = 0; j <= i; ++j) {
          const float* k = &qkv[static_cast<std::size_t>((b * S + j) * W + (H + g) * hd)];
          const float* v = &qkv[static_cast<std::size_t>((b * S + j) * W + (H + KV + g) * hd)];
          double s = 0, dp = 0;
          for (std::int64_t d = 0; d < hd; ++d)
            s += static_cast<double>(q[d]) * k[d], dp += static_cast<double>(d_o[d]) * v[d];
          p[static_cast<std::size_t>(j)] = std::exp(s * scale - l);
          ds[static_cast<std::size_t>(j)] = std::fabs(p[static_cast<std::size_t>(j)] * (dp - delta) * scale);
        }
        double* os = &out_sums[static_cast<std::size_t>((b * S + i) * H * hd + h * hd)];
        double* dq = &grad_sums[static_cast<std::size_t>((b * S + i) * W + h * hd)];
        for (std::int64_t j = 0; j <= i; ++j) {
          const double pj = p[static_cast<std::size_t>(j)], dsj = ds[static_cast<std::size_t>(j)];
          const std::size_t row = static_cast<std::size_t>((b * S + j) * W);
          const float* k = &qkv[row + static_cast<std::size_t>((H + g) * hd)];
          const float* v = &qkv[row + static_cast<std::size_t>((H + KV + g) * hd)];
          double* dk = &grad_sums[row + static_cast<std::size_t>((H + g) * hd)];
          double* dv = &grad_sums[row + static_cast<std::size_t>((H + KV + g) * hd)];
          for (std::int64_t d = 0; d < hd; ++d) {
            os[d] += pj * std::fabs(v[d]);
            dq[d] += dsj * std::fabs(k[d]);
            dk[d] += dsj * std::fabs(q[d]);
            dv[d] += pj * std::fabs(d_o[d]);
          }
        }
      }
    }
}

// Few shapes: each builds two graphs, and cuDNN may compile its engines at run time.
const Case kCases[] = {{1, 512, 4, 4, 64}, {1, 200, 6, 2, 64}, {2, 256, 8, 2, 128}, {1, 77, 4, 1, 128}};

TEST(CudnnAttention, ForwardAndBackwardMatchTheFlashKernelWithinBf16Rounding) {
  NDMESH_GPU_OR_SKIP();
  const std::string why = cuda::attention_cudnn_unavailable_reason();
  ASSERT_TRUE(why.empty()) << "cuDNN attention cannot run here: " << why;
  std::uint64_t seed = 11;
  for (const Case& c : kCases) {
    const std::int64_t W = (c.heads + 2 * c.kv_heads) * c.head_dim;
    const auto qkv_n = static_cast<std::size_t>(c.batch * c.seq * W);
    const auto out_n = static_cast<std::size_t>(c.batch * c.seq * c.heads * c.head_dim);
    const auto lse_n = static_cast<std::size_t>(c.batch * c.heads * c.seq);
    const auto qkv = rounded(normal(qkv_n, seed++)), dout = rounded(normal(out_n, seed++));
    const std::vector<float> zeros(qkv_n, 0.0f);
    DeviceBuffer dq = to_device(qkv), ddout = to_device(dout);

    // Reference: the fp32 flash kernel.
    DeviceBuffer ref_out = to_device(nans(out_n)), ref_lse = to_device(nans(lse_n));
    cuda::attention_forward(ptr<float>(ref_out), ptr<float>(ref_lse), ptr<float>(dq), c.batch, c.seq, c.heads,
                            c.kv_heads, c.head_dim, nullptr);
    const auto out = to_host<float>(ref_out, out_n), lse = to_host<float>(ref_lse, lse_n);

    DeviceBuffer got_out = to_device(nans(out_n)), got_lse = to_device(nans(lse_n));
    ASSERT_TRUE(cuda::attention_forward_cudnn(ptr<float>(got_out), ptr<float>(got_lse), ptr<float>(dq),
                                              c.batch, c.seq, c.heads, c.kv_heads, c.head_dim, true))
        << describe(c);
    const auto cout = to_host<float>(got_out, out_n), clse = to_host<float>(got_lse, lse_n);

    std::vector<double> out_sums, grad_sums;
    magnitudes(c, qkv, dout, out, lse, out_sums, grad_sums);
    EXPECT_TRUE(within(cout, out, bound(out_sums, 1, out, nullptr))) << "out, " << describe(c);
    EXPECT_TRUE(all_close(clse, lse, 5e-5, 0)) << "lse, " << describe(c);

    // The backward alone: both from cuDNN's out (bf16 values, which cuDNN reads exactly) and
    // the flash kernel's lse.
    DeviceBuffer same_out = to_device(cout);
    // The flash kernel adds into zeros; cuDNN writes over NaN (every element, or the NaN left
    // shows).
    DeviceBuffer ref_dqkv = to_device(zeros);
    cuda::attention_backward(ptr<float>(ref_dqkv), ptr<float>(ddout), ptr<float>(dq), ptr<float>(same_out),
                             ptr<float>(ref_lse), c.batch, c.seq, c.heads, c.kv_heads, c.head_dim, nullptr);
    const auto dqkv = to_host<float>(ref_dqkv, qkv_n);
    magnitudes(c, qkv, dout, cout, lse, out_sums, grad_sums);
    const auto b = bound(grad_sums, 2, dqkv, nullptr);
    std::vector<float> first;
    for (int run = 0; run < 2; ++run) {
      DeviceBuffer got_dqkv = to_device(nans(qkv_n));
      ASSERT_TRUE(cuda::attention_backward_cudnn(ptr<float>(got_dqkv), ptr<float>(ddout), ptr<float>(dq),
                                                 ptr<float>(same_out), ptr<float>(ref_lse), c.batch, c.seq,
                                                 c.heads, c.kv_heads, c.head_dim, true))
          << describe(c);
      const auto got = to_host<float>(got_dqkv, qkv_n);
      if (run == 0) {
        EXPECT_TRUE(within(got, dqkv, b)) << "dqkv, " << describe(c);
        first = got;
      } else {
        EXPECT_TRUE(same_bits(got, first))
            << "dqkv differs between two runs (deterministic algorithm), " << describe(c);
      }
    }
  }
}

// bf16 mixed precision keeps the attention's input, output and gradients in bf16 as cuDNN
// reads and writes them: the bf16 overloads give exactly the float overloads' values (those
// round qkv and d out, and widen the output and d qkv), bit for bit.
TEST(CudnnAttention, TheBf16OverloadsAreTheFloatOnesOnRoundedInputs) {
  NDMESH_GPU_OR_SKIP();
  ASSERT_TRUE(cuda::attention_cudnn_unavailable_reason().empty()) << cuda::attention_cudnn_unavailable_reason();
  const Case c{2, 200, 6, 2, 64};
  const std::int64_t W = (c.heads + 2 * c.kv_heads) * c.head_dim;
  const auto qkv_n = static_cast<std::size_t>(c.batch * c.seq * W);
  const auto out_n = static_cast<std::size_t>(c.batch * c.seq * c.heads * c.head_dim);
  const auto lse_n = static_cast<std::size_t>(c.batch * c.heads * c.seq);
  DeviceBuffer qkv = to_device(normal(qkv_n, 21)), dout = to_device(normal(out_n, 22));
  DeviceBuffer qkv16(qkv_n * sizeof(BFloat16)), dout16(out_n * sizeof(BFloat16));
  cuda::cast(ptr<BFloat16>(qkv16), ptr<float>(qkv), static_cast<std::int64_t>(qkv_n));
  cuda::cast(ptr<BFloat16>(dout16), ptr<float>(dout), static_cast<std::int64_t>(out_n));
  DeviceBuffer out = to_device(nans(out_n)), lse = to_device(nans(lse_n));
  DeviceBuffer out16(out_n * sizeof(BFloat16)), lse16 = to_device(nans(lse_n));
  ASSERT_TRUE(cuda::attention_forward_cudnn(ptr<float>(out), ptr<float>(lse), ptr<float>(qkv), c.batch, c.seq,
                                            c.heads, c.kv_heads, c.head_dim, true));
  ASSERT_TRUE(cuda::attention_forward_cudnn(ptr<BFloat16>(out16), ptr<float>(lse16), ptr<BFloat16>(qkv16), c.batch,
                                            c.seq, c.heads, c.kv_heads, c.head_dim, true));
  const auto narrow_bits = [](const DeviceBuffer& b, std::size_t n) {
    std::vector<BFloat16> h(n);
    cuda::copy_to_host(h.data(), b.data(), n * sizeof(BFloat16));
    return h;
  };
  const auto wide = to_host<float>(out, out_n);
  const auto narrow = narrow_bits(out16, out_n);
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < out_n; ++i) wrong += narrow[i].bits != BFloat16(wide[i]).bits;
  EXPECT_EQ(wrong, 0u) << "elements of the bf16 output that are not the float output's";
  EXPECT_TRUE(same_bits(to_host<float>(lse16, lse_n), to_host<float>(lse, lse_n))) << "lse";
  DeviceBuffer dqkv = to_device(nans(qkv_n)), dqkv16(qkv_n * sizeof(BFloat16));
  cuda::cast(ptr<BFloat16>(dqkv16), ptr<float>(dqkv), static_cast<std::int64_t>(qkv_n));  // NaN: written over
  ASSERT_TRUE(cuda::attention_backward_cudnn(ptr<float>(dqkv), ptr<float>(dout), ptr<float>(qkv), ptr<float>(out),
                                             ptr<float>(lse), c.batch, c.seq, c.heads, c.kv_heads, c.head_dim,
                                             true));
  ASSERT_TRUE(cuda::attention_backward_cudnn(ptr<BFloat16>(dqkv16), ptr<BFloat16>(dout16), ptr<BFloat16>(qkv16),
                                             ptr<BFloat16>(out16), ptr<float>(lse), c.batch, c.seq, c.heads,
                                             c.kv_heads, c.head_dim, true));
  const auto grad = to_host<float>(dqkv, qkv_n);
  const auto grad16 = narrow_bits(dqkv16, qkv_n);
  wrong = 0;
  for (std::size_t i = 0; i < qkv_n; ++i)
    wrong += std::isnan(grad[i]) || BFloat16(grad[i]).bits != grad16[i].bits || static_cast<float>(grad16[i]) != grad[i];
  EXPECT_EQ(wrong, 0u) << "elements of the bf16 d qkv that are not the float d qkv's (or not written)";
}

// An empty batch does nothing and says it ran; a head_dim cuDNN has no engine for is not an
// Error unless required: false (the caller's flash kernel), or an Error naming the shape.
TEST(CudnnAttention, AShapeWithoutAnEngineFallsBackOrIsAnErrorNamingIt) {
  NDMESH_GPU_OR_SKIP();
  ASSERT_TRUE(cuda::attention_cudnn_unavailable_reason().empty())
      << cuda::attention_cudnn_unavailable_reason();
  EXPECT_TRUE(cuda::attention_forward_cudnn(static_cast<float*>(nullptr), nullptr, nullptr, 0, 16, 4, 4, 64, true));
  // head_dim 12: not a multiple of 8, which every cuDNN SDPA engine requires.
  const std::int64_t seq = 16, heads = 2, hd = 12, W = 3 * heads * hd;
  DeviceBuffer qkv = to_device(rounded(normal(static_cast<std::size_t>(seq * W), 5)));
  DeviceBuffer out = to_device(nans(static_cast<std::size_t>(seq * heads * hd)));
  DeviceBuffer lse = to_device(nans(static_cast<std::size_t>(heads * seq)));
  EXPECT_FALSE(cuda::attention_forward_cudnn(ptr<float>(out), ptr<float>(lse), ptr<float>(qkv), 1, seq, heads,
                                             heads, hd, false));
  try {
    cuda::attention_forward_cudnn(ptr<float>(out), ptr<float>(lse), ptr<float>(qkv), 1, seq, heads, heads, hd,
                                  true);
    ADD_FAILURE() << "no Error under required";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("head_dim=12"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("attention_forward_cudnn"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ndmesh
