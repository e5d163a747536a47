// Absorbed MLA decode over a paged latent cache (kernels/mla_decode.h): the bf16 tensor-core split
// kernel, and the op's entry (the split choice, the partials' workspace, the dispatch to this
// kernel, to the SIMT kernel of mla_decode_simt.cu for f32 and other shapes, and to the merge).
//
// Memory-bound: a latent row is read once for the 16 query rows of a block (all heads of one
// query at H = 16; Q * H / 16 groups of one split read the same rows side by side, through L2).
// Block = 8 warps owning (sequence, split, 16 query rows); the split's positions stream through
// shared memory in tiles of kMlaTile = 32 rows x D (D + 8 bf16 per row: the 16-byte pad puts the
// 8 rows an ldmatrix or a fragment load reads in 8 bank groups), 4 cp.async stages (3 tiles in
// flight, 150 KB at D = 576), page ids looked up per 16-byte piece.
// Per tile: scores [16 x 32] = q [16 x D] . tile^T with mma.sync m16n8k16 (warp w: positions
// 8 (w % 4) .. + 7, half w / 4 of the k steps; the halves summed in shared memory), an online
// softmax in f32 (warp per 2 rows, lane per position; P rounded to bf16 for the product), then
// o [16 x dv] += P [16 x 32] . tile[:, :dv] (warp w: dv / 8 columns, f32 accumulators in
// registers, B fragments by ldmatrix.trans). Shared memory at D = 576: 170 KB, one block per SM.
// Not yet timed (issue 23): the benchmark is tests/gpu/mla_decode_gpu_bench.cc.
#include <algorithm>
#include <climits>
#include <cmath>

#include "kernels/cuda/device_context.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/kda_mma.cuh"
#include "kernels/cuda/mla_decode_cuda.cuh"
#include "kernels/cuda/ops_cuda.h"
#include "kernels/mla_decode.h"

namespace orrery::kernels::cuda {
namespace {

using B = __nv_bfloat16;
constexpr int kStages = 4;
constexpr int kPLd = kMlaTile + 8;  // row stride of P in shared memory (bf16)
constexpr int kMaxColTiles = 8;     // 8-column mma tiles per warp at dv = 512
// A split shorter than this writes (and the merge reads) as many partial bytes as it saves.
constexpr int64_t kMinSplitPositions = 512;

size_t TcSmemBytes(int d) {
  const size_t ld = static_cast<size_t>(d) + 8;
  return (kStages * kMlaTile * ld + kMlaRows * ld + kMlaRows * kPLd) * sizeof(B) +
         (2 * kMlaRows * kMlaTile + 3 * kMlaRows) * sizeof(float) + kMlaRows * sizeof(int);
}

// Positions tile_begin .. tile_begin + kMlaTile - 1 of sequence n into dst (rows of ld), as
// 16-byte cp.async pieces; positions from `end` on are zero-filled.
__device__ __forceinline__ void LoadTile(const MlaDecodeProblem& p, const B* pages, int n,
                                         int tile_begin, int end, B* dst, int ld) {
  const int pieces = p.d / 8;
  for (int i = threadIdx.x; i < kMlaTile * pieces; i += kMlaThreads) {
    const int r = i / pieces, c = (i - r * pieces) * 8;
    const int pos = tile_begin + r;
    B* d = dst + r * ld + c;
    if (pos < end) {
      CpAsync16(d, pages + MlaRowOffset(p, n, pos) + c);
    } else {
      *reinterpret_cast<uint4*>(d) = make_uint4(0, 0, 0, 0);
    }
  }
}

__device__ __forceinline__ float WarpMax(float x) {
  for (int off = 16; off > 0; off >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, off));
  return x;
}

__global__ void __launch_bounds__(kMlaThreads, 1) MlaDecodeTcKernel(MlaDecodeProblem p) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int ld = p.d + 8;
  B* kv = reinterpret_cast<B*>(smem);
  B* qs = kv + kStages * kMlaTile * ld;
  B* pb = qs + kMlaRows * ld;
  float* sc = reinterpret_cast<float*>(pb + kMlaRows * kPLd);  // [2][16][32] score halves
  float* m_s = sc + 2 * kMlaRows * kMlaTile;
  float* l_s = m_s + kMlaRows;
  float* a_s = l_s + kMlaRows;
  int* lim_s = reinterpret_cast<int*>(a_s + kMlaRows);

  const MlaBlock blk = MlaBlockOf(p);
  const int len = MlaContextLength(p, blk.n);
  int begin, end;
  MlaSplitRange(len, p.splits, blk.s, &begin, &end);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane >> 2, t4 = lane & 3;
  const int row0 = blk.g * kMlaRows;
  const B* pages = static_cast<const B*>(p.pages);
  const int ntiles = begin < end ? (end - begin + kMlaTile - 1) / kMlaTile : 0;

  // Prologue: the first kStages - 1 tiles in flight (one commit group each, empty past the end),
  // then the block's query rows (zeros for the padding rows) and the row state.
  for (int st = 0; st < kStages - 1; ++st) {
    if (st < ntiles) {
      LoadTile(p, pages, blk.n, begin + st * kMlaTile, end, kv + st * kMlaTile * ld, ld);
    }
    CpAsyncCommit();
  }
  const B* q = static_cast<const B*>(p.q) + (static_cast<int64_t>(blk.n) * p.rows + row0) * p.d;
  const int qpieces = p.d / 8;
  for (int i = tid; i < kMlaRows * qpieces; i += kMlaThreads) {
    const int r = i / qpieces, c = (i - r * qpieces) * 8;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (row0 + r < p.rows)
      v = *reinterpret_cast<const uint4*>(q + static_cast<int64_t>(r) * p.d + c);
    *reinterpret_cast<uint4*>(qs + r * ld + c) = v;
  }
  if (tid < kMlaRows) {
    m_s[tid] = -INFINITY;
    l_s[tid] = 0.0f;
    a_s[tid] = 1.0f;
    lim_s[tid] = MlaRowLimit(p, row0 + tid, len, end);
  }

  const int col_tiles = p.dv / 64;     // this warp's 8-column tiles
  const int col0 = warp * (p.dv / 8);  // its first column
  const int ksteps = p.d / 16, khalf = (ksteps + 1) / 2;
  const int kh = warp >> 2, stile = warp & 3;  // score work: k half, 8-position tile
  float acc[kMaxColTiles][4];
#pragma unroll
  for (int i = 0; i < kMaxColTiles; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;

  for (int it = 0; it < ntiles; ++it) {
    // Tile `it` has landed (its group and all before it are complete) and every warp is done
    // with tile it - 1, whose stage the next load reuses.
    CpAsyncWaitPending<kStages - 2>();
    __syncthreads();
    if (it + kStages - 1 < ntiles) {
      const int nxt = it + kStages - 1;
      LoadTile(p, pages, blk.n, begin + nxt * kMlaTile, end, kv + (nxt % kStages) * kMlaTile * ld,
               ld);
    }
    CpAsyncCommit();
    const B* tile = kv + (it % kStages) * kMlaTile * ld;
    const int tile_begin = begin + it * kMlaTile;

    {  // Scores: this warp's half of the k steps for positions 8 stile .. + 7.
      float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      const B* brow = tile + stile * 8 * ld;
      const int ks_end = min(ksteps, (kh + 1) * khalf);
      for (int ks = kh * khalf; ks < ks_end; ++ks) {
        uint32_t a[4], b[2];
        LoadFragA(a, qs, ld, ks * 16);
        LoadFragBT(b, brow, ld, ks * 16);
        MmaBf16(c, a, b);
      }
      float* dst = sc + kh * kMlaRows * kMlaTile;
      const int col = stile * 8 + 2 * t4;
      dst[g * kMlaTile + col] = c[0];
      dst[g * kMlaTile + col + 1] = c[1];
      dst[(g + 8) * kMlaTile + col] = c[2];
      dst[(g + 8) * kMlaTile + col + 1] = c[3];
    }
    __syncthreads();

    // Online softmax: warp w rows 2w and 2w + 1, lane = position in the tile.
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      const int r = warp * 2 + rr;
      float s = (sc[r * kMlaTile + lane] + sc[(kMlaRows + r) * kMlaTile + lane]) * p.scale;
      if (tile_begin + lane >= lim_s[r]) s = -INFINITY;
      const float m_old = m_s[r];
      const float m_new = fmaxf(m_old, WarpMax(s));
      float pr = 0.0f, alpha = 1.0f;  // nothing visible yet: no weight, nothing to rescale
      if (m_new != -INFINITY) {
        pr = __expf(s - m_new);
        alpha = __expf(m_old - m_new);
      }
      const float sum = WarpSum(pr);
      pb[r * kPLd + lane] = __float2bfloat16(pr);
      if (lane == 0) {
        m_s[r] = m_new;
        l_s[r] = l_s[r] * alpha + sum;
        a_s[r] = alpha;
      }
    }
    __syncthreads();

    {  // o += P . tile[:, :dv] for this warp's columns.
      const float al0 = a_s[g], al1 = a_s[g + 8];
#pragma unroll
      for (int i = 0; i < kMaxColTiles; ++i) {
        acc[i][0] *= al0;
        acc[i][1] *= al0;
        acc[i][2] *= al1;
        acc[i][3] *= al1;
      }
#pragma unroll
      for (int k0 = 0; k0 < kMlaTile; k0 += 16) {
        uint32_t a[4];
        LoadFragA(a, pb, kPLd, k0);
#pragma unroll
        for (int i = 0; i < kMaxColTiles; ++i) {
          if (i < col_tiles) {  // uniform over the warp
            uint32_t b[2];
            LoadFragB(b, tile, ld, k0, col0 + i * 8);
            MmaBf16(acc[i], a, b);
          }
        }
      }
    }
  }
  __syncthreads();  // the row state of the last tile (or of the prologue, with no tile)

  const int ra = row0 + g, rb = row0 + g + 8;
  const float la = l_s[g], lb = l_s[g + 8];
  const float inva = la > 0.0f ? 1.0f / la : 0.0f, invb = lb > 0.0f ? 1.0f / lb : 0.0f;
  if (p.splits == 1) {
    B* o = static_cast<B*>(p.o) + static_cast<int64_t>(blk.n) * p.rows * p.dv;
#pragma unroll
    for (int i = 0; i < kMaxColTiles; ++i) {
      if (i >= col_tiles) continue;
      const int col = col0 + i * 8 + 2 * t4;
      if (ra < p.rows) {
        *reinterpret_cast<__nv_bfloat162*>(o + static_cast<int64_t>(ra) * p.dv + col) =
            __floats2bfloat162_rn(acc[i][0] * inva, acc[i][1] * inva);
      }
      if (rb < p.rows) {
        *reinterpret_cast<__nv_bfloat162*>(o + static_cast<int64_t>(rb) * p.dv + col) =
            __floats2bfloat162_rn(acc[i][2] * invb, acc[i][3] * invb);
      }
    }
    if (tid < kMlaRows && row0 + tid < p.rows) {
      p.lse[static_cast<int64_t>(blk.n) * p.rows + row0 + tid] =
          l_s[tid] > 0.0f ? m_s[tid] + logf(l_s[tid]) : -INFINITY;
    }
  } else {
    const int64_t base = (static_cast<int64_t>(blk.n) * p.splits + blk.s) * p.rows;
    float* po = p.part_o + base * p.dv;
#pragma unroll
    for (int i = 0; i < kMaxColTiles; ++i) {
      if (i >= col_tiles) continue;
      const int col = col0 + i * 8 + 2 * t4;
      if (ra < p.rows) {
        *reinterpret_cast<float2*>(po + static_cast<int64_t>(ra) * p.dv + col) =
            make_float2(acc[i][0] * inva, acc[i][1] * inva);
      }
      if (rb < p.rows) {
        *reinterpret_cast<float2*>(po + static_cast<int64_t>(rb) * p.dv + col) =
            make_float2(acc[i][2] * invb, acc[i][3] * invb);
      }
    }
    if (tid < kMlaRows && row0 + tid < p.rows) {
      p.part_lse[base + row0 + tid] = l_s[tid] > 0.0f ? m_s[tid] + logf(l_s[tid]) : -INFINITY;
    }
  }
}

Status PrepareTc(const MlaDecodeProblem& p) {
  return CudaStatus(
      cudaFuncSetAttribute(MlaDecodeTcKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(TcSmemBytes(p.d))),
      "cudaFuncSetAttribute(MlaDecodeTcKernel)");
}

}  // namespace

bool MlaDecodeTcSupports(const MlaDecodeProblem& p, bool bf16) {
  const auto aligned = [](const void* x, int bytes) {
    return reinterpret_cast<uintptr_t>(x) % bytes == 0;
  };
  return bf16 && p.d % 16 == 0 && p.d <= kMlaTcMaxWidth && p.dv % 64 == 0 &&
         p.dv <= 8 * 8 * kMaxColTiles && aligned(p.q, 16) && aligned(p.pages, 16) &&
         aligned(p.o, 4);
}

StatusOr<int> MlaDecodeTcBlocksPerSm(const MlaDecodeProblem& p) {
  ORRERY_RETURN_IF_ERROR(PrepareTc(p));
  int blocks = 0;
  ORRERY_RETURN_IF_ERROR(
      CudaStatus(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, MlaDecodeTcKernel,
                                                               kMlaThreads, TcSmemBytes(p.d)),
                 "cudaOccupancyMaxActiveBlocksPerMultiprocessor(MlaDecodeTcKernel)"));
  return std::max(blocks, 1);
}

Status LaunchMlaDecodeTc(const MlaDecodeProblem& p, cudaStream_t stream) {
  ORRERY_RETURN_IF_ERROR(PrepareTc(p));
  const int64_t blocks = static_cast<int64_t>(p.n) * p.splits * p.groups;
  MlaDecodeTcKernel<<<static_cast<unsigned>(blocks), kMlaThreads, TcSmemBytes(p.d), stream>>>(p);
  return LastLaunchStatus("MlaDecodeTcKernel");
}

Status MlaDecodePagedCuda(const Tensor& q, const PagedLatentCache& cache, int64_t dv, float scale,
                          int splits, Tensor* o, Tensor* lse) {
  ORRERY_ASSIGN_OR_RETURN(DeviceContext * ctx, DeviceContext::Get(q.device().index));
  MlaDecodeProblem p;
  p.q = q.raw_data();
  p.pages = cache.pages.raw_data();
  p.block_table = static_cast<const int32_t*>(cache.block_table.raw_data());
  p.context_lens = static_cast<const int32_t*>(cache.context_lens.raw_data());
  p.n = static_cast<int>(q.dim(0));
  p.nq = static_cast<int>(q.dim(1));
  p.heads = static_cast<int>(q.dim(2));
  p.d = static_cast<int>(q.dim(3));
  p.dv = static_cast<int>(dv);
  p.page_size = static_cast<int>(cache.pages.dim(1));
  p.max_pages = static_cast<int>(cache.block_table.dim(1));
  p.rows = p.nq * p.heads;
  p.groups = (p.rows + kMlaRows - 1) / kMlaRows;
  p.scale = scale;
  p.o = o->raw_data();
  p.lse = static_cast<float*>(lse->raw_data());
  const bool bf16 = q.dtype() == DType::kBF16;
  const bool tc = MlaDecodeTcSupports(p, bf16);
  if (splits <= 0) {
    // Enough splits that the blocks fill every SM once (the split kernels are one wave), none
    // shorter than kMinSplitPositions of the capacity the block table gives a sequence.
    int sms = 132;
    ORRERY_RETURN_IF_ERROR(
        CudaStatus(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ctx->index()),
                   "cudaDeviceGetAttribute(MultiProcessorCount)"));
    int per_sm = 1;
    if (tc) {
      ORRERY_ASSIGN_OR_RETURN(per_sm, MlaDecodeTcBlocksPerSm(p));
    } else {
      ORRERY_ASSIGN_OR_RETURN(per_sm, MlaDecodeSimtBlocksPerSm(p, bf16));
    }
    const int64_t base = static_cast<int64_t>(p.n) * p.groups;
    const int64_t target = static_cast<int64_t>(sms) * per_sm;
    const int64_t capacity = static_cast<int64_t>(p.max_pages) * p.page_size;
    int64_t k = base >= target ? 1 : target / base;
    k = std::min(k, std::max<int64_t>(1, capacity / kMinSplitPositions));
    splits = static_cast<int>(std::min<int64_t>(k, kMaxMlaDecodeSplits));
  }
  p.splits = std::min(splits, kMaxMlaDecodeSplits);
  if (static_cast<int64_t>(p.n) * p.splits * p.groups > INT_MAX) {
    return InvalidArgumentError("mla_decode: " + q.ToString() + " with " +
                                std::to_string(p.splits) +
                                " splits needs more blocks than a grid holds");
  }
  Tensor part_o, part_lse;
  if (p.splits > 1) {
    ORRERY_ASSIGN_OR_RETURN(
        part_o, Tensor::Allocate({q.dim(0), p.splits, p.rows, dv}, DType::kF32, q.device()));
    ORRERY_ASSIGN_OR_RETURN(
        part_lse, Tensor::Allocate({q.dim(0), p.splits, p.rows}, DType::kF32, q.device()));
    p.part_o = static_cast<float*>(part_o.raw_data());
    p.part_lse = static_cast<float*>(part_lse.raw_data());
  }
  if (tc) {
    ORRERY_RETURN_IF_ERROR(LaunchMlaDecodeTc(p, ctx->stream()));
  } else {
    ORRERY_RETURN_IF_ERROR(LaunchMlaDecodeSimt(p, bf16, ctx->stream()));
  }
  if (p.splits > 1) ORRERY_RETURN_IF_ERROR(LaunchMlaDecodeMerge(p, bf16, ctx->stream()));
  return Status::OK();
}

}  // namespace orrery::kernels::cuda
