// Matmul on cuBLASLt (kernels/matmul.h): bf16 or f32 operands, fp32 accumulation.
//
// cuBLASLt is column-major; a row-major c = op(a) op(b) is the column-major c^T = op(b)^T op(a)^T,
// so b's buffer is the library's first operand and a's the second, each with the transpose flag
// its row-major flag implies. Descriptors are made per call; the heuristic's choice (the costly
// part: the decode step's eager form calls a few hundred small products) is cached by problem.
// The strided-batched form sets a batch count and stride on the three layouts: one call.
//
// Reproducibility: cuBLAS gives bit-identical results run to run for the same algorithm on GPUs of
// the same architecture and SM count when one stream is active or each stream has its own
// workspace (cuBLAS docs, "Results reproducibility"; the ops queue on one stream and pass the
// context's own workspace); cuBLASLt's split-K reduction schemes are all ordered (INPLACE keeps
// the order with counters in the workspace, the others reduce in a separate pass: cublasLt.h), so
// an algorithm's result does not depend on scheduling. What could change between two equal calls
// is the algorithm: the heuristic's answer is a function of the descriptors, the preference (the
// workspace size and the operands' alignments, which the caching allocator keeps at 256 bytes for
// whole tensors and the row offset fixes for views) and the device, so equal problems get equal
// algorithms in every process; the cache below only saves asking again (clearing it when full
// changes no answer).
#include <cublasLt.h>

#include <array>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "kernels/cuda/device_context.h"
#include "kernels/cuda/ops_cuda.h"

namespace orrery::kernels::cuda {
namespace {

// RAII for the descriptors.
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

// The heuristic's choices by problem: the descriptors' values (device, dtypes, transposes, the
// three layouts with their batch, the alignments). Bounded: cleared when it reaches kMaxAlgos
// entries (prefills of ever new lengths would grow it without end).
using AlgoKey = std::array<int64_t, 21>;
constexpr size_t kMaxAlgos = 4096;

std::mutex& AlgoMutex() {
  static std::mutex mu;
  return mu;
}
std::map<AlgoKey, cublasLtMatmulAlgo_t>& Algos() {
  static std::map<AlgoKey, cublasLtMatmulAlgo_t> algos;
  return algos;
}
bool LookUpAlgo(const AlgoKey& key, cublasLtMatmulAlgo_t* algo) {
  std::lock_guard<std::mutex> lock(AlgoMutex());
  auto it = Algos().find(key);
  if (it == Algos().end()) return false;
  *algo = it->second;
  return true;
}
void RememberAlgo(const AlgoKey& key, const cublasLtMatmulAlgo_t& algo) {
  std::lock_guard<std::mutex> lock(AlgoMutex());
  if (Algos().size() >= kMaxAlgos) Algos().clear();
  Algos()[key] = algo;
}

// One stored row-major matrix (or a batch of them) as cuBLASLt sees it.
struct LtOperand {
  const void* ptr;
  int64_t rows, cols, ld;
  int64_t stride;  // elements between the batch's matrices
};

// The largest power of two up to 256 dividing the operand's address and, with a batch, the byte
// stride between its matrices (every matrix of the batch must have the alignment announced).
uint32_t BatchAlignment(const LtOperand& x, int64_t batch, size_t esize) {
  uint32_t align = AlignmentOf(x.ptr);
  if (batch > 1) {
    const uintptr_t stride = static_cast<uintptr_t>(x.stride) * esize;
    while (align > 1 && stride % align != 0) align >>= 1;
  }
  return align;
}

// c = alpha op(a) op(b) + beta c (each `batch` times) on cuBLASLt.
Status LtMatmul(DeviceContext* ctx, DType in, DType out, const LtOperand& a, const LtOperand& b,
                const LtOperand& c, int64_t batch, const MatmulOptions& o) {
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
  // Column-major views: each stored row-major [rows, cols] (row stride ld) is [cols, rows] with
  // leading dimension ld.
  const cudaDataType_t in_type = LtType(in);
  ORRERY_RETURN_IF_ERROR(
      CublasStatus(cublasLtMatrixLayoutCreate(&d.a, in_type, b.cols, b.rows, b.ld), "layout b"));
  ORRERY_RETURN_IF_ERROR(
      CublasStatus(cublasLtMatrixLayoutCreate(&d.b, in_type, a.cols, a.rows, a.ld), "layout a"));
  ORRERY_RETURN_IF_ERROR(CublasStatus(
      cublasLtMatrixLayoutCreate(&d.c, LtType(out), c.cols, c.rows, c.ld), "layout c"));
  if (batch > 1) {
    const int32_t count = static_cast<int32_t>(batch);
    const std::pair<cublasLtMatrixLayout_t, int64_t> layouts[3] = {
        {d.a, b.stride}, {d.b, a.stride}, {d.c, c.stride}};
    for (const auto& [layout, stride] : layouts) {
      ORRERY_RETURN_IF_ERROR(
          CublasStatus(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                        &count, sizeof(count)),
                       "set batch count"));
      ORRERY_RETURN_IF_ERROR(CublasStatus(
          cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                           &stride, sizeof(stride)),
          "set batch stride"));
    }
  }
  ORRERY_RETURN_IF_ERROR(
      CublasStatus(cublasLtMatmulPreferenceCreate(&d.pref), "cublasLtMatmulPreferenceCreate"));
  const size_t ws = ctx->workspace_bytes();
  ORRERY_RETURN_IF_ERROR(
      CublasStatus(cublasLtMatmulPreferenceSetAttribute(
                       d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)),
                   "set workspace"));
  // The library's A is b's buffer, B is a's, C and D are c's.
  const size_t in_size = DTypeSize(in), out_size = DTypeSize(out);
  const uint32_t align[4] = {BatchAlignment(b, batch, in_size), BatchAlignment(a, batch, in_size),
                             BatchAlignment(c, batch, out_size),
                             BatchAlignment(c, batch, out_size)};
  const cublasLtMatmulPreferenceAttributes_t align_attr[4] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  for (int i = 0; i < 4; ++i) {
    ORRERY_RETURN_IF_ERROR(CublasStatus(
        cublasLtMatmulPreferenceSetAttribute(d.pref, align_attr[i], &align[i], sizeof(align[i])),
        "set alignment"));
  }
  // The heuristic's choice is a function of the descriptors above: cached by them.
  const AlgoKey key = {ctx->index(),
                       static_cast<int64_t>(in),
                       static_cast<int64_t>(out),
                       o.trans_a,
                       o.trans_b,
                       a.rows,
                       a.cols,
                       a.ld,
                       b.rows,
                       b.cols,
                       b.ld,
                       c.rows,
                       c.cols,
                       c.ld,
                       batch,
                       batch > 1 ? a.stride : 0,
                       batch > 1 ? b.stride : 0,
                       batch > 1 ? c.stride : 0,
                       align[0],
                       align[1],
                       align[2]};
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  if (LookUpAlgo(key, &heuristic.algo)) {
    found = 1;
  } else {
    ORRERY_RETURN_IF_ERROR(
        CublasStatus(cublasLtMatmulAlgoGetHeuristic(ctx->lt(), d.op, d.a, d.b, d.c, d.c, d.pref, 1,
                                                    &heuristic, &found),
                     "cublasLtMatmulAlgoGetHeuristic"));
    if (found != 0) RememberAlgo(key, heuristic.algo);
  }
  if (found == 0) {
    return UnimplementedError("matmul: cuBLASLt has no algorithm for " +
                              std::string(DTypeName(in)) + " [" + std::to_string(a.rows) + ", " +
                              std::to_string(a.cols) + "] x [" + std::to_string(b.rows) + ", " +
                              std::to_string(b.cols) + "] -> " + std::string(DTypeName(out)) +
                              " (batch " + std::to_string(batch) + ")");
  }
  return CublasStatus(cublasLtMatmul(ctx->lt(), d.op, &o.alpha, b.ptr, d.a, a.ptr, d.b, &o.beta,
                                     c.ptr, d.c, const_cast<void*>(c.ptr), d.c, &heuristic.algo,
                                     ctx->workspace(), ws, ctx->stream()),
                      "cublasLtMatmul");
}

}  // namespace

Status MatmulCuda(const Tensor& a, const Tensor& b, const MatmulOptions& o, int64_t m, int64_t n,
                  int64_t k, Tensor* c) {
  ORRERY_ASSIGN_OR_RETURN(DeviceContext * ctx, DeviceContext::Get(a.device().index));
  (void)k;
  return LtMatmul(ctx, a.dtype(), c->dtype(), {a.raw_data(), a.dim(0), a.dim(1), a.dim(1), 0},
                  {b.raw_data(), b.dim(0), b.dim(1), b.dim(1), 0}, {c->raw_data(), m, n, n, 0}, 1,
                  o);
}

Status MatmulStridedBatchedCuda(const MatrixBatch& a, const MatrixBatch& b, int64_t batch,
                                const MatmulOptions& o, int64_t m, int64_t n, int64_t k,
                                const MatrixBatch& c) {
  ORRERY_ASSIGN_OR_RETURN(DeviceContext * ctx, DeviceContext::Get(a.t.device().index));
  (void)m;
  (void)n;
  (void)k;
  auto operand = [](const MatrixBatch& x) {
    return LtOperand{static_cast<const char*>(x.t.raw_data()) +
                         x.offset * static_cast<int64_t>(DTypeSize(x.t.dtype())),
                     x.rows, x.cols, x.ld, x.batch_stride};
  };
  return LtMatmul(ctx, a.t.dtype(), c.t.dtype(), operand(a), operand(b), operand(c), batch, o);
}

}  // namespace orrery::kernels::cuda
