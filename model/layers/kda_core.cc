#include "model/layers/kda_core.h"

#include <string>

#include "core/device.h"

namespace orrery::model {
namespace {

bool TensorCoreShape(const kernels::KdaInputs& in) {
  const int64_t kd = in.q.dim(in.q.ndim() - 1), vd = in.v.dim(in.v.ndim() - 1);
  return (kd == 64 || kd == 128) && (vd == 64 || vd == 128);
}

// The checks before anything moves: a GPU is there and the host tensors are f32.
Status CheckCuda(const kernels::KdaInputs& in) {
  if (!CudaCompiledIn() || CudaDeviceCount() == 0) {
    return FailedPreconditionError(
        "[model.kda] device = \"cuda\": no CUDA device is visible to this process" +
        std::string(CudaCompiledIn() ? "" : " (this build has no CUDA support)"));
  }
  for (const Tensor* t : {&in.q, &in.k, &in.v, &in.g, &in.beta}) {
    if (!t->defined() || !t->device().is_cpu() || t->dtype() != DType::kF32) {
      return InvalidArgumentError(
          "[model.kda] device = \"cuda\": the KDA core takes f32 host "
          "tensors, got " +
          (t->defined() ? t->ToString() : std::string("a missing input")));
    }
  }
  return Status::OK();
}

// Host f32 -> `dtype` on CUDA device 0 (undefined stays undefined).
StatusOr<Tensor> Upload(const Tensor& t, DType dtype) {
  if (!t.defined()) return Tensor();
  if (t.dtype() == dtype) return t.To(Device::Cuda(0));
  ORRERY_ASSIGN_OR_RETURN(Tensor cast, t.Cast(dtype));
  return cast.To(Device::Cuda(0));
}

// Device tensor -> host `dtype` (undefined stays undefined).
StatusOr<Tensor> Download(const Tensor& t, DType dtype) {
  if (!t.defined()) return Tensor();
  ORRERY_ASSIGN_OR_RETURN(Tensor host, t.To(Device::Cpu()));
  if (host.dtype() == dtype) return host;
  return host.Cast(dtype);
}

// The device copies of the inputs, and the dtype q, k, v, beta (and d_o) travel in.
struct DeviceInputs {
  kernels::KdaInputs in;
  DType wire = DType::kF32;
};

StatusOr<DeviceInputs> UploadInputs(const kernels::KdaInputs& in) {
  ORRERY_RETURN_IF_ERROR(CheckCuda(in));
  DeviceInputs d;
  d.wire = TensorCoreShape(in) ? DType::kBF16 : DType::kF32;
  ORRERY_ASSIGN_OR_RETURN(d.in.q, Upload(in.q, d.wire));
  ORRERY_ASSIGN_OR_RETURN(d.in.k, Upload(in.k, d.wire));
  ORRERY_ASSIGN_OR_RETURN(d.in.v, Upload(in.v, d.wire));
  ORRERY_ASSIGN_OR_RETURN(d.in.beta, Upload(in.beta, d.wire));
  ORRERY_ASSIGN_OR_RETURN(d.in.g, Upload(in.g, DType::kF32));
  ORRERY_ASSIGN_OR_RETURN(d.in.initial_state, Upload(in.initial_state, DType::kF32));
  d.in.cu_seqlens = in.cu_seqlens;
  return d;
}

}  // namespace

Status KdaCoreForward(KdaDevice device, const kernels::KdaInputs& in,
                      const kernels::KdaOptions& options, kernels::KdaOutputs* out) {
  if (device == KdaDevice::kCpu) return kernels::KdaForward(in, options, out);
  ORRERY_ASSIGN_OR_RETURN(DeviceInputs d, UploadInputs(in));
  kernels::KdaOutputs dev;
  ORRERY_RETURN_IF_ERROR(kernels::KdaForward(d.in, options, &dev));
  ORRERY_ASSIGN_OR_RETURN(out->o, Download(dev.o, in.v.dtype()));
  ORRERY_ASSIGN_OR_RETURN(out->final_state, Download(dev.final_state, DType::kF32));
  return Status::OK();
}

Status KdaCoreBackward(KdaDevice device, const kernels::KdaInputs& in, const Tensor& d_o,
                       const Tensor& d_final_state, const kernels::KdaOptions& options,
                       kernels::KdaGrads* grads) {
  if (device == KdaDevice::kCpu) {
    return kernels::KdaBackward(in, d_o, d_final_state, options, grads);
  }
  ORRERY_ASSIGN_OR_RETURN(DeviceInputs d, UploadInputs(in));
  ORRERY_ASSIGN_OR_RETURN(Tensor d_o_dev, Upload(d_o, d.wire));
  ORRERY_ASSIGN_OR_RETURN(Tensor d_final_dev, Upload(d_final_state, DType::kF32));
  kernels::KdaGrads dev;
  ORRERY_RETURN_IF_ERROR(kernels::KdaBackward(d.in, d_o_dev, d_final_dev, options, &dev));
  const std::pair<Tensor*, const Tensor*> back[] = {{&grads->dq, &dev.dq},
                                                    {&grads->dk, &dev.dk},
                                                    {&grads->dv, &dev.dv},
                                                    {&grads->dg, &dev.dg},
                                                    {&grads->dbeta, &dev.dbeta}};
  for (const auto& [host, got] : back) {
    ORRERY_ASSIGN_OR_RETURN(*host, Download(*got, in.q.dtype()));
  }
  ORRERY_ASSIGN_OR_RETURN(grads->dinitial_state, Download(dev.dinitial_state, DType::kF32));
  return Status::OK();
}

}  // namespace orrery::model
