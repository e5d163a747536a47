// Dense matrix products: C = alpha * op(A) * op(B) + beta * C, row-major.
//
// CPU: OpenBLAS (cblas_sgemm / cblas_dgemm) for f32 and f64. The f64 path exists for gradient
// checks against finite differences. Shapes: op(A) is [m, k], op(B) is [k, n], C is [m, n];
// lda/ldb/ldc are row strides in elements.
#pragma once

#include <cstdint>

namespace orrery::kernels {

void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);
void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
          const double* a, int64_t lda, const double* b, int64_t ldb, double beta, double* c,
          int64_t ldc);

// Contiguous shorthand: lda = trans_a ? m : k, ldb = trans_b ? k : n, ldc = n.
template <typename T>
void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
          const T* b, T beta, T* c) {
  Gemm(trans_a, trans_b, m, n, k, alpha, a, trans_a ? m : k, b, trans_b ? k : n, beta, c, n);
}

}  // namespace orrery::kernels
