// The KDA layer's core op on the device its config names ([model.kda] device): the one place the
// model moves KDA tensors to the GPU and back.
//
// Inputs and outputs are host tensors in the model's dtype, laid out as kernels/kda.h says. With
// KdaDevice::kCpu the calls go straight to kernels::KdaForward / KdaBackward. With kCuda (f32 host
// tensors only) q, k, v, beta and d_o are cast to bf16 on the host when K and V are both 64 or 128
// (the tensor-core kernels, KdaTcSupported) and kept f32 otherwise (the SIMT kernels); g and the
// states stay f32 (g is summed over a chunk, where bf16 rounding would compound). They are moved
// to CUDA device 0, the op runs there, and every output and gradient comes back to the host cast
// to the inputs' dtype. cu_seqlens stays on the host (the op validates it there).
//
// No GPU visible (or a build without the CUDA kernels) is a FailedPrecondition naming the config
// key, not a crash.
#pragma once

#include "core/status.h"
#include "core/tensor.h"
#include "kernels/kda.h"
#include "model/config.h"

namespace orrery::model {

Status KdaCoreForward(KdaDevice device, const kernels::KdaInputs& in,
                      const kernels::KdaOptions& options, kernels::KdaOutputs* out);

Status KdaCoreBackward(KdaDevice device, const kernels::KdaInputs& in, const Tensor& d_o,
                       const Tensor& d_final_state, const kernels::KdaOptions& options,
                       kernels::KdaGrads* grads);

}  // namespace orrery::model
