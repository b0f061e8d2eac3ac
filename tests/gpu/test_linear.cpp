// The Linear layer's bias on the device against nn::Linear<float>: bias_forward
// (add_bias) and bias_backward (backward_bias, accumulating into a filled gradient). The
// layer's products are cuda::gemm, tested with the whole forward in test_blas; its bf16
// logits (the classifier's: an output in bfloat16 with padded rows, and the backward from it)
// are tested here against the CPU's bf16 layer, and so are its products with the bias, GELU
// and the bias gradient fused (cuBLASLt epilogues).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "gpu_test.hpp"
#include "ndmesh/core/dtype.hpp"
#include "ndmesh/nn/cuda_ops.hpp"
#include "ndmesh/nn/gelu.hpp"
#include "ndmesh/nn/linear.hpp"

namespace ndmesh {
namespace {

using namespace testing;  // gpu_test.hpp

// x rounded to bfloat16, element by element.
std::vector<BFloat16> bf16_of(const std::vector<float>& x) {
  std::vector<BFloat16> r(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) r[i] = BFloat16(x[i]);
  return r;
}

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
    // With the residual connection in the same pass: (out + b) + residual, two adds in that
    // order on both sides (the same bits; a residual added first, or not at all, is not).
    const auto residual = normal(out0.size(), 3);
    ref = out0;
    layer.linear.add_bias(ref.data(), s.rows, residual.data());
    std::vector<float> apart = out0;
    for (std::size_t i = 0; i < apart.size(); ++i)
      apart[i] = (apart[i] + layer.bias()[i % s.out]) + residual[i];
    EXPECT_TRUE(same_bits(ref, apart)) << "the CPU's bias and residual, rows=" << s.rows;
    DeviceBuffer out2 = to_device(out0), dres = to_device(residual);
    cuda::bias_forward(ptr<float>(out2), ptr<float>(bias), s.rows, s.out, ptr<float>(dres));
    EXPECT_TRUE(same_bits(to_host<float>(out2, out0.size()), ref))
        << "+residual rows=" << s.rows << " cols=" << s.out;
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

// A Linear under bf16 products in `store`, its parameters the same random values in every store.
nn::Linear<float> bf16_layer(ParamStore<float>& store, const Shape& s, bool bias) {
  store.set_matmul_precision(MatmulPrecision::kBf16);
  nn::Linear<float> l(store, {.in = s.in, .out = s.out, .bias = bias});
  store.allocate();
  const auto p = normal(static_cast<std::size_t>(store.size()), 7, 0.2f);
  store.params_from_host(p.data());
  return l;
}

// Runs body(shape, decline, where) for the bf16 tests' three shapes, each with cuBLASLt's
// epilogues and with them declined (decline: NDMESH_EPILOGUES=off, the path taken where
// cuBLASLt has no algorithm); `where` names the case for failure messages.
void for_each_epilogue_case(const std::function<void(const Shape&, bool, const std::string&)>& body) {
  for (const bool decline : {false, true})
    for (const Shape& s : {Shape{7, 16, 24}, Shape{33, 96, 80}, Shape{65, 64, 13}}) {
      if (decline) setenv("NDMESH_EPILOGUES", "off", 1);
      body(s, decline,
           "rows=" + std::to_string(s.rows) + " in=" + std::to_string(s.in) +
               " out=" + std::to_string(s.out) + (decline ? " (NDMESH_EPILOGUES=off)" : ""));
      unsetenv("NDMESH_EPILOGUES");
    }
}

// The LM head under bf16 on CUDA (nn::LmHead's fused path): the logits written in bfloat16
// into rows padded to 128 (the padding never written), and the backward's two products read
// the logits' gradient as stored in those rows (the padding never read: it holds NaN here),
// against the CPU's bf16 layer on the same values. Both multiply the same bf16 operands in
// fp32 (exact products) and differ only in summation order: within 1e-5 relative and 1e-4
// absolute for these sizes, and the logits then rounded once (one bf16 step, 2^-7, apart at
// most). A wrong row stride misplaces whole rows (off by O(1)) or reads the NaN.
TEST(CudaLinear, Bf16LogitsInPaddedRowsAndTheirBackward) {
  NDMESH_GPU_OR_SKIP();
  for (const Shape& s : {Shape{7, 16, 14}, Shape{33, 96, 77}, Shape{65, 64, 130}}) {
    const std::int64_t ld = (s.out + 127) / 128 * 128;
    const std::string where = "rows=" + std::to_string(s.rows) + " in=" + std::to_string(s.in) +
                              " vocab=" + std::to_string(s.out) + " padded=" + std::to_string(ld);
    ParamStore<float> cpu_store, gpu_store;
    const nn::Linear<float> cpu = bf16_layer(cpu_store, s, false), gpu = bf16_layer(gpu_store, s, false);
    gpu_store.to(Device::kCuda);
    const auto inp = normal(static_cast<std::size_t>(s.rows * s.in), 3);
    DeviceBuffer din = to_device(inp);

    std::vector<float> ref(static_cast<std::size_t>(s.rows * s.out));
    cpu.forward(inp.data(), ref.data(), s.rows);
    std::vector<BFloat16> poison(static_cast<std::size_t>(s.rows * ld), BFloat16(std::nanf("")));
    DeviceBuffer dlogits = to_device(poison);
    gpu.forward(ptr<float>(din), ptr<BFloat16>(dlogits), ld, s.rows);
    const auto got16 = to_host<BFloat16>(dlogits, poison.size());
    std::vector<float> got, pad;
    for (std::int64_t r = 0; r < s.rows; ++r)
      for (std::int64_t j = 0; j < ld; ++j)
        (j < s.out ? got : pad).push_back(static_cast<float>(got16[static_cast<std::size_t>(r * ld + j)]));
    EXPECT_TRUE(all_close(got, ref, 1e-4, 1.0 / 128)) << "logits, " << where;
    EXPECT_TRUE(std::all_of(pad.begin(), pad.end(), [](float x) { return std::isnan(x); }))
        << "the padding was written, " << where;

    // The backward from bf16 values in the padded rows, NaN in the padding.
    const auto d = normal(static_cast<std::size_t>(s.rows * s.out), 4);
    std::vector<float> dwide(d.size());
    std::vector<BFloat16> d16 = poison;
    for (std::int64_t r = 0; r < s.rows; ++r)
      for (std::int64_t j = 0; j < s.out; ++j) {
        const BFloat16 v(d[static_cast<std::size_t>(r * s.out + j)]);
        d16[static_cast<std::size_t>(r * ld + j)] = v;
        dwide[static_cast<std::size_t>(r * s.out + j)] = static_cast<float>(v);
      }
    std::vector<float> dinp_ref(inp.size());
    cpu.backward(dwide.data(), inp.data(), dinp_ref.data(), s.rows, nn::GradInto::kSet);
    DeviceBuffer dd = to_device(d16), ddinp = to_device(nans(inp.size()));
    gpu.backward(ptr<BFloat16>(dd), ld, ptr<float>(din), ptr<float>(ddinp), s.rows, nn::GradInto::kSet);
    EXPECT_TRUE(all_close(to_host<float>(ddinp, inp.size()), dinp_ref, 1e-4, 1e-5)) << "d input, " << where;
    const float* gw = cpu_store.grad(cpu.weight_id());
    const std::vector<float> dw_ref(gw, gw + s.in * s.out);
    std::vector<float> dw(dw_ref.size());
    cuda::copy_to_host(dw.data(), gpu_store.grad(gpu.weight_id()), dw.size() * sizeof(float));
    EXPECT_TRUE(all_close(dw, dw_ref, 1e-4, 1e-5)) << "d weight, " << where;
  }
}

// A layer whose store keeps a bfloat16 copy of the parameters (bf16 training on a GPU) reads
// its weight from it in every product: the same bf16 operand the layer otherwise rounds from
// the fp32 weight for each product, so the same bits in the forward, the input gradient and
// the weight and bias gradients. Once the parameters are written (here: new values from the
// host, as a checkpoint load writes them) the copy is stale and the layer rounds the fp32
// weight again: a layer that read the stale copy would compute with the old weights.
TEST(CudaLinear, Bf16WeightsFromTheStoresCopyAreTheRoundedWeights) {
  NDMESH_GPU_OR_SKIP();
  const Shape s{33, 96, 80};
  ParamStore<float> plain_store, copy_store;
  const nn::Linear<float> plain = bf16_layer(plain_store, s, true), copied = bf16_layer(copy_store, s, true);
  plain_store.to(Device::kCuda);
  copy_store.to(Device::kCuda);
  copy_store.keep_bf16_copy();
  const auto inp = normal(static_cast<std::size_t>(s.rows * s.in), 3),
             d = normal(static_cast<std::size_t>(s.rows * s.out), 4);
  const auto n = static_cast<std::size_t>(s.rows * s.out);
  DeviceBuffer din = to_device(inp), dd = to_device(d);
  // forward, backward; the outputs, the input gradient and every parameter gradient.
  auto run = [&](const nn::Linear<float>& layer, ParamStore<float>& store) {
    store.zero_grad();
    DeviceBuffer out = to_device(nans(n)), dinp = to_device(nans(inp.size()));
    layer.forward(ptr<float>(din), ptr<float>(out), s.rows);
    layer.backward(ptr<float>(dd), ptr<float>(din), ptr<float>(dinp), s.rows, nn::GradInto::kSet);
    std::vector<float> all = to_host<float>(out, n), di = to_host<float>(dinp, inp.size());
    all.insert(all.end(), di.begin(), di.end());
    std::vector<float> grads(static_cast<std::size_t>(store.size()));
    cuda::copy_to_host(grads.data(), store.grads().data(), grads.size() * sizeof(float));
    all.insert(all.end(), grads.begin(), grads.end());
    return all;
  };
  auto same_bits = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };
  copy_store.refresh_bf16();
  ASSERT_NE(copy_store.param_bf16(copied.weight_id()), nullptr);
  EXPECT_TRUE(same_bits(run(copied, copy_store), run(plain, plain_store))) << "weights from the copy";
  const auto p2 = normal(static_cast<std::size_t>(plain_store.size()), 9, 0.2f);
  plain_store.params_from_host(p2.data());
  copy_store.params_from_host(p2.data());
  EXPECT_EQ(copy_store.param_bf16(copied.weight_id()), nullptr);
  EXPECT_TRUE(same_bits(run(copied, copy_store), run(plain, plain_store))) << "new weights, the copy stale";
  copy_store.refresh_bf16();
  EXPECT_TRUE(same_bits(run(copied, copy_store), run(plain, plain_store)))
      << "new weights, the copy refreshed";
}

// Under bf16 products on CUDA a layer with a bias fuses it into its products (cuBLASLt
// epilogues, ops::gemm_fused): the forward adds the bias, and the weight gradient's product
// sums the bias gradient from the rounded output gradient it reads. The MLP's pair writes
// bf16: forward_gelu writes the pre-activation and GELU of it (the GELU epilogue with its aux),
// backward_gelu writes d pre = (d · W) gelu'(pre) in bf16 (the dGELU epilogue). Against the
// CPU's bf16 layer (the fp32 product, then nn::Gelu's bf16 overloads; the bias gradient summed
// from the same rounded values): the same exact bf16 products in fp32 in other orders, so the
// fp32 outputs within 1e-4 relative and 1e-5 absolute, the bf16 ones also one bf16 step (2^-7)
// apart at most, GELU being 1.2-Lipschitz. A missing bias or GELU, or a bias gradient not
// accumulated into the filled one, is off by O(1); so is d pre without GELU's derivative. In
// both, NDMESH_EPILOGUES=off declines every epilogue, as cuBLASLt does where it has no
// algorithm: the layer then runs the steps apart, to the same bounds; ops::gemm_fused says
// which ran.
TEST(CudaLinear, Bf16BiasAndGeluFusedIntoTheProductsMatchTheCpu) {
  NDMESH_GPU_OR_SKIP();
  const auto widened = [](const std::vector<BFloat16>& v) {
    std::vector<float> w(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) w[i] = static_cast<float>(v[i]);
    return w;
  };
  for_each_epilogue_case([&](const Shape& s, [[maybe_unused]] bool decline, const std::string& where) {
    ParamStore<float> cpu_store, gpu_store;
    const nn::Linear<float> cpu = bf16_layer(cpu_store, s, true), gpu = bf16_layer(gpu_store, s, true);
    gpu_store.to(Device::kCuda);
    const auto g = normal(static_cast<std::size_t>(cpu_store.size()), 8);  // gradients already held
    std::copy(g.begin(), g.end(), cpu_store.grads().begin());
    cuda::copy_to_device(gpu_store.grads().data(), g.data(), g.size() * sizeof(float));
    const auto inp = normal(static_cast<std::size_t>(s.rows * s.in), 3);
    const auto n = static_cast<std::size_t>(s.rows * s.out);
    DeviceBuffer din = to_device(inp);

    std::vector<float> ref(n);
    cpu.forward(inp.data(), ref.data(), s.rows);
    DeviceBuffer dout = to_device(nans(n));
    gpu.forward(ptr<float>(din), ptr<float>(dout), s.rows);
    EXPECT_TRUE(all_close(to_host<float>(dout, n), ref, 1e-4, 1e-5)) << "forward, " << where;

    // fc and GELU into bf16: the pre-activation and the hidden.
    std::vector<BFloat16> pre16(n), act16(n);
    cpu.forward_gelu(inp.data(), pre16.data(), act16.data(), s.rows);
    DeviceBuffer dpre = to_device(bf16_of(nans(n))), dact = to_device(bf16_of(nans(n)));
    gpu.forward_gelu(ptr<float>(din), ptr<BFloat16>(dpre), ptr<BFloat16>(dact), s.rows);
    EXPECT_TRUE(all_close(widened(to_host<BFloat16>(dpre, n)), widened(pre16), 1.0 / 128, 1e-5))
        << "pre-activation, " << where;
    EXPECT_TRUE(all_close(widened(to_host<BFloat16>(dact, n)), widened(act16), 1.0 / 128, 1e-5))
        << "gelu, " << where;
    // The CPU's pre-activation is the fp32 forward (its bias rounded to bf16) rounded once.
    std::vector<float> act_ref(n);
    nn::Gelu<float>::forward(ref.data(), act_ref.data(), static_cast<std::int64_t>(n), Device::kCpu);
    EXPECT_TRUE(all_close(widened(pre16), ref, 1.0 / 128, 1e-2)) << "the CPU's pre-activation, " << where;
    EXPECT_TRUE(all_close(widened(act16), act_ref, 1.0 / 128, 1e-2)) << "the CPU's gelu, " << where;
    // Whether the product fuses it (cuBLASLt's GELU aux rows are a multiple of 8 apart: 13
    // outputs decline everywhere).
    ops::SharedOperand<float> x(Device::kCuda, MatmulPrecision::kBf16, ptr<float>(din), s.rows * s.in),
        w(Device::kCuda, MatmulPrecision::kBf16, gpu_store.param(gpu.weight_id()), s.in * s.out),
        b(Device::kCuda, MatmulPrecision::kBf16, gpu_store.param(gpu.bias_id()), s.out);
    const bool fused =
        ops::gemm_fused<float>(false, true, s.rows, s.out, s.in, x, s.in, w, s.in, ptr<BFloat16>(dact), s.out,
                               ops::Fused::kGelu, &b, ptr<BFloat16>(dpre));
#if NDMESH_CUDA_EMULATED
    EXPECT_EQ(fused, !decline && s.out % 8 == 0) << where;
#else
    if (decline) {
      EXPECT_FALSE(fused) << "NDMESH_EPILOGUES=off, yet GELU ran in the product, " << where;
    }
#endif

    const auto d = normal(n, 4);
    std::vector<float> dinp_ref(inp.size());
    cpu.backward(d.data(), inp.data(), dinp_ref.data(), s.rows, nn::GradInto::kSet);
    DeviceBuffer dd = to_device(d), ddinp = to_device(nans(inp.size()));
    gpu.backward(ptr<float>(dd), ptr<float>(din), ptr<float>(ddinp), s.rows, nn::GradInto::kSet);
    EXPECT_TRUE(all_close(to_host<float>(ddinp, inp.size()), dinp_ref, 1e-4, 1e-5)) << "d input, " << where;
    std::vector<float> grads(static_cast<std::size_t>(gpu_store.size()));
    cuda::copy_to_host(grads.data(), gpu_store.grads().data(), grads.size() * sizeof(float));
    const std::vector<float> grads_ref(cpu_store.grads().begin(), cpu_store.grads().end());
    // Sums over `rows` rows of terms below ~4 plus the filled gradient: 1e-6 rows absolute.
    EXPECT_TRUE(all_close(grads, grads_ref, 1e-4, 1e-6 * static_cast<double>(s.rows)))
        << "weight and bias gradients, " << where;

    // The backward through GELU (the layer's input taken as gelu(pre), both bf16): d pre =
    // (d · W) gelu'(pre) rounded once, against the CPU's, and the weight gradient added once more.
    const auto pre_in = bf16_of(normal(inp.size(), 5));
    std::vector<float> gelu_of_pre(inp.size());
    nn::Gelu<float>::forward(widened(pre_in).data(), gelu_of_pre.data(),
                             static_cast<std::int64_t>(inp.size()), Device::kCpu);
    const auto act_in = bf16_of(gelu_of_pre);
    std::vector<BFloat16> dpre_ref(inp.size());
    cpu.backward_gelu(d.data(), act_in.data(), pre_in.data(), dpre_ref.data(), s.rows);
    DeviceBuffer dgpre = to_device(pre_in), dgact = to_device(act_in),
                 ddpre = to_device(bf16_of(nans(inp.size())));
    gpu.backward_gelu(ptr<float>(dd), ptr<BFloat16>(dgact), ptr<BFloat16>(dgpre), ptr<BFloat16>(ddpre),
                      s.rows);
    // gelu' is within [-0.2, 1.2]: the product's bound carries over, one bf16 step for the
    // rounding, and cuBLASLt's gelu' may differ from the tanh form's where it saturates
    // (test_blas: 2^-7 of |d W|).
    EXPECT_TRUE(
        all_close(widened(to_host<BFloat16>(ddpre, inp.size())), widened(dpre_ref), 1.0 / 128, 1.0 / 128))
        << "d pre, " << where;
    cuda::copy_to_host(grads.data(), gpu_store.grads().data(), grads.size() * sizeof(float));
    EXPECT_TRUE(all_close(grads, std::vector<float>(cpu_store.grads().begin(), cpu_store.grads().end()), 1e-4,
                          2e-6 * static_cast<double>(s.rows)))
        << "gradients after the backward through GELU, " << where;
    ops::SharedOperand<float> dsh(Device::kCuda, MatmulPrecision::kBf16, ptr<float>(dd), s.rows * s.out);
    const bool dgelu_fused =
        ops::gemm_fused<float>(false, false, s.rows, s.in, s.out, dsh, s.out, w, s.in, ptr<BFloat16>(ddpre),
                               s.in, ops::Fused::kDGelu, nullptr, ptr<BFloat16>(dgpre));
#if NDMESH_CUDA_EMULATED
    EXPECT_EQ(dgelu_fused, !decline && s.in % 8 == 0) << where;
#else
    if (decline) {
      EXPECT_FALSE(dgelu_fused) << "NDMESH_EPILOGUES=off, yet GELU's derivative ran in the product, "
                                << where;
    }
    // What this cuBLASLt fused (the layer runs the rest apart): for the GPU check's log.
    if (!decline)
      std::printf("%s: GELU %s, GELU's derivative %s in the product (bf16)\n", where.c_str(),
                  fused ? "fused" : "apart", dgelu_fused ? "fused" : "apart");
#endif
  });
}

// The attention's linear layers under bf16 on CUDA keep their activations in bfloat16: qkv's
// forward writes its output (with its bias, rounded to bf16, added before the one rounding:
// cuBLASLt's bias epilogue, or the product, the bias and a rounding where it declines) and its
// backward reads its output's gradient as stored, proj's backward writes its input's gradient
// rounded once. Against the CPU's bf16 layer on the same values: the same exact bf16 products
// in fp32 in other orders (1e-5 relative, 1e-4 absolute for these sizes), then rounded once
// (one bf16 step, 2^-7, apart at most). A missing bias is off by O(1) (|b| ~ 0.2 here).
TEST(CudaLinear, Bf16ActivationsAndGradientsInBfloat16MatchTheCpu) {
  NDMESH_GPU_OR_SKIP();
  const auto widened = [](const std::vector<BFloat16>& v) {
    std::vector<float> w(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) w[i] = static_cast<float>(v[i]);
    return w;
  };
  const auto rounded = [](const std::vector<float>& v) {
    std::vector<BFloat16> r(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) r[i] = BFloat16(v[i]);
    return r;
  };
  for_each_epilogue_case([&](const Shape& s, bool, const std::string& where) {
    ParamStore<float> cpu_store, gpu_store;
    const nn::Linear<float> cpu = bf16_layer(cpu_store, s, true), gpu = bf16_layer(gpu_store, s, true);
    gpu_store.to(Device::kCuda);
    const auto inp16 = rounded(normal(static_cast<std::size_t>(s.rows * s.in), 3));
    const auto n = static_cast<std::size_t>(s.rows * s.out);
    DeviceBuffer din = to_device(inp16);

    std::vector<BFloat16> ref16(n);
    cpu.forward(inp16.data(), ref16.data(), s.rows);
    DeviceBuffer dout = to_device(std::vector<BFloat16>(n, BFloat16(std::nanf(""))));
    gpu.forward(ptr<BFloat16>(din), ptr<BFloat16>(dout), s.rows);
    const auto ref = widened(ref16);
    EXPECT_TRUE(all_close(widened(to_host<BFloat16>(dout, n)), ref, 1e-4, 1.0 / 128)) << "forward, " << where;

    // The backward from a bf16 output gradient, the input in bf16 too.
    const auto d16 = rounded(normal(n, 4));
    std::vector<float> dinp_ref(inp16.size());
    cpu.backward(d16.data(), inp16.data(), dinp_ref.data(), s.rows, nn::GradInto::kSet);
    DeviceBuffer dd = to_device(d16), ddinp = to_device(nans(inp16.size()));
    gpu.backward(ptr<BFloat16>(dd), ptr<BFloat16>(din), ptr<float>(ddinp), s.rows, nn::GradInto::kSet);
    EXPECT_TRUE(all_close(to_host<float>(ddinp, inp16.size()), dinp_ref, 1e-4, 1e-5)) << "d input, " << where;
    std::vector<float> grads(static_cast<std::size_t>(gpu_store.size()));
    cuda::copy_to_host(grads.data(), gpu_store.grads().data(), grads.size() * sizeof(float));
    EXPECT_TRUE(all_close(grads, std::vector<float>(cpu_store.grads().begin(), cpu_store.grads().end()), 1e-4,
                          1e-6 * static_cast<double>(s.rows)))
        << "weight and bias gradients, " << where;

    // The backward into a bf16 input gradient from an fp32 output gradient.
    const auto d = normal(n, 5);
    std::vector<BFloat16> dinp16_ref(inp16.size());
    cpu.backward(d.data(), inp16.data(), dinp16_ref.data(), s.rows);
    DeviceBuffer dd32 = to_device(d),
                 ddinp16 = to_device(std::vector<BFloat16>(inp16.size(), BFloat16(std::nanf(""))));
    gpu.backward(ptr<float>(dd32), ptr<BFloat16>(din), ptr<BFloat16>(ddinp16), s.rows);
    EXPECT_TRUE(
        all_close(widened(to_host<BFloat16>(ddinp16, inp16.size())), widened(dinp16_ref), 1e-4, 1.0 / 128))
        << "d input in bf16, " << where;
    cuda::copy_to_host(grads.data(), gpu_store.grads().data(), grads.size() * sizeof(float));
    EXPECT_TRUE(all_close(grads, std::vector<float>(cpu_store.grads().begin(), cpu_store.grads().end()), 1e-4,
                          2e-6 * static_cast<double>(s.rows)))
        << "weight and bias gradients after both, " << where;
  });
}

}  // namespace
}  // namespace ndmesh
