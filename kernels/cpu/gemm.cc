// OpenBLAS runs single-threaded; large products are split by rows of C over Orrery's thread pool
// instead. Why: OpenBLAS's own threads spin and yield between calls, and most of the model's
// products are small or already issued from pool workers (attention per head, KDA per chunk), where
// nested BLAS threads only oversubscribe the cores. Measured on the tiny model in
// docs/benchmarks.md ("Model (CPU)").
#include "kernels/gemm.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>

#include "core/thread_pool.h"

namespace orrery::kernels {
namespace {

// Below this many multiply-adds a product runs on the calling thread (splitting costs more).
constexpr double kParallelWork = 1 << 20;
// Rows of C per OpenBLAS call in a split product: at least this many, and enough for about
// kBlockWork multiply-adds (so per-call costs and the packing of B stay small).
constexpr int64_t kMinBlockRows = 64;
constexpr double kBlockWork = 1 << 22;

void SingleThreadedBlas() {
  static const bool once = [] {
    openblas_set_num_threads(1);
    return true;
  }();
  (void)once;
}

// Runs block(r0, r1) over row blocks of C = op(A) op(B). The blocks are a function of the shape
// alone, never of the pool's size: OpenBLAS's value for a row of C depends on how many rows the
// call has (small-matrix kernels, edge tiles), so blocks fixed by the shape keep every product, and
// with it training, bit-identical whatever the thread count.
template <typename Block>
void ByRows(int64_t m, int64_t n, int64_t k, const Block& block) {
  SingleThreadedBlas();
  const double row_work = static_cast<double>(n) * static_cast<double>(std::max<int64_t>(k, 1));
  if (row_work * static_cast<double>(m) < kParallelWork || m <= kMinBlockRows) {
    block(0, m);
    return;
  }
  const int64_t rows =
      std::max<int64_t>(kMinBlockRows, static_cast<int64_t>(std::ceil(kBlockWork / row_work)));
  const int64_t blocks = (m + rows - 1) / rows;
  ThreadPool::Default().ParallelFor(blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) block(b * rows, std::min(m, (b + 1) * rows));
  });
}

}  // namespace

void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  ByRows(m, n, k, [&](int64_t r0, int64_t r1) {
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(r1 - r0),
                static_cast<blasint>(n), static_cast<blasint>(k), alpha,
                trans_a ? a + r0 : a + r0 * lda, static_cast<blasint>(lda), b,
                static_cast<blasint>(ldb), beta, c + r0 * ldc, static_cast<blasint>(ldc));
  });
}

void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
          const double* a, int64_t lda, const double* b, int64_t ldb, double beta, double* c,
          int64_t ldc) {
  if (m == 0 || n == 0) return;
  ByRows(m, n, k, [&](int64_t r0, int64_t r1) {
    cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(r1 - r0),
                static_cast<blasint>(n), static_cast<blasint>(k), alpha,
                trans_a ? a + r0 : a + r0 * lda, static_cast<blasint>(lda), b,
                static_cast<blasint>(ldb), beta, c + r0 * ldc, static_cast<blasint>(ldc));
  });
}

}  // namespace orrery::kernels
