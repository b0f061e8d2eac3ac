#include "ndmesh/tensor/blas.hpp"

#include <cblas.h>

#include "ndmesh/core/env.hpp"
#include "ndmesh/core/error.hpp"

namespace ndmesh {

template <>
void gemm<float>(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                 const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
                 std::int64_t ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a, static_cast<int>(lda),
              b, static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
}

template <>
void gemm<double>(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, double alpha,
                  const double* a, std::int64_t lda, const double* b, std::int64_t ldb, double beta,
                  double* c, std::int64_t ldc) {
  cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a, static_cast<int>(lda),
              b, static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
}

void set_blas_threads(int threads) {
  NDMESH_CHECK(threads >= 1, "tensor", "BLAS thread count {} must be at least 1", threads);
  openblas_set_num_threads(threads);
}

int blas_threads() { return openblas_get_num_threads(); }

int threads_from_env(int fallback) {
  return static_cast<int>(env::integer("NDMESH_THREADS", fallback, 1, 1024));
}

}  // namespace ndmesh
