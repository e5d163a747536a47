// The gated activations of kernels/situ.h for one element, in f32 with the CPU twin's formulas
// (precise expf/tanhf: SiTU's caps bound |h| by beta beta_lin exactly). Shared by the element-wise
// GLU kernels (glu.cu) and the grouped GEMM's fused GLU epilogue (grouped_gemm_wgmma.cu), so the
// fused and unfused forms compute the same function.
#pragma once

#include <cuda_runtime.h>

namespace orrery::kernels::cuda {

struct GluParams {
  bool situ;  // SiTU-GLU; false: SiLU-GLU (SwiGLU)
  float beta, beta_lin;
};

__device__ __forceinline__ float Sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// h = act(a) up(u): SiTU [beta tanh(a / beta) sigmoid(a)] [beta_lin tanh(u / beta_lin)] (no cap on
// u when beta_lin <= 0), or SiLU a sigmoid(a) u.
__device__ __forceinline__ float GluValue(const GluParams& p, float a, float u) {
  const float s = Sigmoid(a);
  if (!p.situ) return a * s * u;
  const float gate = p.beta * tanhf(a / p.beta) * s;
  const float up = p.beta_lin > 0 ? p.beta_lin * tanhf(u / p.beta_lin) : u;
  return gate * up;
}

}  // namespace orrery::kernels::cuda
