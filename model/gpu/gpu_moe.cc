// The GPU model's Stable LatentMoE layer (spec §5), step for step the host MoeLayer
// (model/layers/moe.cc): an fp32 router (sigmoid scores, selection-only bias, renormalised top-k
// weights), the latent down-projection, the routed experts (stacked, kernels::MoeExperts), the
// latent RMSNorm, the up-projection and the full-width shared expert. The shared expert runs on
// the device's side stream (core/cuda_side_stream.h), overlapping the routed path, forward and
// backward; its output is added after the routed one either way, so the bits do not depend on it.
#include "core/cuda_side_stream.h"
#include "kernels/gates.h"
#include "kernels/phase_profile.h"
#include "kernels/rmsnorm.h"
#include "model/gpu/gpu_layers.h"
#include "model/layers.h"

namespace orrery::model::gpu {

Status GpuMoe::StackExperts(const std::unordered_map<std::string, Tensor>& host,
                            const ModelConfig& c, const std::string& prefix, DType compute,
                            Device device, WeightTable* t, std::vector<Weight>* roots) {
  const int64_t e = c.moe.num_experts, f = c.moe.expert_intermediate, l = c.expert_width();
  const std::pair<const char*, Shape> kinds[] = {{".w1", {f, l}}, {".w3", {f, l}}, {".w2", {l, f}}};
  for (const auto& [suffix, shape] : kinds) {
    Weight stacked;
    const Shape full{e, shape[0], shape[1]};
    ORRERY_ASSIGN_OR_RETURN(stacked.master, Tensor::Allocate(full, DType::kF32, device));
    ORRERY_ASSIGN_OR_RETURN(stacked.grad, ZerosOn(full, DType::kF32, device));
    for (int64_t i = 0; i < e; ++i) {
      const std::string name = prefix + ".experts." + std::to_string(i) + suffix;
      auto src = host.find(name);
      if (src == host.end()) return NotFoundError("gpu model: the host model has no " + name);
      ORRERY_ASSIGN_OR_RETURN(Tensor dst, stacked.master.Slice(i, i + 1));
      ORRERY_RETURN_IF_ERROR(dst.CopyFrom(src->second));
    }
    if (compute == DType::kF32) {
      stacked.compute = stacked.master;
    } else {
      ORRERY_ASSIGN_OR_RETURN(stacked.compute, As(stacked.master, compute));
    }
    for (int64_t i = 0; i < e; ++i) {
      ORRERY_ASSIGN_OR_RETURN(Weight one, stacked.Rows(i, i + 1));
      ORRERY_ASSIGN_OR_RETURN(one.master, one.master.Reshape(shape));
      ORRERY_ASSIGN_OR_RETURN(one.grad, one.grad.Reshape(shape));
      ORRERY_ASSIGN_OR_RETURN(one.compute, one.compute.Reshape(shape));
      t->Put(prefix + ".experts." + std::to_string(i) + suffix, one);
    }
    t->Put(prefix + ".experts" + suffix, stacked);
    roots->push_back(stacked);
  }
  return Status::OK();
}

Status GpuMoe::Init(const WeightTable& t, const ModelConfig& c, const std::string& p) {
  c_ = &c;
  ORRERY_ASSIGN_OR_RETURN(Weight router, t.Get(p + ".router"));
  router32_ = Weight{router.master, router.grad, router.master};
  if (c.moe.latent_dim > 0) {
    ORRERY_ASSIGN_OR_RETURN(down_, t.Get(p + ".down"));
    ORRERY_ASSIGN_OR_RETURN(up_, t.Get(p + ".up"));
  }
  if (c.moe.latent_norm) {
    ORRERY_ASSIGN_OR_RETURN(lnorm_, t.Get(p + ".latent_norm"));
  }
  ORRERY_ASSIGN_OR_RETURN(w1_, t.Get(p + ".experts.w1"));
  ORRERY_ASSIGN_OR_RETURN(w3_, t.Get(p + ".experts.w3"));
  ORRERY_ASSIGN_OR_RETURN(w2_, t.Get(p + ".experts.w2"));
  has_shared_ = c.moe.num_shared_experts > 0;
  if (has_shared_) ORRERY_RETURN_IF_ERROR(shared_.Init(t, c, p + ".shared"));
  return Status::OK();
}

Status GpuMoe::Forward(const Tensor& x, const Tensor& bias, const Tensor& forced, Tensor* y,
                       Cache* c) const {
  c->x = x;
  kernels::PhaseScope scope("fwd.moe");
  // The shared expert first, on the side stream; x and its output ys are kept until the join.
  SideStream side;
  Tensor ys;
  if (has_shared_) {
    ORRERY_RETURN_IF_ERROR(side.Run(x.device(), [&] {
      kernels::PhaseScope shared("fwd.moe.shared");
      return shared_.Forward(x, &ys, &c->shared);
    }));
  }
  // The router in fp32 (K3's router precision): scores = sigmoid(x W_r^T).
  ORRERY_ASSIGN_OR_RETURN(c->x32, As(x, DType::kF32));
  Tensor logits;
  ORRERY_RETURN_IF_ERROR(Linear(c->x32, router32_, &logits));
  ORRERY_RETURN_IF_ERROR(kernels::Sigmoid(logits, &c->scores));
  ORRERY_RETURN_IF_ERROR(kernels::RouteTopK(c->scores, bias, forced, c_->moe.top_k,
                                            c_->moe.routed_scaling_factor, &c->ids, &c->weights));
  c->xl = x;
  if (c_->moe.latent_dim > 0) {
    c->xl = Tensor();
    ORRERY_RETURN_IF_ERROR(Linear(x, down_, &c->xl));
  }
  {
    kernels::PhaseScope experts("fwd.moe.experts");
    ORRERY_RETURN_IF_ERROR(kernels::MoeExperts(c->xl, c->ids, c->weights, w1_.compute, w3_.compute,
                                               w2_.compute, ActivationOf(*c_), &c->yl,
                                               &c->experts));
  }
  Tensor yn = c->yl;
  if (c_->moe.latent_norm) {
    ORRERY_RETURN_IF_ERROR(
        kernels::RmsNorm(c->yl, lnorm_.compute, c_->rms_norm_eps, &c->yln, &c->yl_rstd));
    yn = c->yln;
  }
  if (c_->moe.latent_dim > 0) {
    ORRERY_RETURN_IF_ERROR(Linear(yn, up_, y));
  } else {
    *y = yn.Clone();
  }
  if (!has_shared_) return Status::OK();
  ORRERY_RETURN_IF_ERROR(side.Join());
  return kernels::AddInto(ys, 1.0f, y);
}

Status GpuMoe::Backward(const Cache& c, const Tensor& dy, Tensor* dx) const {
  kernels::PhaseScope scope("bwd.moe");
  // The shared expert's input gradient into its own dxs on the side stream (its weight gradients
  // are its own), added to *dx after the join; dy and the caches are the caller's until then. Both
  // start undefined and are made by their first LinearGrad (*dx may come undefined, too).
  SideStream side;
  Tensor dxs;
  if (has_shared_) {
    ORRERY_RETURN_IF_ERROR(side.Run(dy.device(), [&] {
      kernels::PhaseScope shared("bwd.moe.shared");
      return shared_.Backward(c.shared, dy, &dxs);
    }));
  }
  Tensor dyn = dy;
  if (c_->moe.latent_dim > 0) {
    dyn = Tensor();
    ORRERY_RETURN_IF_ERROR(LinearGradChain(c_->moe.latent_norm ? c.yln : c.yl, up_, dy, &dyn));
  }
  Tensor dyl = dyn;
  if (c_->moe.latent_norm) {
    dyl = Tensor();
    Tensor lnorm_grad = lnorm_.grad;
    ORRERY_RETURN_IF_ERROR(
        kernels::RmsNormGrad(c.yl, lnorm_.compute, c.yl_rstd, dyn, &dyl, &lnorm_grad));
  }
  ORRERY_ASSIGN_OR_RETURN(Tensor dxl, ZerosOn(c.xl.shape(), DType::kF32, c.xl.device()));
  Tensor dweights, dw1 = w1_.grad, dw3 = w3_.grad, dw2 = w2_.grad;
  {
    kernels::PhaseScope experts("bwd.moe.experts");
    ORRERY_RETURN_IF_ERROR(kernels::MoeExpertsGrad(c.xl, c.ids, c.weights, w1_.compute, w3_.compute,
                                                   w2_.compute, ActivationOf(*c_), c.experts, dyl,
                                                   &dxl, &dweights, &dw1, &dw3, &dw2));
  }
  if (c_->moe.latent_dim > 0) {
    ORRERY_ASSIGN_OR_RETURN(Tensor dxl_c, As(dxl, c.xl.dtype()));
    ORRERY_RETURN_IF_ERROR(LinearGrad(c.x, down_, dxl_c, dx));
  } else {
    ORRERY_RETURN_IF_ERROR(Accumulate(dxl, dx));
  }
  // Router: d logits from the weights' gradient, then W_r (fp32 operands, fp32 accumulation).
  Tensor dlogits;
  ORRERY_RETURN_IF_ERROR(
      kernels::RouteTopKGrad(c.scores, c.ids, dweights, c_->moe.routed_scaling_factor, &dlogits));
  ORRERY_RETURN_IF_ERROR(LinearGrad(c.x32, router32_, dlogits, dx));
  if (!has_shared_) return Status::OK();
  ORRERY_RETURN_IF_ERROR(side.Join());
  return Accumulate(dxs, dx);
}

}  // namespace orrery::model::gpu
