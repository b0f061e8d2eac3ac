// Matrix products over OpenBLAS, and the BLAS thread count.
//
// Every product in the layers goes through gemm() below: row-major, optional transposes,
// explicit leading dimensions (so attention can address one head inside a packed
// [q | k | v] row without copying). float calls sgemm, double calls dgemm.
#pragma once

#include <cstdint>

namespace ndmesh {

/// C[m,n] = alpha * op(A)[m,k] * op(B)[k,n] + beta * C, all row-major; op(X) is X or Xᵀ.
/// lda/ldb/ldc are the row strides of A, B and C as stored.
template <typename T>
void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, T alpha, const T* a,
          std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c, std::int64_t ldc);

/// Sets the number of BLAS threads of this process (>= 1).
void set_blas_threads(int threads);
/// The number of BLAS threads now in use.
int blas_threads();
/// The thread count NDMESH_THREADS asks for, or `fallback` when it is unset. ConfigError
/// when it is malformed.
int threads_from_env(int fallback);

}  // namespace ndmesh
