#include "rollout/make_backend.h"

#include "rollout/gpu_model_backend.h"
#include "rollout/model_backend.h"

namespace orrery::rollout {

StatusOr<std::unique_ptr<PolicyBackend>> MakePolicyBackend(model::Model* model, RunDevice device,
                                                           DType dtype, int max_slots,
                                                           int64_t max_context) {
  if (device == RunDevice::kCpu) {
    ORRERY_ASSIGN_OR_RETURN(std::unique_ptr<ModelBackend> b,
                            ModelBackend::Create(model, max_slots, max_context));
    return std::unique_ptr<PolicyBackend>(std::move(b));
  }
  GpuBackendOptions o;
  o.model.device = Device::Cuda(0);
  o.model.compute_dtype = dtype;
  o.max_slots = max_slots;
  o.max_context = max_context;
  ORRERY_ASSIGN_OR_RETURN(std::unique_ptr<GpuModelBackend> b, GpuModelBackend::Create(*model, o));
  return std::unique_ptr<PolicyBackend>(std::move(b));
}

}  // namespace orrery::rollout
