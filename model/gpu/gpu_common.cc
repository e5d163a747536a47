// The GPU model's shared helpers (linear layers over kernels::Matmul, casts, accumulation) and
// its dense gated MLP.
#include "kernels/gates.h"
#include "kernels/matmul.h"
#include "model/gpu/gpu_layers.h"
#include "model/layers.h"

namespace orrery::model::gpu {

StatusOr<Weight> Weight::Rows(int64_t begin, int64_t end) const {
  Weight w;
  ORRERY_ASSIGN_OR_RETURN(w.master, master.Slice(begin, end));
  ORRERY_ASSIGN_OR_RETURN(w.grad, grad.Slice(begin, end));
  ORRERY_ASSIGN_OR_RETURN(w.compute, compute.Slice(begin, end));
  return w;
}

StatusOr<Weight> WeightTable::Get(const std::string& name) const {
  auto it = weights_.find(name);
  if (it == weights_.end()) return NotFoundError("gpu model: no parameter named " + name);
  return it->second;
}

Status Linear(const Tensor& x, const Weight& w, Tensor* y) {
  kernels::MatmulOptions o;
  o.trans_b = true;
  return kernels::Matmul(x, w.compute, o, y);
}

StatusOr<Tensor> ZerosOn(const Shape& shape, DType dtype, Device device) {
  ORRERY_ASSIGN_OR_RETURN(Tensor t, Tensor::Allocate(shape, dtype, device));
  ORRERY_RETURN_IF_ERROR(t.SetZero());
  return t;
}

Status LinearGrad(const Tensor& x, const Weight& w, const Tensor& dy, Tensor* dx) {
  kernels::MatmulOptions gw;
  gw.trans_a = true;
  gw.beta = 1.0f;
  Tensor g = w.grad;
  ORRERY_RETURN_IF_ERROR(kernels::Matmul(dy, x, gw, &g));
  if (dx == nullptr) return Status::OK();
  if (!dx->defined()) {
    ORRERY_ASSIGN_OR_RETURN(*dx, ZerosOn(x.shape(), DType::kF32, x.device()));
  }
  kernels::MatmulOptions gx;
  gx.beta = 1.0f;  // bf16 operands accumulate into an f32 output (kernels/matmul.h)
  return kernels::Matmul(dy, w.compute, gx, dx);
}

Status LinearGradChain(const Tensor& x, const Weight& w, const Tensor& dy, Tensor* dx) {
  kernels::MatmulOptions gw;
  gw.trans_a = true;
  gw.beta = 1.0f;
  Tensor g = w.grad;
  ORRERY_RETURN_IF_ERROR(kernels::Matmul(dy, x, gw, &g));
  return kernels::Matmul(dy, w.compute, kernels::MatmulOptions{}, dx);
}

StatusOr<Tensor> As(const Tensor& t, DType dtype) {
  if (t.dtype() == dtype) return t;
  ORRERY_ASSIGN_OR_RETURN(Tensor out, Tensor::Allocate(t.shape(), dtype, t.device()));
  ORRERY_RETURN_IF_ERROR(kernels::CastInto(t, &out));
  return out;
}

Status Accumulate(const Tensor& x, Tensor* acc) {
  if (!acc->defined()) {
    ORRERY_ASSIGN_OR_RETURN(*acc, ZerosOn(x.shape(), DType::kF32, x.device()));
  }
  return kernels::AddInto(x, 1.0f, acc);
}

Status GpuMlp::Init(const WeightTable& t, const ModelConfig& c, const std::string& prefix) {
  act_ = ActivationOf(c);
  ORRERY_ASSIGN_OR_RETURN(w1_, t.Get(prefix + ".w1"));
  ORRERY_ASSIGN_OR_RETURN(w3_, t.Get(prefix + ".w3"));
  ORRERY_ASSIGN_OR_RETURN(w2_, t.Get(prefix + ".w2"));
  return Status::OK();
}

Status GpuMlp::Forward(const Tensor& x, Tensor* y, Cache* c) const {
  c->x = x;
  ORRERY_RETURN_IF_ERROR(Linear(x, w1_, &c->a));
  ORRERY_RETURN_IF_ERROR(Linear(x, w3_, &c->u));
  ORRERY_RETURN_IF_ERROR(kernels::Glu(act_, c->a, c->u, &c->h));
  return Linear(c->h, w2_, y);
}

Status GpuMlp::Backward(const Cache& c, const Tensor& dy, Tensor* dx) const {
  Tensor dh, da, du;
  ORRERY_RETURN_IF_ERROR(LinearGradChain(c.h, w2_, dy, &dh));
  ORRERY_RETURN_IF_ERROR(kernels::GluGrad(act_, c.a, c.u, dh, &da, &du));
  ORRERY_RETURN_IF_ERROR(LinearGrad(c.x, w1_, da, dx));
  return LinearGrad(c.x, w3_, du, dx);
}

}  // namespace orrery::model::gpu
