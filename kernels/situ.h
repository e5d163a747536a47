// Gated MLP activations h = act(a) * up(u) (spec §5.3), generic over float and double.
//
//   SiTU-GLU (K3): h = [beta * tanh(a/beta) * sigmoid(a)] * [beta_lin * tanh(u/beta_lin)]
//                  (beta_lin <= 0: no cap on the up branch). |h| < beta * beta_lin.
//   SiLU-GLU (SwiGLU, Kimi Linear): h = a * sigmoid(a) * u.
#pragma once

#include <cstdint>

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

}  // namespace orrery::kernels
