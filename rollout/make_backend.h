// The PolicyBackend a job's [run] device asks for: the host model itself on the CPU
// (ModelBackend), or its upload to CUDA device 0 (GpuModelBackend, in `dtype`).
#pragma once

#include <cstdint>
#include <memory>

#include "core/run_config.h"
#include "core/status.h"
#include "model/model.h"
#include "rollout/policy_backend.h"

namespace orrery::rollout {

// `model` must outlive the backend (the CPU backend uses it in place). Without a visible CUDA
// device a cuda backend fails with one FailedPrecondition line.
StatusOr<std::unique_ptr<PolicyBackend>> MakePolicyBackend(model::Model* model, RunDevice device,
                                                           DType dtype, int max_slots,
                                                           int64_t max_context);

}  // namespace orrery::rollout
