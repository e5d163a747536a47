// Grouped GEMMs over rows grouped by expert (the MoE experts' products, kernels/moe.h): rows
// [offsets[e], offsets[e + 1]) of the row-major operands belong to expert e, whose matrix is
// W[e] of a stacked W [E, N, K]. One launch covers every expert; the offsets stay on the device
// (the tile schedule is found on the device from them, nothing is read back to the host).
//
//   GroupedGemmForward:    Y[r]  = X[r] W_e^T         X [M, K], W [E, N, K] -> Y [M, N]
//   GroupedGemmInputGrad:  dX[r] (+)= dY[r] W_e       dY [M, N], W [E, N, K] -> dX [M, K]
//   GroupedGemmWeightGrad: dW_e += dY[rows_e]^T X[rows_e]   dY [M, N], X [M, K] -> dW [E, N, K]
//
// offsets: i32 or i64 [E + 1] on the operands' device, non-decreasing from offsets[0] >= 0 to
// offsets[E] <= M (as MoePermute writes them; rows past offsets[E] belong to no expert and are
// left alone). E >= 1; an expert may own no rows. The offsets are not checked on the device's
// values (that would need a read back); values outside [0, M] are clamped there, so bad offsets
// give wrong sums, never a read or write outside the tensors.
//
// Devices and dtypes:
//   cpu (the twin, f64 sums): X, W, dY, Y, dX, dW all f32 or all f64 (one dtype per call).
//   cuda (tensor cores, bf16 x bf16 -> f32 sums): X, W, dY bf16; Y bf16 or f32; dX f32 or bf16;
//       dW f32. K and N must be multiples of 8 (GroupedGemmSupports); every tensor's data
//       16-byte aligned (any Allocate'd tensor and its row views at such rows are).
// Kernels on cuda: the wgmma/TMA kernel (kernels/cuda/grouped_gemm_wgmma.cu) on compute
// capability 9.0 devices, the mma.sync kernel (kernels/cuda/grouped_gemm.cu) elsewhere; the
// environment variable ORRERY_GROUPED_GEMM=mma or =wgmma forces one, =wgmma128 or =wgmma256 also
// the wgmma kernel's tile width (else its choice) (read at each call, so a benchmark or test can
// run them all in one process; wgmma where it cannot run is an InvalidArgument, and any value
// other than those, auto or empty too).
// Outputs: Y is overwritten (allocated when undefined); dX is overwritten, or with accumulate
// added to (then it must be defined); dW is accumulated (allocated zeroed when undefined). Rows of
// Y and dX outside [offsets[0], offsets[E]) are not written.
#pragma once

#include <cstdint>

#include "core/status.h"
#include "core/tensor.h"
#include "kernels/situ.h"

namespace orrery::kernels {

// The multiple of K and N the CUDA kernels need: rows are copied in 16-byte pieces of 8 bf16
// (partial tiles and K-steps are zero-filled piece by piece).
inline constexpr int64_t kGroupedGemmDimMultiple = 8;

// Whether the CUDA kernels take these sizes (K, N multiples of kGroupedGemmDimMultiple, both
// positive). Callers with other shapes use a per-expert loop instead.
bool GroupedGemmSupports(int64_t n, int64_t k);

Status GroupedGemmForward(const Tensor& x, const Tensor& w, const Tensor& offsets, Tensor* y);

Status GroupedGemmInputGrad(const Tensor& dy, const Tensor& w, const Tensor& offsets,
                            bool accumulate, Tensor* dx);

Status GroupedGemmWeightGrad(const Tensor& dy, const Tensor& x, const Tensor& offsets, Tensor* dw);

// The experts' gate/up product with the gated activation (kernels/situ.h, spec §5.3) fused in
// its epilogue: for the rows r of expert e,
//   a[r] = X[r] W1_e^T,  u[r] = X[r] W3_e^T,  h[r] = act(a[r], u[r])
//   X [M, K], W1 and W3 [E, F, K] -> h [M, F]; a, u [M, F] when asked for (both or neither: the
//   pre-activations GluGrad needs).
// cpu: the twin (f64 sums rounded to the operands' dtype, then GluForward). cuda: the fused wgmma
// kernel only, where GroupedGemmGluFused says so (a compute capability 9.0 device, not forced to
// mma); elsewhere InvalidArgument, and callers compose GroupedGemmForward and Glu instead. h, a,
// u: one dtype (on cuda bf16 or f32), allocated when undefined; rows outside the experts' are not
// written.
Status GroupedGemmGlu(const GluActivation& act, const Tensor& x, const Tensor& w1, const Tensor& w3,
                      const Tensor& offsets, Tensor* h, Tensor* a = nullptr, Tensor* u = nullptr);

// Whether GroupedGemmGlu runs on `device` (cpu: always; cuda: see above).
bool GroupedGemmGluFused(Device device);

}  // namespace orrery::kernels
