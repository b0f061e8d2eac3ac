// cuda::gemm for the CUDA emulator: the fp32 product on the host through ndmesh::gemm
// (OpenBLAS, the CPU twin), so that emulated tests can run whole layers (nn::Linear on a
// CUDA store). Linked into the emulated test binaries in place of src/tensor/cuda/blas.cu
// (cuBLASLt does not run here): this file defines every function blas.cu exports, so the
// linker never takes blas.cu's object from the library. The bf16 products run here too
// (widened operands, fp32 product; into bf16 rounded once), with the epilogues of the try_
// functions computed as cuBLASLt defines them; gemm_bf16's epilogues stay GPU only.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>


#include "account_hooks.hpp"
#include "cuda_runtime.h"

#include "ndmesh/core/error.hpp"
#include "ndmesh/nn/cuda_ops.hpp"
#include "ndmesh/nn/gelu.hpp"
#include "ndmesh/tensor/blas.hpp"
#include "tensor/cuda/errors.hpp"

namespace ndmesh::cuda {

namespace {
// The product's row in the kernel times, named as blas.cu names it (with its epilogue).
std::string product_name(const char* types, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
                         std::int64_t k, GemmEpilogue epilogue) {
  static const char* const kEpilogue[] = {"", " +bias", " +gelu", " +dgelu +bias grad", " +bias grad", " +dgelu"};
  char name[160];
  std::snprintf(name, sizeof name, "gemm %s %lldx%lldx%lld %c%c%s", types, static_cast<long long>(m),
                static_cast<long long>(n), static_cast<long long>(k), trans_a ? 'T' : 'N', trans_b ? 'T' : 'N',
                kEpilogue[static_cast<int>(epilogue)]);
  return name;
}
void timed_product(const char* types, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                   GemmEpilogue epilogue = GemmEpilogue::kNone) {
  if (!detail::timing()) return;
  detail::timed(product_name(types, trans_a, trans_b, m, n, k, epilogue).c_str());
}
// The product in the account (account.hpp), as cuBLASLt would get it; true when the arithmetic
// is to run (false in count-only mode).
bool account(const char* types, int ab_bytes, int c_bytes, bool trans_a, bool trans_b, std::int64_t m,
             std::int64_t n, std::int64_t k, const void* a, std::int64_t lda, const void* b, std::int64_t ldb,
             const void* c, std::int64_t ldc, float beta, GemmEpilogue epilogue = GemmEpilogue::kNone,
             const void* bias = nullptr, const void* aux = nullptr) {
  if (!emu::account_on()) return true;
  static const char* const kEpilogue[] = {"", "bias", "gelu", "dgelu bias grad", "bias grad", "dgelu"};
  emu::account_product({.name = product_name(types, trans_a, trans_b, m, n, k, epilogue),
                        .trans_a = trans_a,
                        .trans_b = trans_b,
                        .m = m,
                        .n = n,
                        .k = k,
                        .lda = lda,
                        .ldb = ldb,
                        .ldc = ldc,
                        .ab_bytes = ab_bytes,
                        .c_bytes = c_bytes,
                        .epilogue = kEpilogue[static_cast<int>(epilogue)],
                        .align_a = emu::alignment_of(a),
                        .align_b = emu::alignment_of(b),
                        .align_c = emu::alignment_of(c),
                        .align_bias = bias != nullptr ? emu::alignment_of(bias) : 16,
                        .align_aux = aux != nullptr ? emu::alignment_of(aux) : 16,
                        .beta_reads_c = beta != 0.0f});
  return !emu::account_count_only();
}
}  // namespace

void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
          const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
          std::int64_t ldc) {
  if (account("fp32", 4, 4, trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc, beta))
    emu::device_op([=] {
      const emu::DeviceWork work;  // reads and writes device memory
      ndmesh::gemm<float>(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    });
  timed_product("fp32", trans_a, trans_b, m, n, k);
}

namespace {
std::vector<float> widened(const BFloat16* x, std::int64_t extent) {
  std::vector<float> w(static_cast<std::size_t>(extent));
  for (std::int64_t i = 0; i < extent; ++i) w[static_cast<std::size_t>(i)] = static_cast<float>(x[i]);
  return w;
}
// Stored extents: A is m x k (k x m transposed), B is k x n (n x k transposed).
std::int64_t extent_a(bool trans_a, std::int64_t m, std::int64_t k, std::int64_t lda) {
  return k <= 0 ? 0 : ((trans_a ? k : m) - 1) * lda + (trans_a ? m : k);
}
std::int64_t extent_b(bool trans_b, std::int64_t n, std::int64_t k, std::int64_t ldb) {
  return k <= 0 ? 0 : ((trans_b ? n : k) - 1) * ldb + (trans_b ? k : n);
}
void refuse_epilogue(GemmEpilogue epilogue, const char* what) {
  if (epilogue != GemmEpilogue::kNone)
    fail<>("cuda", "{} with an epilogue (cuBLASLt) does not run in the CUDA emulator; run the gpu. tests on a GPU",
           what);
}
// The bf16 operands widened to fp32 and the fp32 product into the fp32 C: a bf16 product with
// fp32 accumulation (a product of two bf16 values is exact in fp32), as the CPU's bf16 path
// computes it (and cuBLASLt's CUBLAS_COMPUTE_32F, up to summation order).
void widened_product(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                     const BFloat16* a, std::int64_t lda, const BFloat16* b, std::int64_t ldb, float beta, float* c,
                     std::int64_t ldc) {
  const std::vector<float> a32 = widened(a, extent_a(trans_a, m, k, lda)),
                           b32 = widened(b, extent_b(trans_b, n, k, ldb));
  ndmesh::gemm<float>(trans_a, trans_b, m, n, k, alpha, a32.data(), lda, b32.data(), ldb, beta, c, ldc);
}
}  // namespace

// The bf16 product into bf16 without an epilogue (the bf16 logits of the classifier): the
// widened product into an fp32 C (widened from C when beta reads it), each output rounded once.
void gemm_bf16(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
               const BFloat16* a, std::int64_t lda, const BFloat16* b, std::int64_t ldb, float beta, BFloat16* c,
               std::int64_t ldc, GemmEpilogue epilogue, const BFloat16*, BFloat16*, BFloat16*) {
  refuse_epilogue(epilogue, "gemm_bf16");
  if (m <= 0 || n <= 0) return;
  if (!account("bf16", 2, 2, trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc, beta))
    return timed_product("bf16", trans_a, trans_b, m, n, k);
  emu::device_op([=] {
    const emu::DeviceWork work;  // reads and writes device memory
    std::vector<float> c32(static_cast<std::size_t>(m * n), 0.0f);
    if (beta != 0.0f)
      for (std::int64_t r = 0; r < m; ++r)
        for (std::int64_t j = 0; j < n; ++j)
          c32[static_cast<std::size_t>(r * n + j)] = static_cast<float>(c[r * ldc + j]);
    widened_product(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c32.data(), n);
    for (std::int64_t r = 0; r < m; ++r)
      for (std::int64_t j = 0; j < n; ++j)
        c[r * ldc + j] = BFloat16(c32[static_cast<std::size_t>(r * n + j)]);
  });
  timed_product("bf16", trans_a, trans_b, m, n, k);
}

// The bf16 product into bf16 with its epilogue, as cuBLASLt computes it (cuda_ops.hpp): the
// fp32 product, then the bias (bf16) added in fp32, GELU (the CPU's tanh form: nn::Gelu) of
// that with its aux, or GELU's derivative at the aux (bf16, widened), each output rounded
// once; declines, as cuBLASLt, for a GELU aux whose rows are not a multiple of 8 apart
// (NDMESH_EPILOGUES=off declines every epilogue before it is called: ops::gemm_fused).
bool try_gemm_bf16(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                   const BFloat16* a, std::int64_t lda, const BFloat16* b, std::int64_t ldb, BFloat16* c,
                   std::int64_t ldc, GemmEpilogue epilogue, const BFloat16* bias, BFloat16* aux) {
  const bool gelu = epilogue == GemmEpilogue::kGeluAux, dgelu = epilogue == GemmEpilogue::kDGeluNoBiasGrad;
  if (epilogue != GemmEpilogue::kBias && !gelu && !dgelu)
    fail<>("cuda", "try_gemm_bf16 takes the bias, GELU with aux or dGELU epilogue");
  if ((!dgelu && bias == nullptr) || ((gelu || dgelu) && aux == nullptr))
    fail<>("cuda", "try_gemm_bf16: the epilogue {} needs its bias or aux pointer",
           static_cast<int>(epilogue));
  if (m <= 0 || n <= 0 || k <= 0)
    fail<>("cuda", "try_gemm_bf16: m, n and k must be positive ({}, {}, {})", m, n, k);
  if ((gelu || dgelu) && ldc % 8 != 0) return false;
  if (!account("bf16", 2, 2, trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc, 0.0f, epilogue, bias, aux)) {
    timed_product("bf16", trans_a, trans_b, m, n, k, epilogue);
    return true;
  }
  emu::device_op([=] {
    const emu::DeviceWork work;  // reads and writes device memory
    std::vector<float> c32(static_cast<std::size_t>(m * n), 0.0f);
    widened_product(trans_a, trans_b, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c32.data(), n);
    for (std::int64_t r = 0; r < m; ++r) {
      float* row = c32.data() + r * n;
      if (!dgelu)
        for (std::int64_t j = 0; j < n; ++j) row[j] += static_cast<float>(bias[j]);
      if (gelu) {
        for (std::int64_t j = 0; j < n; ++j) aux[r * ldc + j] = BFloat16(row[j]);
        nn::Gelu<float>::forward(row, row, n, Device::kCpu);
      }
      if (dgelu) {
        std::vector<float> pre(static_cast<std::size_t>(n));
        for (std::int64_t j = 0; j < n; ++j)
          pre[static_cast<std::size_t>(j)] = static_cast<float>(aux[r * ldc + j]);
        nn::Gelu<float>::backward(row, pre.data(), row, n, Device::kCpu);  // in place: product * gelu'(aux)
      }
      for (std::int64_t j = 0; j < n; ++j) c[r * ldc + j] = BFloat16(row[j]);
    }
  });
  timed_product("bf16", trans_a, trans_b, m, n, k, epilogue);
  return true;
}

// The bf16 product into fp32 without an epilogue (what --precision bf16's linear layers call).
void gemm_bf16_f32(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                   const BFloat16* a, std::int64_t lda, const BFloat16* b, std::int64_t ldb, float beta, float* c,
                   std::int64_t ldc, GemmEpilogue epilogue, float*) {
  refuse_epilogue(epilogue, "gemm_bf16_f32");
  if (m <= 0 || n <= 0) return;
  if (!account("bf16>fp32", 2, 4, trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc, beta))
    return timed_product("bf16>fp32", trans_a, trans_b, m, n, k);
  emu::device_op([=] {
    const emu::DeviceWork work;  // reads and writes device memory
    widened_product(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  });
  timed_product("bf16>fp32", trans_a, trans_b, m, n, k);
}

// The bf16 product into fp32 with its epilogue, as cuBLASLt defines it (cuda_ops.hpp): the
// product (plus beta C), then the bias or the bias gradient of op(A), in fp32 (ops::gemm_fused
// into T fuses nothing else; GELU and its derivative go into bf16, try_gemm_bf16).
// (NDMESH_EPILOGUES=off makes ops::gemm_fused run the callers' unfused path without calling it.)
bool try_gemm_bf16_f32(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                       float alpha, const BFloat16* a, std::int64_t lda, const BFloat16* b, std::int64_t ldb,
                       float beta, float* c, std::int64_t ldc, GemmEpilogue epilogue, const float* bias,
                       float*, float* dbias) {
  if (epilogue != GemmEpilogue::kBias && epilogue != GemmEpilogue::kBGradB)
    fail<>("cuda", "the emulator's try_gemm_bf16_f32 runs the bias and bias gradient epilogues only (nothing calls "
                   "the others)");
  if ((epilogue == GemmEpilogue::kBias && bias == nullptr) || (epilogue == GemmEpilogue::kBGradB && dbias == nullptr))
    fail<>("cuda", "try_gemm_bf16_f32: the epilogue {} needs its bias or bias gradient pointer",
           static_cast<int>(epilogue));
  if (epilogue == GemmEpilogue::kBGradB && !trans_a)  // the sums of op(A)'s rows over k: A is [k, m]
    fail<>("cuda", "try_gemm_bf16_f32: the bias gradient epilogue takes a transposed A");
  if (!account("bf16>fp32", 2, 4, trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc, beta, epilogue,
               epilogue == GemmEpilogue::kBias ? static_cast<const void*>(bias) : dbias)) {
    timed_product("bf16>fp32", trans_a, trans_b, m, n, k, epilogue);
    return true;
  }
  emu::device_op([=] {
    const emu::DeviceWork work;  // reads and writes device memory
    widened_product(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    if (epilogue == GemmEpilogue::kBias)
      for (std::int64_t r = 0; r < m; ++r)
        for (std::int64_t j = 0; j < n; ++j) c[r * ldc + j] += bias[j];
    if (epilogue == GemmEpilogue::kBGradB)
      for (std::int64_t i = 0; i < m; ++i) {
        float sum = 0;
        for (std::int64_t l = 0; l < k; ++l) sum += static_cast<float>(a[l * lda + i]);
        dbias[i] = sum;
      }
  });
  timed_product("bf16>fp32", trans_a, trans_b, m, n, k, epilogue);
  return true;
}

}  // namespace ndmesh::cuda
