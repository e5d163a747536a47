// AttnResMix / AttnResMixGrad: checks, then the CPU templates (kernels/cpu/attn_res.cc) or CUDA.
#include <string>
#include <vector>

#include "kernels/attn_res.h"
#include "kernels/elementwise_check.h"
#include "kernels/phase_profile.h"
#if defined(ORRERY_KERNELS_CUDA)
#include "kernels/cuda/ops_cuda.h"
#endif

namespace orrery::kernels {
namespace {

constexpr const char* kOp = "attn_res";

std::string Indexed(const char* name, size_t i) {
  return std::string(name) + "[" + std::to_string(i) + "]";
}

// sources: n >= 1 of one shape [rows, d], dtype and device; w, gamma [d] like them.
Status CheckInputs(const std::vector<Tensor>& sources, const Tensor& w, const Tensor& gamma) {
  if (sources.empty()) return InvalidArgumentError(std::string(kOp) + ": no sources");
  const Tensor& s0 = sources[0];
  if (!s0.defined() || s0.ndim() != 2) {
    return InvalidArgumentError(std::string(kOp) + ": sources[0] " +
                                (s0.defined() ? s0.ToString() : "undefined") + ", expected 2-D");
  }
  const bool cpu = s0.device().is_cpu();
  const DType dt = s0.dtype();
  if (cpu ? (dt != DType::kF32 && dt != DType::kF64) : (dt != DType::kF32 && dt != DType::kBF16)) {
    return InvalidArgumentError(
        std::string(kOp) + ": sources[0] " + s0.ToString() +
        (cpu ? ", expected f32 or f64 on cpu" : ", expected bf16 or f32 on cuda"));
  }
#if defined(ORRERY_KERNELS_CUDA)
  if (!cpu && sources.size() > static_cast<size_t>(cuda::kAttnResMaxSourcesCuda)) {
    return InvalidArgumentError(std::string(kOp) + ": " + std::to_string(sources.size()) +
                                " sources, at most " +
                                std::to_string(cuda::kAttnResMaxSourcesCuda) + " on cuda");
  }
#endif
  for (size_t i = 1; i < sources.size(); ++i) {
    ORRERY_RETURN_IF_ERROR(ExpectLike(kOp, Indexed("sources", i).c_str(), sources[i], s0));
  }
  ORRERY_RETURN_IF_ERROR(ExpectAs(kOp, "w", w, {s0.dim(1)}, dt, s0.device()));
  return ExpectAs(kOp, "gamma", gamma, {s0.dim(1)}, dt, s0.device());
}

// p and the gradients: the dtype on cpu, f32 on cuda.
DType GradType(const Tensor& s0) { return s0.device().is_cpu() ? s0.dtype() : DType::kF32; }

template <typename T>
std::vector<const T*> Pointers(const std::vector<Tensor>& sources) {
  std::vector<const T*> ptrs;
  for (const Tensor& s : sources) ptrs.push_back(s.data<T>());
  return ptrs;
}

template <typename T>
void MixCpu(const std::vector<Tensor>& sources, const Tensor& w, const Tensor& gamma, double eps,
            Tensor* h, Tensor* p) {
  AttnResForward<T>(Pointers<T>(sources), sources[0].dim(0), sources[0].dim(1), w.data<T>(),
                    gamma.data<T>(), eps, h->data<T>(), p != nullptr ? p->data<T>() : nullptr);
}

template <typename T>
void MixGradCpu(const std::vector<Tensor>& sources, const Tensor& w, const Tensor& gamma,
                double eps, const Tensor& p, const Tensor& dh, const std::vector<Tensor>& d_sources,
                Tensor* dw, Tensor* dgamma) {
  std::vector<T*> ds;
  for (const Tensor& g : d_sources) ds.push_back(g.defined() ? g.data<T>() : nullptr);
  AttnResBackward<T>(Pointers<T>(sources), sources[0].dim(0), sources[0].dim(1), w.data<T>(),
                     gamma.data<T>(), eps, p.data<T>(), dh.data<T>(), ds, dw->data<T>(),
                     dgamma->data<T>());
}

// An accumulated gradient [d]: allocated zeroed when undefined, else checked.
Status ZeroedOrChecked(const char* name, int64_t d, DType dtype, Device device, Tensor* g) {
  if (g == nullptr) return InvalidArgumentError(std::string(kOp) + ": " + name + " is null");
  if (!g->defined()) {
    ORRERY_ASSIGN_OR_RETURN(*g, Tensor::Allocate({d}, dtype, device));
    return g->SetZero();
  }
  return ExpectAs(kOp, name, *g, {d}, dtype, device);
}

}  // namespace

Status AttnResMix(const std::vector<Tensor>& sources, const Tensor& w, const Tensor& gamma,
                  double eps, Tensor* h, Tensor* p) {
  PhaseScope phase("op.attn_res_mix");
  ORRERY_RETURN_IF_ERROR(CheckInputs(sources, w, gamma));
  const Tensor& s0 = sources[0];
  const int64_t n = static_cast<int64_t>(sources.size());
  ORRERY_RETURN_IF_ERROR(AllocateLike(kOp, "h", s0, h));
  if (p != nullptr) {
    ORRERY_RETURN_IF_ERROR(AllocateAs(kOp, "p", {s0.dim(0), n}, GradType(s0), s0.device(), p));
  }
  if (s0.numel() == 0) return Status::OK();
  if (s0.device().is_cpu()) {
    if (s0.dtype() == DType::kF32) {
      MixCpu<float>(sources, w, gamma, eps, h, p);
    } else {
      MixCpu<double>(sources, w, gamma, eps, h, p);
    }
    return Status::OK();
  }
#if defined(ORRERY_KERNELS_CUDA)
  return cuda::AttnResMixCuda(sources, w, gamma, eps, h, p);
#else
  return NoCuda(kOp, s0);
#endif
}

Status AttnResMixGrad(const std::vector<Tensor>& sources, const Tensor& w, const Tensor& gamma,
                      double eps, const Tensor& p, const Tensor& dh, std::vector<Tensor>* d_sources,
                      Tensor* dw, Tensor* dgamma) {
  PhaseScope phase("op.attn_res_mix_grad");
  ORRERY_RETURN_IF_ERROR(CheckInputs(sources, w, gamma));
  const Tensor& s0 = sources[0];
  const size_t n = sources.size();
  const DType gt = GradType(s0);
  ORRERY_RETURN_IF_ERROR(
      ExpectAs(kOp, "p", p, {s0.dim(0), static_cast<int64_t>(n)}, gt, s0.device()));
  ORRERY_RETURN_IF_ERROR(ExpectLike(kOp, "dh", dh, s0));
  if (d_sources == nullptr || d_sources->size() != n) {
    return InvalidArgumentError(
        std::string(kOp) + ": d_sources has " +
        (d_sources == nullptr ? std::string("no vector") : std::to_string(d_sources->size())) +
        " entries, expected " + std::to_string(n) + " (one per source, undefined to skip)");
  }
  for (size_t i = 0; i < n; ++i) {
    const Tensor& g = (*d_sources)[i];
    if (g.defined()) {
      ORRERY_RETURN_IF_ERROR(
          ExpectAs(kOp, Indexed("d_sources", i).c_str(), g, s0.shape(), gt, s0.device()));
    }
  }
  ORRERY_RETURN_IF_ERROR(ZeroedOrChecked("dw", s0.dim(1), gt, s0.device(), dw));
  ORRERY_RETURN_IF_ERROR(ZeroedOrChecked("dgamma", s0.dim(1), gt, s0.device(), dgamma));
  if (s0.numel() == 0) return Status::OK();
  if (s0.device().is_cpu()) {
    if (s0.dtype() == DType::kF32) {
      MixGradCpu<float>(sources, w, gamma, eps, p, dh, *d_sources, dw, dgamma);
    } else {
      MixGradCpu<double>(sources, w, gamma, eps, p, dh, *d_sources, dw, dgamma);
    }
    return Status::OK();
  }
#if defined(ORRERY_KERNELS_CUDA)
  return cuda::AttnResMixGradCuda(sources, w, gamma, eps, p, dh, *d_sources, dw, dgamma);
#else
  return NoCuda(kOp, s0);
#endif
}

}  // namespace orrery::kernels
