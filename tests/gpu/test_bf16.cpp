// The bf16 mixed-precision kernels (cuda_ops.hpp, last section) against their fp32 twins,
// and the fused fp32 kernels against the unfused pairs they replace.
//
// Every bf16 kernel reads bfloat16 as float, computes what its fp32 overload computes and
// rounds each bf16 output once. The reference is therefore the fp32 twin run on the same
// inputs widened to float (exact), and the only difference is that one rounding:
//   bf16 has 8 significant bits, so rounding to nearest is off by at most 2^-8 |y|; where
//   the two float results differ by a few float ulps (the GPU may contract differently in
//   the two instantiations), the rounding can go to the other neighbour: one bf16 ulp,
//   at most 2^-7 |y|. Hence rtol = 2^-7 (+ 1e-6 for the float difference itself) and an
//   atol of 1e-6 times the output's scale for results near 0, where the float difference
//   is not relative to the result. A wrong formula, a wrong index or a missing rounding
//   step is off by far more (a dropped bias, a wrong row: O(1); double rounding in the
//   residual: caught by the bit-exact residual check).
// Outputs that stay fp32 (statistics, parameter gradients, losses, moments) come from the
// same float arithmetic on the same inputs: compared at 1e-6 (GPU contraction only); the
// emulator reproduces them bit for bit.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "gpu_test.hpp"
#include "ndmesh/core/dtype.hpp"
#include "ndmesh/nn/cuda_ops.hpp"
#include "ndmesh/tensor/ops.hpp"
#include "ndmesh/tensor/tensor.hpp"

namespace ndmesh {
namespace {

using namespace testing;  // gpu_test.hpp

constexpr double kBf16Rtol = 1.0 / 128 + 1e-6;  // one bf16 ulp (2^-7 relative), see above

std::vector<BFloat16> to_bf16(const std::vector<float>& x) {
  std::vector<BFloat16> out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) out[i] = BFloat16(x[i]);
  return out;
}
std::vector<float> widen(const std::vector<BFloat16>& x) {
  std::vector<float> out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) out[i] = static_cast<float>(x[i]);
  return out;
}
// n bf16 values drawn as normal(seed) * scale (+ shift), and the same values as float.
struct Bf16Input {
  std::vector<BFloat16> bf16;
  std::vector<float> f32;
};
Bf16Input draw(std::size_t n, std::uint64_t seed, float scale = 1.0f, float shift = 0.0f) {
  auto x = normal(n, seed, scale);
  for (float& v : x) v += shift;
  Bf16Input in{to_bf16(x), {}};
  in.f32 = widen(in.bf16);
  return in;
}
std::vector<float> bf16_on_host(const DeviceBuffer& b, std::size_t n) {
  return widen(to_host<BFloat16>(b, n));
}
std::vector<BFloat16> bf16_nans(std::size_t n) { return to_bf16(nans(n)); }

TEST(CudaBf16, Bf16TensorsLiveOnTheDevice) {
  NDMESH_GPU_OR_SKIP();
  Tensor<BFloat16> a({3, 5}, Device::kCuda), b({3, 5}, Device::kCuda);
  EXPECT_EQ(a.dtype(), DType::kBFloat16);
  const Bf16Input x = draw(15, 51);
  cuda::copy_to_device(a.data(), x.bf16.data(), 15 * sizeof(BFloat16));
  ops::copy(b.data(), a.data(), 15, Device::kCuda);
  EXPECT_TRUE(same_bits(b.to_host(), x.bf16));
  ops::zero(b.data(), 15, Device::kCuda);
  EXPECT_TRUE(same_bits(b.to_host(), std::vector<BFloat16>(15, BFloat16(0.0f))));
}

TEST(CudaBf16, ResidualLayerNorm) {
  NDMESH_GPU_OR_SKIP();
  for (std::int64_t rows : {7, 33})
    for (std::int64_t c : {5, 96, 771}) {
      const auto sz = static_cast<std::size_t>(rows * c), cs = static_cast<std::size_t>(c),
                 rs = static_cast<std::size_t>(rows);
      const std::string where = "rows=" + std::to_string(rows) + " C=" + std::to_string(c);
      const Bf16Input x = draw(sz, 1, 2.0f, 3.0f), r = draw(sz, 2), dout = draw(sz, 3), dinp0 = draw(sz, 4);
      const auto w = normal(cs, 5, 0.5f), b = normal(cs, 6, 0.5f), dw0 = normal(cs, 7), db0 = normal(cs, 8);
      DeviceBuffer dw = to_device(w), dbias = to_device(b);

      // fp32: the fused kernel against x + r then layernorm_forward, bit for bit.
      DeviceBuffer fx = to_device(x.f32), fr = to_device(r.f32), fres = to_device(nans(sz)),
                   fout = to_device(nans(sz)), fmean = to_device(nans(rs)), frstd = to_device(nans(rs));
      cuda::residual_layernorm_forward(ptr<float>(fres), ptr<float>(fout), ptr<float>(fmean),
                                       ptr<float>(frstd), ptr<float>(fx), ptr<float>(fr), ptr<float>(dw),
                                       ptr<float>(dbias), rows, c, 1e-5f);
      std::vector<float> sum(sz);
      for (std::size_t i = 0; i < sz; ++i) sum[i] = x.f32[i] + r.f32[i];
      DeviceBuffer fsum = to_device(sum), fout2 = to_device(nans(sz)), fmean2 = to_device(nans(rs)),
                   frstd2 = to_device(nans(rs));
      cuda::layernorm_forward(ptr<float>(fout2), ptr<float>(fmean2), ptr<float>(frstd2), ptr<float>(fsum),
                              ptr<float>(dw), ptr<float>(dbias), rows, c, 1e-5f);
      EXPECT_TRUE(same_bits(to_host<float>(fres, sz), sum)) << "fp32 residual " << where;
      EXPECT_TRUE(same_bits(to_host<float>(fout, sz), to_host<float>(fout2, sz))) << "fp32 out " << where;
      EXPECT_TRUE(same_bits(to_host<float>(frstd, rs), to_host<float>(frstd2, rs))) << "fp32 rstd " << where;

      // bf16: the residual is x + r rounded once (bit for bit as BFloat16 rounds the float
      // sum); the norm is that of the stored residual, so its fp32 twin reads the residual
      // as stored.
      DeviceBuffer bx = to_device(x.bf16), br = to_device(r.bf16), bres = to_device(bf16_nans(sz)),
                   bout = to_device(bf16_nans(sz)), bmean = to_device(nans(rs)), brstd = to_device(nans(rs));
      cuda::residual_layernorm_forward(ptr<BFloat16>(bres), ptr<BFloat16>(bout), ptr<float>(bmean),
                                       ptr<float>(brstd), ptr<BFloat16>(bx), ptr<BFloat16>(br),
                                       ptr<float>(dw), ptr<float>(dbias), rows, c, 1e-5f);
      const auto res_bf16 = to_host<BFloat16>(bres, sz);
      EXPECT_TRUE(same_bits(res_bf16, to_bf16(sum))) << "bf16 residual " << where;
      DeviceBuffer tres = to_device(widen(res_bf16)), tout = to_device(nans(sz)), tmean = to_device(nans(rs)),
                   trstd = to_device(nans(rs));
      cuda::layernorm_forward(ptr<float>(tout), ptr<float>(tmean), ptr<float>(trstd), ptr<float>(tres),
                              ptr<float>(dw), ptr<float>(dbias), rows, c, 1e-5f);
      // out = xhat w + b with |xhat| < 5, |w|, |b| < 2: scale ~10.
      EXPECT_TRUE(all_close(bf16_on_host(bout, sz), to_host<float>(tout, sz), 1e-5, kBf16Rtol))
          << "bf16 out " << where;
      EXPECT_TRUE(all_close(to_host<float>(bmean, rs), to_host<float>(tmean, rs), 1e-6, 1e-6))
          << "mean " << where;
      EXPECT_TRUE(all_close(to_host<float>(brstd, rs), to_host<float>(trstd, rs), 0, 1e-6))
          << "rstd " << where;

      // Backward: bf16 dout, inp and dinp (accumulated, rounded once); fp32 dweight, dbias.
      const auto mean = to_host<float>(tmean, rs), rstd = to_host<float>(trstd, rs);
      DeviceBuffer dm = to_device(mean), dr = to_device(rstd);
      DeviceBuffer tdinp = to_device(dinp0.f32), tdout = to_device(dout.f32), tdw = to_device(dw0),
                   tdb = to_device(db0);
      cuda::layernorm_backward(ptr<float>(tdinp), ptr<float>(tdw), ptr<float>(tdb), ptr<float>(tdout),
                               ptr<float>(tres), ptr<float>(dw), ptr<float>(dm), ptr<float>(dr), rows, c);
      DeviceBuffer bdinp = to_device(dinp0.bf16), bdout = to_device(dout.bf16), bdw = to_device(dw0),
                   bdb = to_device(db0);
      cuda::layernorm_backward(ptr<BFloat16>(bdinp), ptr<float>(bdw), ptr<float>(bdb), ptr<BFloat16>(bdout),
                               ptr<BFloat16>(bres), ptr<float>(dw), ptr<float>(dm), ptr<float>(dr), rows, c);
      EXPECT_TRUE(all_close(bf16_on_host(bdinp, sz), to_host<float>(tdinp, sz), 1e-5, kBf16Rtol))
          << "bf16 dinp " << where;
      EXPECT_TRUE(
          all_close(to_host<float>(bdw, cs), to_host<float>(tdw, cs), 1e-6 * static_cast<double>(rows), 1e-6))
          << "dweight " << where;
      EXPECT_TRUE(
          all_close(to_host<float>(bdb, cs), to_host<float>(tdb, cs), 1e-6 * static_cast<double>(rows), 1e-6))
          << "dbias " << where;
    }
}

TEST(CudaBf16, GeluAndBias) {
  NDMESH_GPU_OR_SKIP();
  for (std::int64_t rows : {1, 7, 33})
    for (std::int64_t cols : {5, 771}) {
      const auto sz = static_cast<std::size_t>(rows * cols), cs = static_cast<std::size_t>(cols);
      const std::string where = "rows=" + std::to_string(rows) + " cols=" + std::to_string(cols);
      const Bf16Input x = draw(sz, 11, 2.5f), dout = draw(sz, 12), dinp0 = draw(sz, 13);
      DeviceBuffer tx = to_device(x.f32), tout = to_device(nans(sz)), tdout = to_device(dout.f32),
                   tdinp = to_device(dinp0.f32);
      DeviceBuffer bx = to_device(x.bf16), bout = to_device(bf16_nans(sz)), bdout = to_device(dout.bf16),
                   bdinp = to_device(dinp0.bf16);
      const std::int64_t n = rows * cols;
      cuda::gelu_forward(ptr<float>(tout), ptr<float>(tx), n);
      cuda::gelu_backward(ptr<float>(tdinp), ptr<float>(tdout), ptr<float>(tx), n);
      cuda::gelu_forward(ptr<BFloat16>(bout), ptr<BFloat16>(bx), n);
      cuda::gelu_backward(ptr<BFloat16>(bdinp), ptr<BFloat16>(bdout), ptr<BFloat16>(bx), n);
      // gelu(x) ~ x for |x| < 10: scale 10.
      EXPECT_TRUE(all_close(bf16_on_host(bout, sz), to_host<float>(tout, sz), 1e-5, kBf16Rtol))
          << "gelu " << where;
      EXPECT_TRUE(all_close(bf16_on_host(bdinp, sz), to_host<float>(tdinp, sz), 1e-5, kBf16Rtol))
          << "gelu backward " << where;

      // Bias: bf16 rows += fp32 bias (one rounding); dbias fp32 column sums of bf16 rows.
      const auto bias = normal(cs, 14), db0 = normal(cs, 15);
      DeviceBuffer dbias = to_device(bias), tdb = to_device(db0), bdb = to_device(db0);
      cuda::bias_forward(ptr<float>(tx), ptr<float>(dbias), rows, cols);
      cuda::bias_forward(ptr<BFloat16>(bx), ptr<float>(dbias), rows, cols);
      EXPECT_TRUE(all_close(bf16_on_host(bx, sz), to_host<float>(tx, sz), 1e-5, kBf16Rtol))
          << "bias " << where;
      cuda::bias_backward(ptr<float>(tdb), ptr<float>(tdout), rows, cols);
      cuda::bias_backward(ptr<float>(bdb), ptr<BFloat16>(bdout), rows, cols);
      EXPECT_TRUE(
          all_close(to_host<float>(bdb, cs), to_host<float>(tdb, cs), 1e-6 * static_cast<double>(rows), 1e-6))
          << "bias backward " << where;
    }
}

TEST(CudaBf16, Embedding) {
  NDMESH_GPU_OR_SKIP();
  const std::int64_t vocab = 97, seq = 13, max_seq = 17;
  for (std::int64_t batch : {1, 3})
    for (std::int64_t c : {5, 96}) {
      const std::int64_t rows = batch * seq;
      const auto sz = static_cast<std::size_t>(rows * c);
      const std::string where = "batch=" + std::to_string(batch) + " C=" + std::to_string(c);
      const auto wte = normal(static_cast<std::size_t>(vocab * c), 21),
                 wpe = normal(static_cast<std::size_t>(max_seq * c), 22);
      std::vector<std::int32_t> tokens(static_cast<std::size_t>(rows));
      for (std::size_t i = 0; i < tokens.size(); ++i)
        tokens[i] = static_cast<std::int32_t>((i * 37 + 5) % 11);  // repeats
      std::vector<std::int64_t> positions(static_cast<std::size_t>(seq));
      for (std::size_t i = 0; i < positions.size(); ++i)
        positions[i] = static_cast<std::int64_t>((i * 5) % max_seq);
      DeviceBuffer dwte = to_device(wte), dwpe = to_device(wpe), dtok = to_device(tokens),
                   dpos = to_device(positions);
      // fp32 fused against tokens then positions, bit for bit.
      DeviceBuffer fused = to_device(nans(sz)), pair = to_device(nans(sz));
      cuda::embedding_forward(ptr<float>(fused), ptr<std::int32_t>(dtok), ptr<float>(dwte), ptr<float>(dwpe),
                              ptr<std::int64_t>(dpos), rows, seq, c);
      cuda::embedding_tokens_forward(ptr<float>(pair), ptr<std::int32_t>(dtok), ptr<float>(dwte), rows, c, 0,
                                     vocab);
      cuda::embedding_positions_forward(ptr<float>(pair), ptr<float>(dwpe), ptr<std::int64_t>(dpos), 0, rows,
                                        seq, c);
      const auto ref = to_host<float>(pair, sz);
      EXPECT_TRUE(same_bits(to_host<float>(fused, sz), ref)) << "fp32 fused forward " << where;
      DeviceBuffer bout = to_device(bf16_nans(sz));
      cuda::embedding_forward(ptr<BFloat16>(bout), ptr<std::int32_t>(dtok), ptr<float>(dwte),
                              ptr<float>(dwpe), ptr<std::int64_t>(dpos), rows, seq, c);
      EXPECT_TRUE(same_bits(to_host<BFloat16>(bout, sz), to_bf16(ref))) << "bf16 forward " << where;

      // Backward from a bf16 d output: the fp32 kernel on the widened values, bit for bit
      // (the same sums in the same order).
      const Bf16Input dout = draw(sz, 23);
      const auto g_te = normal(wte.size(), 24), g_pe = normal(wpe.size(), 25);
      DeviceBuffer t_te = to_device(g_te), t_pe = to_device(g_pe), b_te = to_device(g_te),
                   b_pe = to_device(g_pe), tdout = to_device(dout.f32), bdout = to_device(dout.bf16);
      cuda::embedding_backward(ptr<float>(t_te), ptr<float>(t_pe), ptr<float>(tdout), tokens.data(),
                               positions.data(), rows, seq, c, 0, vocab);
      cuda::embedding_backward(ptr<float>(b_te), ptr<float>(b_pe), ptr<BFloat16>(bdout), tokens.data(),
                               positions.data(), rows, seq, c);
      EXPECT_TRUE(all_close(to_host<float>(b_te, wte.size()), to_host<float>(t_te, wte.size()), 1e-6, 1e-6))
          << "dwte " << where;
      EXPECT_TRUE(all_close(to_host<float>(b_pe, wpe.size()), to_host<float>(t_pe, wpe.size()), 1e-6, 1e-6))
          << "dwpe " << where;
    }
}

TEST(CudaBf16, ClassifierInPlace) {
  NDMESH_GPU_OR_SKIP();
  // Rows padded to a multiple of 128 (16-byte accesses), and not padded (width = the valid
  // columns: 5 and 1031 columns, the scalar path; 1040, 16-byte accesses over every column).
  for (std::int64_t rows : {1, 7})
    for (std::int64_t vocab : {5, 1031, 1040})
     for (const bool pad : {true, false}) {
      const std::int64_t padded = pad ? (vocab + 127) / 128 * 128 : vocab;
      const auto rs = static_cast<std::size_t>(rows), sz = static_cast<std::size_t>(rows * padded),
                 dense = static_cast<std::size_t>(rows * vocab);
      const std::string where =
          "rows=" + std::to_string(rows) + " vocab=" + std::to_string(vocab) + " width=" + std::to_string(padded);
      const float scale = 1.0f / static_cast<float>(rows * 3);
      std::vector<std::int32_t> targets(rs);
      for (std::size_t r = 0; r < rs; ++r)
        targets[r] = static_cast<std::int32_t>((r * 131 + 3) % static_cast<std::size_t>(vocab));
      const Bf16Input z = draw(dense, 31, 3.0f);
      // Padded layouts: the padding holds NaN (never read; written as 0).
      std::vector<float> zf(sz, std::nanf("")), zeros_dense(dense, 0.0f);
      std::vector<BFloat16> zb(sz, BFloat16(std::nanf("")));
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t i = 0; i < vocab; ++i) {
          zf[static_cast<std::size_t>(r * padded + i)] = z.f32[static_cast<std::size_t>(r * vocab + i)];
          zb[static_cast<std::size_t>(r * padded + i)] = z.bf16[static_cast<std::size_t>(r * vocab + i)];
        }
      DeviceBuffer dtargets = to_device(targets);
      // The unfused pair on the dense logits: probs, losses, then dlogits into zeros.
      DeviceBuffer probs = to_device(z.f32), plosses = to_device(nans(rs)), dlogits = to_device(zeros_dense);
      cuda::cross_entropy_forward(ptr<float>(probs), ptr<float>(plosses), ptr<float>(probs),
                                  ptr<std::int32_t>(dtargets), rows, vocab);
      cuda::cross_entropy_backward(ptr<float>(dlogits), ptr<float>(probs), ptr<std::int32_t>(dtargets), rows,
                                   vocab, scale);
      const auto dref = to_host<float>(dlogits, dense), lref = to_host<float>(plosses, rs);
      std::vector<float> dref_padded(sz, 0.0f);
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t i = 0; i < vocab; ++i)
          dref_padded[static_cast<std::size_t>(r * padded + i)] =
              dref[static_cast<std::size_t>(r * vocab + i)];
      // fp32 fused: the pair's bits.
      DeviceBuffer fz = to_device(zf), flosses = to_device(nans(rs));
      cuda::classifier_forward_backward(ptr<float>(fz), ptr<float>(flosses), ptr<std::int32_t>(dtargets),
                                        rows, vocab, padded, scale);
      EXPECT_TRUE(same_bits(to_host<float>(fz, sz), dref_padded)) << "fp32 classifier dlogits " << where;
      EXPECT_TRUE(same_bits(to_host<float>(flosses, rs), lref)) << "fp32 classifier losses " << where;
      // bf16: the same float loss (the logits are the same values), the gradient rounded
      // once; |d| <= scale, so the atol is 1e-6 scale.
      DeviceBuffer bz = to_device(zb), blosses = to_device(nans(rs));
      cuda::classifier_forward_backward(ptr<BFloat16>(bz), ptr<float>(blosses), ptr<std::int32_t>(dtargets),
                                        rows, vocab, padded, scale);
      EXPECT_TRUE(all_close(bf16_on_host(bz, sz), dref_padded, 1e-6 * scale, kBf16Rtol))
          << "bf16 dlogits " << where;
      EXPECT_TRUE(all_close(to_host<float>(blosses, rs), lref, 1e-6, 1e-6)) << "bf16 losses " << where;
    }
}

TEST(CudaBf16, MultiTensorAdamWWritesTheBf16Copy) {
  NDMESH_GPU_OR_SKIP();
  // Segments of odd sizes (one over a chunk of 4096, one empty) and two decays, with a gap.
  // {param, grad, state, count, decay}: the moments packed (state offsets differ from the
  // parameters'), the gradients where the parameters are.
  const std::vector<cuda::AdamWSegment> segments = {
      {0, 0, 0, 5, 0.1}, {5, 5, 5, 4099, 0.0}, {4104, 4104, 4104, 0, 0.1}, {4110, 4110, 4104, 771, 0.1}};
  const std::size_t n = 4110 + 771;
  const auto w0 = normal(n, 41), g = normal(n, 42), m0 = normal(n, 43, 0.1f);
  auto v0 = normal(n, 44, 0.1f);
  for (float& x : v0) x = x * x;
  DeviceBuffer dg = to_device(g);
  DeviceBuffer rw = to_device(w0), rm = to_device(m0), rv = to_device(v0);
  DeviceBuffer mw = to_device(w0), mm = to_device(m0), mv = to_device(v0), mb = to_device(bf16_nans(n));
  for (int step = 1; step <= 2; ++step) {
    const double c1 = 1 - std::pow(0.9, step), c2 = 1 - std::pow(0.95, step);
    for (const auto& s : segments)
      cuda::adamw_update(ptr<float>(rw) + s.param, ptr<float>(dg) + s.grad, ptr<float>(rm) + s.state,
                         ptr<float>(rv) + s.state, s.count, 1e-3, 0.9, 0.95, 1e-8, s.decay, 0.5, c1, c2);
    cuda::adamw_update_multi(ptr<float>(mw), ptr<BFloat16>(mb), ptr<float>(dg), ptr<float>(mm),
                             ptr<float>(mv), segments.data(), static_cast<int>(segments.size()), 1e-3, 0.9,
                             0.95, 1e-8, 0.5, c1, c2);
  }
  // One launch computes each element as the per-tensor kernel does: the same bits, and the
  // gap (4104..4110) untouched.
  const auto w = to_host<float>(mw, n);
  EXPECT_TRUE(same_bits(w, to_host<float>(rw, n))) << "weights";
  EXPECT_TRUE(same_bits(to_host<float>(mm, n), to_host<float>(rm, n))) << "first moments";
  EXPECT_TRUE(same_bits(to_host<float>(mv, n), to_host<float>(rv, n))) << "second moments";
  for (std::size_t i = 4104; i < 4110; ++i) EXPECT_EQ(w[i], w0[i]) << "gap element " << i;
  // The bf16 copy: the new weights rounded (the gap was never written: still NaN).
  auto copy = to_host<BFloat16>(mb, n);
  auto expect = to_bf16(w);
  for (std::size_t i = 4104; i < 4110; ++i) copy[i] = expect[i];
  EXPECT_TRUE(same_bits(copy, expect)) << "bf16 copy of the weights";
}

}  // namespace
}  // namespace ndmesh
