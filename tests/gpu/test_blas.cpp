// cuda::gemm (cuBLASLt, TF32 off) against ndmesh::gemm (OpenBLAS) on odd shapes, every
// transpose, padded leading dimensions, beta = 0 over a poisoned C and beta != 0 over a
// filled one; and Linear's forward composed on the device (gemm, then bias_forward)
// against nn::Linear<float>::forward. GPU only: the CPU emulator has no cuBLASLt.
#include <cmath>
#include <cstdint>
#include <vector>

#include "gpu_test.hpp"
#include "ndmesh/nn/cuda_ops.hpp"
#include "ndmesh/nn/linear.hpp"
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

}  // namespace
}  // namespace ndmesh
