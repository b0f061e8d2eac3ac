// cuda::gemm for the CUDA emulator: the fp32 product on the host through ndmesh::gemm
// (OpenBLAS, the CPU twin), so that emulated tests can run whole layers (nn::Linear on a
// CUDA store). Linked into the emulated test binaries in place of src/tensor/cuda/blas.cu
// (cuBLASLt does not run here): this file defines every function blas.cu exports, so the
// linker never takes blas.cu's object from the library. The bf16 products stay GPU only.
#include <cstdint>

#include "cuda_runtime.h"

#include "ndmesh/core/error.hpp"
#include "ndmesh/nn/cuda_ops.hpp"
#include "ndmesh/tensor/blas.hpp"

namespace ndmesh::cuda {

void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
          const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
          std::int64_t ldc) {
  const emu::DeviceWork work;  // reads and writes device memory
  ndmesh::gemm<float>(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void gemm_bf16(bool, bool, std::int64_t, std::int64_t, std::int64_t, float, const BFloat16*, std::int64_t,
               const BFloat16*, std::int64_t, float, BFloat16*, std::int64_t, GemmEpilogue, const float*,
               BFloat16*, float*) {
  fail<>("cuda", "gemm_bf16 (cuBLASLt) does not run in the CUDA emulator; run the gpu. tests on a GPU");
}

void gemm_bf16_f32(bool, bool, std::int64_t, std::int64_t, std::int64_t, float, const BFloat16*, std::int64_t,
                   const BFloat16*, std::int64_t, float, float*, std::int64_t, GemmEpilogue, float*) {
  fail<>("cuda", "gemm_bf16_f32 (cuBLASLt) does not run in the CUDA emulator; run the gpu. tests on a GPU");
}

}  // namespace ndmesh::cuda
