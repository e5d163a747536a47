// CUDA implementations of the KDA op (sm_90a), behind kernels/kda.h.
//
// Internal to kernels/: inputs are validated by kernels/kda.cc. q, k, v, beta are f32 or bf16,
// g is f32 or their dtype; states are f32. Work runs on the default stream and the calls return
// after the kernels are queued (errors of the launch itself are reported).
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "kernels/kda.h"
#include "kernels/kda_problem.h"

namespace orrery::kernels::cuda {

struct KdaTcSaved;

// `keep` (may be null) receives the tensor-core forward's intermediates when that path runs;
// `kept` (may be null) is such a record for these inputs, so the backward skips its recompute.
// `fused` (may be null; tensor-core path only): `in` holds raw inputs and the prep kernel applies
// these transforms as it loads each chunk.
Status KdaForwardCuda(const KdaProblem& p, const KdaInputs& in, bool output_final_state,
                      KdaOutputs* out, KdaTcSaved* keep, const KdaInputTransforms* fused);
// `fused` (may be null; tensor-core path only): `in` holds raw inputs, the chunk kernels apply
// these transforms as they load and return the raw inputs' gradients (with da_log / ddt_bias).
Status KdaBackwardCuda(const KdaProblem& p, const KdaInputs& in, const Tensor& d_o,
                       const Tensor& d_final_state, KdaGrads* grads, const KdaTcSaved* kept,
                       const KdaInputTransforms* fused);
Status KdaDecodeStepCuda(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                         const Tensor& beta, float scale, Tensor* state, Tensor* o);

// KdaInputTransforms on the GPU (kda_input_transforms.cu; kernels/kda_transforms.h): one
// elementwise pass forms the recurrence's inputs (*out starts as a copy of raw; q, k, beta keep
// their dtype, g becomes f32) and the L2 norms' reciprocals; one pass after the backward turns the
// gradients w.r.t. them into gradients w.r.t. raw (da_log / ddt_bias summed in f32 per block, the
// blocks' sums added in a fixed order by LaunchColumnSums: the same bits on every run).
Status KdaTransformInputsCuda(const KdaProblem& p, const KdaInputs& raw,
                              const KdaInputTransforms& t, KdaInputs* out, Tensor* q_rstd,
                              Tensor* k_rstd);
Status KdaChainTransformsCuda(const KdaProblem& p, const KdaInputs& raw,
                              const KdaInputs& transformed, const Tensor& q_rstd,
                              const Tensor& k_rstd, const KdaInputTransforms& t, KdaGrads* grads);
// grads->da_log / ddt_bias for the gate parameters `raw` holds (f32 on dev, zeroed: the
// backward's fixed-order sums add into them); those not given stay undefined.
Status AllocateGateParamGrads(const KdaInputs& raw, Device dev, KdaGrads* grads);

// Shared by the forward and the backward (kda_forward.cu, kda_backward.cu).

// K <= 128 and an f32 initial state; one clear line otherwise.
Status CheckCudaKdaSupported(const KdaProblem& p, const KdaInputs& in);

// What the backward's forward sweep keeps (device pointers, all null for a plain forward).
struct KdaForwardSweep {
  const int64_t* chunk_first = nullptr;  // [N + 1]: sequence n owns chunks [first[n], first[n+1])
  float* chunk_states = nullptr;  // [chunks, H, K, V]: the state at each 16-token chunk start
  float* vnew = nullptr;          // [rows, H, V]: the pseudo-values U - W S
};

// Queues the chunked forward kernel (16-token chunks) on the default stream. seq_start is the
// device copy of p.seq_start; out->o and out->final_state may be undefined (not written).
Status LaunchKdaForward(const KdaProblem& p, const KdaInputs& in, const int64_t* seq_start,
                        KdaOutputs* out, const KdaForwardSweep& sweep);

// The tensor-core forward (kda_forward_tc.cu): 64-token chunks prepared all at once on bf16 MMAs,
// then a state pass per (segment, head, 64-wide V slice). KdaForwardCuda takes it whenever
// KdaTcSupported; the SIMT kernel above serves f32 inputs (reference-grade fp32 arithmetic) and
// other K, V.
struct KdaTcTuning {
  // Segments each sequence's chunks are split into for the state pass (spec §2.5); 0 = chosen
  // from the number of blocks the unsplit pass would have against the multiprocessor count.
  int segments_per_sequence = 0;
  // Benchmarks only: run the chunk preparation (stage 1) and skip the state pass, to time the
  // stages apart (o and final_state are left unwritten).
  bool prep_only = false;
  // Benchmarks only: the backward stops after this many of its stages (1: the forward
  // recompute, 2: + the reverse state pass); 0 runs all three (+ the chunk kernel).
  int backward_stages = 0;
};

// bf16 q, k, v, beta (g f32 or bf16), K and V each 64 or 128, q/k/v/g bases 16-byte aligned.
bool KdaTcSupported(const KdaProblem& p, const KdaInputs& in);

// What the tensor-core forward keeps for the tensor-core backward (bf16 unless noted; chunks
// are 64 tokens, every chunk padded to 64 rows; layouts [chunks, H, ...]).
struct KdaTcSaved {
  Tensor chunk_table;                    // [chunks * 2] i64: (first flattened row, valid rows)
  std::vector<int64_t> seq_chunk_first;  // host [N + 1]: sequence n owns chunks [first[n], ..)
  int64_t chunks = 0, max_chunks = 0;    // all chunks; the most in one sequence
  Tensor w, qg, kbar_t, aqk;             // W, s Q e^G [64, K]; Kbar^T [K, 64]; A_qk [64, 64]
  Tensor gamma;                          // [K] f32: e^{G_C}
  Tensor tinv;                           // [64, 64]: T = (I + A_kk)^-1
  Tensor h;                              // [V, K]: the state at the chunk start, transposed
  Tensor vnew;                           // [V, 64]: (U - W S)^T
  // The state pass's segments per sequence (KdaTcSegmentsPerSequence) and, when that is more
  // than 1, its first pass's record [segments, H, K, V + K] f32: S_ext | the transition M_j of
  // every segment of a sequence split in more than one (the last one's kept for the backward,
  // which chains its segments through their transposes).
  int64_t segments_per_sequence = 1;
  Tensor transitions;
};

// out->o may be undefined (not written; the backward's recompute), else allocated ([B, T, H, V]
// bf16); out->final_state may be undefined. With `saved`, the intermediates above are kept
// there. Returns once the kernels are queued: its scratch goes back to the block cache, and
// whatever takes it next is queued after them on the same stream.
// With `fused`, `in` holds the raw inputs of those transforms (and in.a_log / in.dt_bias), which
// the prep kernel applies as each chunk loads (no separate pass).
Status LaunchKdaForwardTc(const KdaProblem& p, const KdaInputs& in, const KdaTcTuning& tuning,
                          KdaOutputs* out, KdaTcSaved* saved = nullptr,
                          const KdaInputTransforms* fused = nullptr);

// The tensor-core backward (kda_backward_tc.cu), for KdaTcSupported problems: the forward above
// with `saved`, a reverse state pass for dS (per segment, head and 64-wide V slice; the segment
// split of the forward, chained through the transposed transitions), then one chunk-parallel
// kernel for the intra-chunk gradient products. With `kept` (from LaunchKdaForwardTc on these
// inputs, with the same `fused`) the forward is not run again. With `fused`, `in` holds raw
// inputs as for LaunchKdaForwardTc and the gradients are the raw inputs' (da_log / ddt_bias
// summed per (chunk, head), then over the chunks in a fixed order). Allocates every gradient;
// returns once the kernels are queued, as the forward does.
Status LaunchKdaBackwardTc(const KdaProblem& p, const KdaInputs& in, const Tensor& d_o,
                           const Tensor& d_final_state, const KdaTcTuning& tuning, KdaGrads* grads,
                           const KdaTcSaved* kept = nullptr,
                           const KdaInputTransforms* fused = nullptr);

// Segments per sequence for a state pass of `blocks` blocks (sequences x heads x V slices)
// over sequences of at most `max_chunks` chunks: tuning.segments_per_sequence, or chosen
// against the multiprocessor count when that is 0.
int64_t KdaTcSegmentsPerSequence(const KdaTcTuning& tuning, int64_t blocks, int64_t max_chunks);

// Chains the segments of each sequence (fp32): for j in [first[n], first[n + 1]),
// seg_start[j] = s, then s <- M_j s + S_ext,j, with s starting at init[n] (zeros when init is
// null). Layouts [segments or N, H, K, ...] with the row strides given.
struct SegmentCombineArgs {
  const int64_t* seq_segment_first = nullptr;  // device [N + 1]
  const float* ext = nullptr;                  // S_ext,j in the first V columns of [K, ext_ld]
  const float* trans = nullptr;                // M_j in the first K columns of [K, trans_ld]
  const float* init = nullptr;                 // [N, H, K, V] or null
  float* seg_start = nullptr;                  // [segments, H, K, V]
  int64_t ext_ld = 0, trans_ld = 0;
  // The backward's chain: its segments are listed last in time first, and trans is the
  // forward's record (first in time first), whose transposes are the backward's transitions:
  // M_j = trans[first[n] + first[n + 1] - 1 - j]^T.
  bool backward = false;
};
Status LaunchKdaSegmentCombine(int64_t kd, int64_t vd, int64_t n_seq, int64_t heads,
                               const SegmentCombineArgs& args);

}  // namespace orrery::kernels::cuda
