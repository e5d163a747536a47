// GroupedGemmForward, GroupedGemmInputGrad, GroupedGemmWeightGrad (kernels/grouped_gemm.h): the
// argument checks, then the CPU twin here (f64 sums, the offsets read on the host) or a CUDA
// kernel: the wgmma one (kernels/cuda/grouped_gemm_wgmma.cu) or the mma.sync one
// (kernels/cuda/grouped_gemm.cu), as ORRERY_GROUPED_GEMM and the device choose.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "kernels/elementwise_check.h"
#include "kernels/grouped_gemm.h"
#include "kernels/phase_profile.h"
#if defined(ORRERY_KERNELS_CUDA)
#include "kernels/cuda/grouped_gemm_cuda.h"
#endif

namespace orrery::kernels {
namespace {

Status Bad(const char* op, const std::string& what) {
  return InvalidArgumentError(std::string(op) + ": " + what);
}

std::string Desc(const Tensor& t) { return t.defined() ? t.ToString() : "undefined"; }

constexpr int64_t kMaxGridY = 65535;

bool Aligned16(const Tensor& t) { return reinterpret_cast<uintptr_t>(t.raw_data()) % 16 == 0; }

// The sizes of a call after its checks: M rows, E experts, W's [N, K].
struct Dims {
  int64_t m, e, n, k;
  Device device;
};

// Operand `t` 2-D [rows, cols] on device with the operands' dtype (bf16 on cuda, f32/f64 on cpu:
// `dtype` is the first operand's).
Status CheckOperand(const char* op, const char* name, const Tensor& t, const Shape& shape,
                    DType dtype, Device device) {
  ORRERY_RETURN_IF_ERROR(ExpectAs(op, name, t, shape, dtype, device));
  if (!device.is_cpu() && !Aligned16(t)) {
    return Bad(op, std::string(name) + " " + t.ToString() + ": data not 16-byte aligned");
  }
  return Status::OK();
}

// The first operand (defines M, the device and the operand dtype) and the offsets [E + 1].
Status CheckCommon(const char* op, const Tensor& first, const char* first_name,
                   const Tensor& offsets, int64_t e, int64_t n, int64_t k, Dims* d) {
  if (!first.defined() || first.ndim() != 2) {
    return Bad(op, std::string(first_name) + " " + Desc(first) + ", expected 2-D");
  }
  const Device dev = first.device();
  const DType dt = first.dtype();
  if (dev.is_cpu() ? (dt != DType::kF32 && dt != DType::kF64) : dt != DType::kBF16) {
    return Bad(op, std::string(first_name) + " " + first.ToString() +
                       (dev.is_cpu() ? ", expected f32 or f64 on cpu" : ", expected bf16 on cuda"));
  }
#if !defined(ORRERY_KERNELS_CUDA)
  if (!dev.is_cpu()) return NoCuda(op, first);
#endif
  if (e < 1) return Bad(op, "expected at least one expert, got " + std::to_string(e));
  if (!dev.is_cpu() && e > kMaxGridY) {
    return Bad(op, std::to_string(e) + " experts, expected at most " + std::to_string(kMaxGridY) +
                       " on cuda (a grid dimension per expert)");
  }
  if (!offsets.defined() || offsets.ndim() != 1 || offsets.dim(0) != e + 1 ||
      (offsets.dtype() != DType::kI32 && offsets.dtype() != DType::kI64) ||
      !(offsets.device() == dev)) {
    return Bad(op, "offsets " + Desc(offsets) + ", expected i32 or i64 [" + std::to_string(e + 1) +
                       "] on " + dev.ToString());
  }
  if (!dev.is_cpu() && !GroupedGemmSupports(n, k)) {
    return Bad(op, "W's [N, K] = [" + std::to_string(n) + ", " + std::to_string(k) +
                       "]: the cuda kernels need N and K positive multiples of " +
                       std::to_string(kGroupedGemmDimMultiple));
  }
  d->m = first.dim(0);
  d->e = e;
  d->n = n;
  d->k = k;
  d->device = dev;
  return Status::OK();
}

// The stacked W [E, N, K] of the operands' dtype.
Status CheckStacked(const char* op, const char* name, const Tensor& w) {
  if (!w.defined() || w.ndim() != 3)
    return Bad(op, std::string(name) + " " + Desc(w) + ", expected 3-D [E, N, K]");
  return Status::OK();
}

// Output `out` of shape on device: on cpu the operands' dtype, on cuda one of `allowed`.
Status CheckOutput(const char* op, const char* name, const Tensor& out, const Shape& shape,
                   DType operand, const std::vector<DType>& allowed, Device device) {
  const bool cpu = device.is_cpu();
  const bool ok_type =
      cpu ? out.dtype() == operand
          : std::find(allowed.begin(), allowed.end(), out.dtype()) != allowed.end();
  ORRERY_RETURN_IF_ERROR(
      ExpectAs(op, name, out, shape, ok_type ? out.dtype() : (cpu ? operand : allowed[0]), device));
  if (!cpu && !Aligned16(out)) {
    return Bad(op, std::string(name) + " " + out.ToString() + ": data not 16-byte aligned");
  }
  return Status::OK();
}

// The offsets as int64 (a cpu tensor); RowsOf clamps them as the device does: lo_e in [0, m],
// hi_e in [lo_e, m].
std::vector<int64_t> HostRows(const Tensor& offsets) {
  std::vector<int64_t> o(static_cast<size_t>(offsets.numel()));
  for (int64_t i = 0; i < offsets.numel(); ++i) {
    o[i] = offsets.dtype() == DType::kI64 ? offsets.data<int64_t>()[i] : offsets.data<int32_t>()[i];
  }
  return o;
}
void RowsOf(const std::vector<int64_t>& o, int64_t e, int64_t m, int64_t* lo, int64_t* hi) {
  *lo = std::clamp<int64_t>(o[e], 0, m);
  *hi = std::clamp<int64_t>(o[e + 1], *lo, m);
}

// The CPU twin of the three products, in f64 sums over T = float or double.
template <typename T>
void ForwardCpu(const Tensor& x, const Tensor& w, const std::vector<int64_t>& o, const Dims& d,
                Tensor* y) {
  const T* xp = x.data<T>();
  const T* wp = w.data<T>();
  T* yp = y->data<T>();
  for (int64_t e = 0; e < d.e; ++e) {
    int64_t lo, hi;
    RowsOf(o, e, d.m, &lo, &hi);
    const T* we = wp + e * d.n * d.k;
    for (int64_t r = lo; r < hi; ++r) {
      for (int64_t j = 0; j < d.n; ++j) {
        // Four interleaved f64 sums (independent add chains; the GPU tests' twin runs on
        // thousands of rows), added at the end.
        double s[4] = {0, 0, 0, 0};
        const T* xr = xp + r * d.k;
        const T* wj = we + j * d.k;
        int64_t c = 0;
        for (; c + 4 <= d.k; c += 4) {
          for (int q = 0; q < 4; ++q) {
            s[q] += static_cast<double>(xr[c + q]) * static_cast<double>(wj[c + q]);
          }
        }
        for (; c < d.k; ++c) s[0] += static_cast<double>(xr[c]) * static_cast<double>(wj[c]);
        yp[r * d.n + j] = static_cast<T>((s[0] + s[1]) + (s[2] + s[3]));
      }
    }
  }
}

template <typename T>
void InputGradCpu(const Tensor& dy, const Tensor& w, const std::vector<int64_t>& o, const Dims& d,
                  bool accumulate, Tensor* dx) {
  const T* gp = dy.data<T>();
  const T* wp = w.data<T>();
  T* xp = dx->data<T>();
  std::vector<double> row(static_cast<size_t>(d.k));
  for (int64_t e = 0; e < d.e; ++e) {
    int64_t lo, hi;
    RowsOf(o, e, d.m, &lo, &hi);
    const T* we = wp + e * d.n * d.k;
    for (int64_t r = lo; r < hi; ++r) {
      std::fill(row.begin(), row.end(), 0.0);
      for (int64_t j = 0; j < d.n; ++j) {
        const double g = gp[r * d.n + j];
        for (int64_t c = 0; c < d.k; ++c) row[c] += g * static_cast<double>(we[j * d.k + c]);
      }
      for (int64_t c = 0; c < d.k; ++c) {
        T& out = xp[r * d.k + c];
        out = static_cast<T>(accumulate ? static_cast<double>(out) + row[c] : row[c]);
      }
    }
  }
}

template <typename T>
void WeightGradCpu(const Tensor& dy, const Tensor& x, const std::vector<int64_t>& o, const Dims& d,
                   Tensor* dw) {
  const T* gp = dy.data<T>();
  const T* xp = x.data<T>();
  T* wp = dw->data<T>();
  std::vector<double> acc(static_cast<size_t>(d.n * d.k));
  for (int64_t e = 0; e < d.e; ++e) {
    int64_t lo, hi;
    RowsOf(o, e, d.m, &lo, &hi);
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t r = lo; r < hi; ++r) {
      for (int64_t j = 0; j < d.n; ++j) {
        const double g = gp[r * d.n + j];
        for (int64_t c = 0; c < d.k; ++c)
          acc[j * d.k + c] += g * static_cast<double>(xp[r * d.k + c]);
      }
    }
    T* we = wp + e * d.n * d.k;
    for (int64_t i = 0; i < d.n * d.k; ++i)
      we[i] = static_cast<T>(static_cast<double>(we[i]) + acc[i]);
  }
}

#if defined(ORRERY_KERNELS_CUDA)
// The kernel of a cuda call, from ORRERY_GROUPED_GEMM: kMma, or the wgmma kernel's tile width
// (0: its own choice). Unset, empty or "auto": wgmma where the device and the sizes allow it, else
// mma; "mma", "wgmma", "wgmma128", "wgmma256" force one (wgmma where it cannot run is an error, not
// a silent fallback).
constexpr int kMma = -1;
StatusOr<int> ChooseKernel(const char* op, const Dims& d) {
  const char* env = std::getenv("ORRERY_GROUPED_GEMM");
  const std::string v = env == nullptr ? "" : env;
  if (v == "mma") return kMma;
  const bool ok = cuda::GroupedGemmWgmmaAvailable(d.device.index) &&
                  cuda::GroupedGemmWgmmaSupports(d.m, d.n, d.k);
  if (v.empty() || v == "auto") return ok ? 0 : kMma;
  const int tile = v == "wgmma" ? 0 : v == "wgmma128" ? 128 : v == "wgmma256" ? 256 : kMma;
  if (tile == kMma) {
    return Bad(op,
               "ORRERY_GROUPED_GEMM '" + v + "', expected mma, wgmma, wgmma128, wgmma256 or auto");
  }
  if (!ok) {
    return Bad(op, "ORRERY_GROUPED_GEMM=" + v + " on " + d.device.ToString() + " with M " +
                       std::to_string(d.m) +
                       ": the wgmma kernel needs a compute capability 9.0 device and M, N, K < "
                       "2^31");
  }
  return tile;
}
#endif

}  // namespace

bool GroupedGemmSupports(int64_t n, int64_t k) {
  return n > 0 && k > 0 && n % kGroupedGemmDimMultiple == 0 && k % kGroupedGemmDimMultiple == 0;
}

Status GroupedGemmForward(const Tensor& x, const Tensor& w, const Tensor& offsets, Tensor* y) {
  PhaseScope phase("op.grouped_gemm_forward");
  constexpr const char* kOp = "grouped_gemm_forward";
  ORRERY_RETURN_IF_ERROR(CheckStacked(kOp, "w", w));
  Dims d;
  ORRERY_RETURN_IF_ERROR(CheckCommon(kOp, x, "x", offsets, w.dim(0), w.dim(1), w.dim(2), &d));
  ORRERY_RETURN_IF_ERROR(CheckOperand(kOp, "x", x, {d.m, d.k}, x.dtype(), d.device));
  ORRERY_RETURN_IF_ERROR(CheckOperand(kOp, "w", w, w.shape(), x.dtype(), d.device));
  if (y == nullptr) return Bad(kOp, "y is required");
  if (!y->defined()) {
    ORRERY_ASSIGN_OR_RETURN(*y, Tensor::Allocate({d.m, d.n}, x.dtype(), d.device));
  }
  ORRERY_RETURN_IF_ERROR(
      CheckOutput(kOp, "y", *y, {d.m, d.n}, x.dtype(), {DType::kBF16, DType::kF32}, d.device));
  if (d.m == 0) return Status::OK();
#if defined(ORRERY_KERNELS_CUDA)
  if (!d.device.is_cpu()) {
    ORRERY_ASSIGN_OR_RETURN(const int kernel, ChooseKernel(kOp, d));
    return kernel == kMma ? cuda::GroupedGemmForwardMma(x, w, offsets, y)
                          : cuda::GroupedGemmForwardWgmma(x, w, offsets, kernel, y);
  }
#endif
  const std::vector<int64_t> o = HostRows(offsets);
  if (x.dtype() == DType::kF32) {
    ForwardCpu<float>(x, w, o, d, y);
  } else {
    ForwardCpu<double>(x, w, o, d, y);
  }
  return Status::OK();
}

Status GroupedGemmInputGrad(const Tensor& dy, const Tensor& w, const Tensor& offsets,
                            bool accumulate, Tensor* dx) {
  PhaseScope phase("op.grouped_gemm_input_grad");
  constexpr const char* kOp = "grouped_gemm_input_grad";
  ORRERY_RETURN_IF_ERROR(CheckStacked(kOp, "w", w));
  Dims d;
  ORRERY_RETURN_IF_ERROR(CheckCommon(kOp, dy, "dy", offsets, w.dim(0), w.dim(1), w.dim(2), &d));
  ORRERY_RETURN_IF_ERROR(CheckOperand(kOp, "dy", dy, {d.m, d.n}, dy.dtype(), d.device));
  ORRERY_RETURN_IF_ERROR(CheckOperand(kOp, "w", w, w.shape(), dy.dtype(), d.device));
  if (dx == nullptr) return Bad(kOp, "dx is required");
  if (!dx->defined()) {
    if (accumulate) return Bad(kOp, "dx is undefined but accumulate is set");
    ORRERY_ASSIGN_OR_RETURN(
        *dx, Tensor::Allocate({d.m, d.k}, d.device.is_cpu() ? dy.dtype() : DType::kF32, d.device));
  }
  ORRERY_RETURN_IF_ERROR(
      CheckOutput(kOp, "dx", *dx, {d.m, d.k}, dy.dtype(), {DType::kF32, DType::kBF16}, d.device));
  if (d.m == 0) return Status::OK();
#if defined(ORRERY_KERNELS_CUDA)
  if (!d.device.is_cpu()) {
    ORRERY_ASSIGN_OR_RETURN(const int kernel, ChooseKernel(kOp, d));
    return kernel == kMma ? cuda::GroupedGemmInputGradMma(dy, w, offsets, accumulate, dx)
                          : cuda::GroupedGemmInputGradWgmma(dy, w, offsets, accumulate, kernel, dx);
  }
#endif
  const std::vector<int64_t> o = HostRows(offsets);
  if (dy.dtype() == DType::kF32) {
    InputGradCpu<float>(dy, w, o, d, accumulate, dx);
  } else {
    InputGradCpu<double>(dy, w, o, d, accumulate, dx);
  }
  return Status::OK();
}

Status GroupedGemmWeightGrad(const Tensor& dy, const Tensor& x, const Tensor& offsets, Tensor* dw) {
  PhaseScope phase("op.grouped_gemm_weight_grad");
  constexpr const char* kOp = "grouped_gemm_weight_grad";
  if (dw == nullptr) return Bad(kOp, "dw is required");
  if (!dy.defined() || dy.ndim() != 2 || !x.defined() || x.ndim() != 2) {
    return Bad(kOp, "dy " + Desc(dy) + " and x " + Desc(x) + ", expected 2-D");
  }
  if (!offsets.defined() || offsets.ndim() != 1 || offsets.dim(0) < 2) {
    return Bad(kOp, "offsets " + Desc(offsets) + ", expected [E + 1] with E >= 1");
  }
  const int64_t e = offsets.dim(0) - 1;
  Dims d;
  ORRERY_RETURN_IF_ERROR(CheckCommon(kOp, dy, "dy", offsets, e, dy.dim(1), x.dim(1), &d));
  ORRERY_RETURN_IF_ERROR(CheckOperand(kOp, "x", x, {d.m, d.k}, dy.dtype(), d.device));
  const DType g = d.device.is_cpu() ? dy.dtype() : DType::kF32;
  if (!dw->defined()) {
    ORRERY_ASSIGN_OR_RETURN(*dw, Tensor::Allocate({d.e, d.n, d.k}, g, d.device));
    ORRERY_RETURN_IF_ERROR(dw->SetZero());
  }
  ORRERY_RETURN_IF_ERROR(CheckOutput(kOp, "dw", *dw, {d.e, d.n, d.k}, g, {DType::kF32}, d.device));
  if (d.m == 0) return Status::OK();
#if defined(ORRERY_KERNELS_CUDA)
  if (!d.device.is_cpu()) {
    ORRERY_ASSIGN_OR_RETURN(const int kernel, ChooseKernel(kOp, d));
    return kernel == kMma ? cuda::GroupedGemmWeightGradMma(dy, x, offsets, dw)
                          : cuda::GroupedGemmWeightGradWgmma(dy, x, offsets, kernel, dw);
  }
#endif
  const std::vector<int64_t> o = HostRows(offsets);
  if (dy.dtype() == DType::kF32) {
    WeightGradCpu<float>(dy, x, o, d, dw);
  } else {
    WeightGradCpu<double>(dy, x, o, d, dw);
  }
  return Status::OK();
}

bool GroupedGemmGluFused(Device device) {
  if (device.is_cpu()) return true;
#if defined(ORRERY_KERNELS_CUDA)
  const char* env = std::getenv("ORRERY_GROUPED_GEMM");
  if (env != nullptr && std::string(env) == "mma") return false;
  return cuda::GroupedGemmWgmmaAvailable(device.index);
#else
  return false;
#endif
}

Status GroupedGemmGlu(const GluActivation& act, const Tensor& x, const Tensor& w1, const Tensor& w3,
                      const Tensor& offsets, Tensor* h, Tensor* a, Tensor* u) {
  PhaseScope phase("op.grouped_gemm_glu");
  constexpr const char* kOp = "grouped_gemm_glu";
  ORRERY_RETURN_IF_ERROR(CheckStacked(kOp, "w1", w1));
  Dims d;
  ORRERY_RETURN_IF_ERROR(CheckCommon(kOp, x, "x", offsets, w1.dim(0), w1.dim(1), w1.dim(2), &d));
  ORRERY_RETURN_IF_ERROR(CheckOperand(kOp, "x", x, {d.m, d.k}, x.dtype(), d.device));
  ORRERY_RETURN_IF_ERROR(CheckOperand(kOp, "w1", w1, w1.shape(), x.dtype(), d.device));
  ORRERY_RETURN_IF_ERROR(CheckOperand(kOp, "w3", w3, w1.shape(), x.dtype(), d.device));
  if (h == nullptr) return Bad(kOp, "h is required");
  if ((a == nullptr) != (u == nullptr)) return Bad(kOp, "a and u: both or neither");
  const DType out = h->defined() ? h->dtype() : (d.device.is_cpu() ? x.dtype() : DType::kBF16);
  for (Tensor* t : {h, a, u}) {
    if (t == nullptr) continue;
    if (!t->defined()) {
      ORRERY_ASSIGN_OR_RETURN(*t, Tensor::Allocate({d.m, d.n}, out, d.device));
    }
    ORRERY_RETURN_IF_ERROR(CheckOutput(kOp, t == h ? "h" : (t == a ? "a" : "u"), *t, {d.m, d.n},
                                       x.dtype(), {out == DType::kF32 ? DType::kF32 : DType::kBF16},
                                       d.device));
  }
  if (d.m == 0) return Status::OK();
#if defined(ORRERY_KERNELS_CUDA)
  if (!d.device.is_cpu()) {
    if (!GroupedGemmGluFused(d.device) || !cuda::GroupedGemmWgmmaSupports(d.m, d.n, d.k)) {
      return Bad(kOp,
                 "the fused kernel needs a compute capability 9.0 device, M, F, K < 2^31 "
                 "and ORRERY_GROUPED_GEMM other than mma; compose GroupedGemmForward and Glu");
    }
    ORRERY_ASSIGN_OR_RETURN(const int kernel, ChooseKernel(kOp, d));
    return cuda::GroupedGemmGluWgmma(act, x, w1, w3, offsets, kernel, h, a, u);
  }
#endif
  // The twin: a and u (the outputs, or scratch), then the activation on each expert's rows.
  Tensor sa, su;
  Tensor* pa = a;
  Tensor* pu = u;
  if (pa == nullptr) {
    ORRERY_ASSIGN_OR_RETURN(sa, Tensor::Allocate({d.m, d.n}, x.dtype(), d.device));
    ORRERY_ASSIGN_OR_RETURN(su, Tensor::Allocate({d.m, d.n}, x.dtype(), d.device));
    pa = &sa;
    pu = &su;
  }
  const std::vector<int64_t> o = HostRows(offsets);
  if (x.dtype() == DType::kF32) {
    ForwardCpu<float>(x, w1, o, d, pa);
    ForwardCpu<float>(x, w3, o, d, pu);
  } else {
    ForwardCpu<double>(x, w1, o, d, pa);
    ForwardCpu<double>(x, w3, o, d, pu);
  }
  for (int64_t e = 0; e < d.e; ++e) {
    int64_t lo, hi;
    RowsOf(o, e, d.m, &lo, &hi);
    const int64_t at = lo * d.n, n = (hi - lo) * d.n;
    if (x.dtype() == DType::kF32) {
      GluForward<float>(act, pa->data<float>() + at, pu->data<float>() + at, n,
                        h->data<float>() + at);
    } else {
      GluForward<double>(act, pa->data<double>() + at, pu->data<double>() + at, n,
                         h->data<double>() + at);
    }
  }
  return Status::OK();
}

}  // namespace orrery::kernels
