// Matmul on cuBLASLt (kernels/matmul.h): bf16 or f32 operands, fp32 accumulation.
//
// cuBLASLt is column-major; a row-major c = op(a) op(b) is the column-major c^T = op(b)^T op(a)^T,
// so b's buffer is the library's first operand and a's the second, each with the transpose flag
// its row-major flag implies. Descriptors are made per call (a few microseconds).
//
// Reproducibility: cuBLAS gives bit-identical results run to run for the same algorithm on GPUs of
// the same architecture and SM count when one stream is active or each stream has its own
// workspace (cuBLAS docs, "Results reproducibility"; the ops queue on one stream and pass the
// context's own workspace); cuBLASLt's split-K reduction schemes are all ordered (INPLACE keeps
// the order with counters in the workspace, the others reduce in a separate pass: cublasLt.h), so
// an algorithm's result does not depend on scheduling. What could change between two equal calls
// is the algorithm: the heuristic's answer is a function of the descriptors, the preference (the
// workspace size and the operands' alignments, which the caching allocator keeps at 256 bytes for
// whole tensors and the row offset fixes for views) and the device, and it is asked once per such
// key and kept for the life of the process (AlgoFor), so a run never changes algorithm mid-run and
// every process asks the same question.
#include <cublasLt.h>

#include <map>
#include <memory>
#include <mutex>
#include <tuple>

#include "kernels/cuda/device_context.h"
#include "kernels/cuda/ops_cuda.h"

namespace orrery::kernels::cuda {
namespace {

// RAII for the three descriptor kinds.
struct LtDescriptors {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~LtDescriptors() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

cudaDataType_t LtType(DType dt) { return dt == DType::kBF16 ? CUDA_R_16BF : CUDA_R_32F; }

// The largest power of two up to 256 that divides the address. cuBLASLt assumes 256-byte aligned
// buffers unless told otherwise, and a row view (Tensor::Slice, the MoE experts' rows) is aligned
// only to its row offset.
uint32_t AlignmentOf(const void* p) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && address % align != 0) align >>= 1;
  return align;
}

// Everything the heuristic is asked about a product, and the algorithm it chose.
struct AlgoKey {
  int device;
  cudaDataType_t in, out;
  cublasOperation_t op_first, op_second;
  int64_t first_rows, first_cols, second_rows, second_cols, out_rows, out_cols;
  uint32_t align[4];
  size_t workspace;
  auto Tie() const {
    return std::tie(device, in, out, op_first, op_second, first_rows, first_cols, second_rows,
                    second_cols, out_rows, out_cols, align[0], align[1], align[2], align[3],
                    workspace);
  }
  bool operator<(const AlgoKey& o) const { return Tie() < o.Tie(); }
};

// The algorithm for `key`: the heuristic's first choice, asked once per key and pinned.
StatusOr<cublasLtMatmulAlgo_t> AlgoFor(const AlgoKey& key, cublasLtHandle_t lt,
                                       cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t first,
                                       cublasLtMatrixLayout_t second, cublasLtMatrixLayout_t out,
                                       cublasLtMatmulPreference_t pref) {
  static std::mutex mu;
  static std::map<AlgoKey, cublasLtMatmulAlgo_t> pinned;
  std::lock_guard<std::mutex> lock(mu);
  auto it = pinned.find(key);
  if (it != pinned.end()) return it->second;
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  ORRERY_RETURN_IF_ERROR(CublasStatus(
      cublasLtMatmulAlgoGetHeuristic(lt, op, first, second, out, out, pref, 1, &heuristic, &found),
      "cublasLtMatmulAlgoGetHeuristic"));
  if (found == 0) return NotFoundError("no algorithm");
  pinned.emplace(key, heuristic.algo);
  return heuristic.algo;
}

}  // namespace

Status MatmulCuda(const Tensor& a, const Tensor& b, const MatmulOptions& o, int64_t m, int64_t n,
                  int64_t k, Tensor* c) {
  ORRERY_ASSIGN_OR_RETURN(DeviceContext * ctx, DeviceContext::Get(a.device().index));
  LtDescriptors d;
  ORRERY_RETURN_IF_ERROR(CublasStatus(
      cublasLtMatmulDescCreate(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate"));
  // The library's op(A) is b's, op(B) is a's (see the file comment).
  const cublasOperation_t op_first = o.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_second = o.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  ORRERY_RETURN_IF_ERROR(
      CublasStatus(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_first,
                                                  sizeof(op_first)),
                   "set TRANSA"));
  ORRERY_RETURN_IF_ERROR(
      CublasStatus(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_second,
                                                  sizeof(op_second)),
                   "set TRANSB"));
  // Column-major views: b's buffer [b.dim(1) rows, b.dim(0) cols], a's [a.dim(1), a.dim(0)],
  // c's [n, m]; each leading dimension is the row-major row length.
  const cudaDataType_t in_type = LtType(a.dtype());
  ORRERY_RETURN_IF_ERROR(CublasStatus(
      cublasLtMatrixLayoutCreate(&d.a, in_type, b.dim(1), b.dim(0), b.dim(1)), "layout b"));
  ORRERY_RETURN_IF_ERROR(CublasStatus(
      cublasLtMatrixLayoutCreate(&d.b, in_type, a.dim(1), a.dim(0), a.dim(1)), "layout a"));
  ORRERY_RETURN_IF_ERROR(
      CublasStatus(cublasLtMatrixLayoutCreate(&d.c, LtType(c->dtype()), n, m, n), "layout c"));
  ORRERY_RETURN_IF_ERROR(
      CublasStatus(cublasLtMatmulPreferenceCreate(&d.pref), "cublasLtMatmulPreferenceCreate"));
  const size_t ws = ctx->workspace_bytes();
  ORRERY_RETURN_IF_ERROR(
      CublasStatus(cublasLtMatmulPreferenceSetAttribute(
                       d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)),
                   "set workspace"));
  // The library's A is b's buffer, B is a's, C and D are c's.
  const uint32_t align[4] = {AlignmentOf(b.raw_data()), AlignmentOf(a.raw_data()),
                             AlignmentOf(c->raw_data()), AlignmentOf(c->raw_data())};
  const cublasLtMatmulPreferenceAttributes_t align_attr[4] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  for (int i = 0; i < 4; ++i) {
    ORRERY_RETURN_IF_ERROR(CublasStatus(
        cublasLtMatmulPreferenceSetAttribute(d.pref, align_attr[i], &align[i], sizeof(align[i])),
        "set alignment"));
  }
  const AlgoKey key{ctx->index(),
                    in_type,
                    LtType(c->dtype()),
                    op_first,
                    op_second,
                    b.dim(1),
                    b.dim(0),
                    a.dim(1),
                    a.dim(0),
                    n,
                    m,
                    {align[0], align[1], align[2], align[3]},
                    ws};
  StatusOr<cublasLtMatmulAlgo_t> algo = AlgoFor(key, ctx->lt(), d.op, d.a, d.b, d.c, d.pref);
  if (!algo.ok()) {
    if (algo.status().code() != StatusCode::kNotFound) return algo.status();
    return UnimplementedError("matmul: cuBLASLt has no algorithm for " + a.ToString() + " x " +
                              b.ToString() + " -> " + c->ToString());
  }
  (void)k;
  return CublasStatus(cublasLtMatmul(ctx->lt(), d.op, &o.alpha, b.raw_data(), d.a, a.raw_data(),
                                     d.b, &o.beta, c->raw_data(), d.c, c->raw_data(), d.c, &*algo,
                                     ctx->workspace(), ws, ctx->stream()),
                      "cublasLtMatmul");
}

}  // namespace orrery::kernels::cuda
