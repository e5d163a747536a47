// Gated MLA's per-head keys and values from the latent up-projection (spec §3.1), as
// Tensor-level ops of the GPU model, with a CPU twin:
//
//   kv [N, H, dn + dv]  = W_kvb c-hat, each head's k_nope (dn) then its v (dv)
//   kr [N, dr]          = the one unrotated rope-slot key, shared by every head
//   k  [N, H, dn + dr]  = [kv[:, h, :dn] | kr],   v [N, H, dv] = kv[:, h, dn:]
//
// The backward scatters dk and dv back: dkv[:, h] = [dk[:, h, :dn] | dv[:, h]] and, because kr is
// shared, dkr = sum_h dk[:, h, dn:] (summed in f32 on CUDA, in the dtype on CPU).
//
// CPU: f32 or f64. CUDA: bf16 or f32. All tensors of one dtype on one device; outputs are
// allocated when undefined and overwritten.
#pragma once

#include <cstdint>

#include "core/status.h"
#include "core/tensor.h"

namespace orrery::kernels {

Status MlaKeysValues(const Tensor& kv, const Tensor& kr, int64_t nope_dim, Tensor* k, Tensor* v);
Status MlaKeysValuesGrad(const Tensor& dk, const Tensor& dv, int64_t nope_dim, Tensor* dkv,
                         Tensor* dkr);

}  // namespace orrery::kernels
