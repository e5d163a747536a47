// The optimizer-step ops' CPU twin (kernels/adamw_op.h) against the trainer's AdamW and global-norm
// clipping (learner/adamw.h): the same formula in the same f32 order, so bit-identical. The CUDA
// kernels are checked against this twin in tests/gpu/ops_gpu_test.cc.
#include "kernels/adamw_op.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/philox.h"
#include "learner/adamw.h"

namespace orrery {
namespace {

Tensor Normal(const Shape& shape, PhiloxGenerator& rng, double scale) {
  Tensor t = Tensor::Empty(shape, DType::kF32);
  for (int64_t i = 0; i < t.numel(); ++i)
    t.data<float>()[i] = static_cast<float>(scale * rng.Normal());
  return t;
}

bool SameBits(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

TEST(AdamWOpTest, TwinEqualsTrainerAdamWWithClipping) {
  PhiloxGenerator rng(7, 0);
  const std::vector<Shape> shapes = {{31, 17}, {5}, {64, 3}};
  std::vector<ParamRef> refs;
  std::vector<Tensor> p, m, v;
  for (size_t i = 0; i < shapes.size(); ++i) {
    ParamRef r{"p" + std::to_string(i), Normal(shapes[i], rng, 0.02),
               Tensor::Zeros(shapes[i], DType::kF32), i != 1};
    p.push_back(r.value.Clone());
    m.push_back(Tensor::Zeros(shapes[i], DType::kF32));
    v.push_back(Tensor::Zeros(shapes[i], DType::kF32));
    refs.push_back(r);
  }
  AdamWOptions options;
  auto adamw = AdamW::Create(options, refs);
  ASSERT_TRUE(adamw.ok());
  const double lr = 3e-3, max_norm = 1.0;
  for (int64_t step = 1; step <= 4; ++step) {
    std::vector<Tensor> grads;
    for (size_t i = 0; i < shapes.size(); ++i) {
      grads.push_back(Normal(shapes[i], rng, step == 2 ? 0.001 : 0.5));  // step 2: no clipping
      ASSERT_TRUE(refs[i].grad.CopyFrom(grads.back()).ok());
    }
    Tensor sumsq, factor;
    ASSERT_TRUE(kernels::SquaredNorm(grads, &sumsq).ok());
    ASSERT_TRUE(kernels::ClipFactor(sumsq, max_norm, &factor).ok());
    const double norm = ClipGradGlobalNorm(refs, max_norm);
    EXPECT_DOUBLE_EQ(std::sqrt(sumsq.data<double>()[0]), norm);
    EXPECT_EQ(factor.data<float>()[0] < 1.0f, step != 2);
    ASSERT_TRUE(adamw->Step(lr).ok());
    for (size_t i = 0; i < shapes.size(); ++i) {
      kernels::AdamWStepArgs args;
      args.lr = lr;
      args.beta1 = options.beta1;
      args.beta2 = options.beta2;
      args.eps = options.eps;
      args.weight_decay = refs[i].weight_decay ? options.weight_decay : 0.0;
      args.step = step;
      ASSERT_TRUE(kernels::AdamWStep(args, grads[i], factor, &p[i], &m[i], &v[i], nullptr).ok());
      EXPECT_TRUE(SameBits(p[i], refs[i].value)) << "step " << step << " param " << i;
    }
  }
}

// AdamWStepMany's twin with the decay flag per item: the result of AdamWStep with
// weight_decay where the flag is set and 0 where it is not; ZeroMany zeroes every tensor.
TEST(AdamWOpTest, StepManyEqualsAdamWStepPerItemWithItsDecayFlag) {
  PhiloxGenerator rng(9, 0);
  std::vector<kernels::AdamWTensors> many;
  std::vector<Tensor> p, m, v;
  for (int i = 0; i < 3; ++i) {
    const Tensor w = Normal({11, 3}, rng, 0.02), g = Normal({11, 3}, rng, 0.5);
    p.push_back(w.Clone());
    m.push_back(Tensor::Zeros({11, 3}, DType::kF32));
    v.push_back(Tensor::Zeros({11, 3}, DType::kF32));
    many.push_back({g, w.Clone(), Tensor::Zeros({11, 3}, DType::kF32),
                    Tensor::Zeros({11, 3}, DType::kF32), Tensor(), i != 1});
  }
  kernels::AdamWStepArgs args;
  args.lr = 0.1;  // large, so a wrongly applied decay shows in every element
  args.weight_decay = 0.5;
  ASSERT_TRUE(kernels::AdamWStepMany(args, Tensor(), &many).ok());
  for (int i = 0; i < 3; ++i) {
    kernels::AdamWStepArgs a = args;
    a.weight_decay = i != 1 ? 0.5 : 0.0;
    ASSERT_TRUE(kernels::AdamWStep(a, many[i].grad, Tensor(), &p[i], &m[i], &v[i], nullptr).ok());
    EXPECT_TRUE(SameBits(p[i], many[i].param)) << "param " << i;
    EXPECT_TRUE(SameBits(m[i], many[i].m)) << "m " << i;
  }
  std::vector<Tensor> zero = {many[0].param, many[2].m};
  ASSERT_TRUE(kernels::ZeroMany(&zero).ok());
  for (const Tensor& z : zero) {
    for (int64_t j = 0; j < z.numel(); ++j) ASSERT_EQ(z.data<float>()[j], 0.0f);
  }
}

TEST(AdamWOpTest, BadArgumentsAreOneClearError) {
  Tensor g = Tensor::Zeros({3}, DType::kF32), p = g.Clone(), m = g.Clone();
  Tensor v = Tensor::Zeros({4}, DType::kF32);
  kernels::AdamWStepArgs args;
  Status st = kernels::AdamWStep(args, g, Tensor(), &p, &m, &v, nullptr);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("adamw: v f32[4]"), std::string::npos) << st.message();
  args.step = 0;
  v = g.Clone();
  st = kernels::AdamWStep(args, g, Tensor(), &p, &m, &v, nullptr);
  EXPECT_FALSE(st.ok());
  Tensor bf = Tensor::Zeros({3}, DType::kBF16);
  args.step = 1;
  EXPECT_FALSE(kernels::AdamWStep(args, g, Tensor(), &p, &m, &v, &bf).ok());  // cuda only
}

}  // namespace
}  // namespace orrery
