// Gated MLP activations h = act(a) * up(u) (spec §5.3), generic over float and double.
//
//   SiTU-GLU (K3): h = [beta * tanh(a/beta) * sigmoid(a)] * [beta_lin * tanh(u/beta_lin)]
//                  (beta_lin <= 0: no cap on the up branch). |h| < beta * beta_lin.
//   SiLU-GLU (SwiGLU, Kimi Linear): h = a * sigmoid(a) * u.
#pragma once

#include <cstdint>

#include "core/status.h"
#include "core/tensor.h"

namespace orrery::kernels {

struct GluActivation {
  bool situ = true;
  double beta = 4.0;
  double beta_lin = 25.0;
};

// a, u, h [n]; h may not alias a or u (the backward needs them).
template <typename T>
void GluForward(const GluActivation& act, const T* a, const T* u, int64_t n, T* h);

// da, du [n] are overwritten from the saved a, u and the upstream dh.
template <typename T>
void GluBackward(const GluActivation& act, const T* a, const T* u, const T* dh, int64_t n, T* da,
                 T* du);

// Tensor-level forms, dispatched by device: a, u, dh of one shape and dtype (f32 or f64 on cpu,
// bf16 or f32 on cuda); outputs in that dtype, allocated when undefined.
Status Glu(const GluActivation& act, const Tensor& a, const Tensor& u, Tensor* h);
Status GluGrad(const GluActivation& act, const Tensor& a, const Tensor& u, const Tensor& dh,
               Tensor* da, Tensor* du);

}  // namespace orrery::kernels
