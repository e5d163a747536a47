// Determinism of the GPU ops of the training step (issue 22: "a resumed run continues exactly").
// Every op of the GpuModel's forward, backward and optimizer step that sums across blocks now does
// so in a fixed order (kernels/cuda/column_sums.h, kernels/cuda/sorted_scatter_order.h, the KDA
// backward's per-warp slots) instead of with float atomics, so the same inputs give the same bits
// on every run. Each op runs twice here on inputs large enough that many blocks contend for the
// same outputs (a thousand blocks adding into one dw row, tens of thousands of tokens into one
// embedding row: the float atomics these replace gave different last bits from run to run at
// these sizes), and the two results must be equal byte for byte; the two fixed-order reductions
// must also equal their host twins bit for bit. Agreement with each op's CPU twin stays with the
// op tests, at their tolerances (ops_gpu_test.cc, seq_ops_gpu_test.cc, kda_gpu_test.cc,
// rl_gpu_test.cc), and the whole training step's determinism with gpu_model_tests
// (gpu_determinism_test.cc). Skipped without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/philox.h"
#include "kernels/adamw_op.h"
#include "kernels/attn_res.h"
#include "kernels/cuda/column_sums_order.h"
#include "kernels/cuda/ops_cuda.h"
#include "kernels/cuda/sorted_scatter_order.h"
#include "kernels/embedding.h"
#include "kernels/gates.h"
#include "kernels/kda.h"
#include "kernels/lm_head_loss.h"
#include "kernels/lm_head_policy_loss.h"
#include "kernels/matmul.h"
#include "kernels/rmsnorm.h"
#include "kernels/short_conv.h"
#include "tests/gpu/gpu_bench_util.h"
#include "tests/gpu/gpu_test_util.h"

namespace orrery::kernels {
namespace {

using gpu_bench::RandomOnGpu;
using gpu_test::ToGpu;
using gpu_test::ToHost;

// The bytes of `a` and `b` (any devices) are equal; names the first differing element otherwise.
void ExpectSameBits(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_TRUE(a.defined() && b.defined()) << what;
  ASSERT_EQ(a.shape(), b.shape()) << what;
  ASSERT_EQ(a.dtype(), b.dtype()) << what;
  const Tensor ha = ToHost(a), hb = ToHost(b);
  const size_t es = DTypeSize(a.dtype());
  const auto* pa = static_cast<const unsigned char*>(ha.raw_data());
  const auto* pb = static_cast<const unsigned char*>(hb.raw_data());
  for (int64_t i = 0; i < ha.numel(); ++i) {
    if (std::memcmp(pa + i * es, pb + i * es, es) != 0) {
      FAIL() << what << ": element " << i << " of " << ha.numel() << " differs between the runs";
    }
  }
  std::printf("  %-40s %lld elements bit-identical\n", what.c_str(),
              static_cast<long long>(ha.numel()));
}

Tensor Copy(const Tensor& t) {
  Tensor c = Tensor::Allocate(t.shape(), t.dtype(), t.device()).value();
  EXPECT_TRUE(c.CopyFrom(t).ok());
  return c;
}

// Host values of mixed scales and both signs, so the order of their sum shows in the last bits.
template <typename T>
Tensor MixedScales(const Shape& shape, DType dt, uint64_t seed) {
  PhiloxGenerator rng(seed, 0);
  Tensor h = Tensor::Empty(shape, dt);
  for (int64_t i = 0; i < h.numel(); ++i) {
    h.data<T>()[i] = static_cast<T>(rng.Normal() * std::pow(10.0, rng.UniformInt(7)) * 1e-3);
  }
  return h;
}

// ---- the fixed-order reductions against their host twins ----

template <typename T>
void CheckColumnSums(int64_t rows, int64_t cols, bool accumulate, uint64_t seed) {
  const DType dt = sizeof(T) == 8 ? DType::kF64 : DType::kF32;
  const Tensor parts = MixedScales<T>({rows, cols}, dt, seed);
  const Tensor out0 = MixedScales<T>({cols}, dt, seed + 1);
  Tensor want = out0.Clone();
  cuda::ColumnSumsInOrder(parts.data<T>(), rows, cols, accumulate, want.data<T>());
  const Tensor parts_gpu = ToGpu(parts);
  Tensor got[2];
  for (Tensor& g : got) {
    g = ToGpu(out0);
    const Status st = cuda::ColumnSumsCuda(parts_gpu, accumulate, &g);
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
  const std::string what = std::string(DTypeName(dt)) + " column sums " + std::to_string(rows) +
                           " x " + std::to_string(cols) + (accumulate ? " (+=)" : "");
  ExpectSameBits(got[0], want, what + " == host twin");
  ExpectSameBits(got[0], got[1], what);
}

TEST(DeterminismGpuTest, ColumnSumsEqualTheirHostTwinBitForBit) {
  SKIP_WITHOUT_GPU();
  CheckColumnSums<float>(1056, 2048, true, 1);  // an RMSNorm dw over 1056 blocks
  CheckColumnSums<float>(1000, 33, false, 2);   // a partial column tile
  CheckColumnSums<double>(9000, 1, false, 3);   // the squared norm's chunks
  CheckColumnSums<double>(4096, 7, true, 4);    // the policy loss's seven sums
  CheckColumnSums<float>(0, 5, true, 5);        // no rows: out unchanged (+ 0)
}

// The embedding's scatter-add: ids with a hot token (30% of the rows, its segment spans hundreds
// of chunks), segments ending exactly at chunk ends, and a few out-of-range ids (skipped, and the
// first reported).
TEST(DeterminismGpuTest, EmbeddingScatterAddEqualsItsHostTwinBitForBit) {
  SKIP_WITHOUT_GPU();
  const int64_t n = 65536, vocab = 1000, d = 256;
  PhiloxGenerator rng(40, 0);
  std::vector<int32_t> ids(n);
  for (int64_t r = 0; r < n; ++r) {
    ids[r] = rng.UniformInt(10) < 3 ? 7 : static_cast<int32_t>(rng.UniformInt(vocab));
  }
  ids[1000] = -3;
  ids[2000] = static_cast<int32_t>(vocab);
  const Tensor ids_gpu = Tensor::FromVector<int32_t>({n}, ids).To(Device::Cuda(0)).value();
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const Tensor dy = RandomOnGpu({n, d}, dt, 41);
    const Tensor dy_host = ToHost(dy).Cast(DType::kF32).value();  // bf16 -> f32 is exact
    const Tensor table0 = RandomOnGpu({vocab, d}, DType::kF32, 42);
    Tensor want = ToHost(table0);
    cuda::SortedScatterAddInOrder(ids.data(), n, vocab, dy_host.data<float>(), d,
                                  want.data<float>());
    Tensor got[2];
    for (Tensor& g : got) {
      g = Copy(table0);
      const Status st = EmbeddingScatterAdd(ids_gpu, dy, &g);
      ASSERT_EQ(st.code(), StatusCode::kOutOfRange) << st.ToString();
      EXPECT_EQ(st.message(), "embedding_backward: ids[1000] = -3, expected [0, 1000)");
    }
    const std::string what = "embedding scatter-add " + std::string(DTypeName(dt));
    ExpectSameBits(got[0], want, what + " == host twin");
    ExpectSameBits(got[0], got[1], what);
  }
}

// ---- each op twice ----

TEST(DeterminismGpuTest, RmsNormBackwardIsBitIdentical) {
  SKIP_WITHOUT_GPU();
  // d = 1024: 1056 blocks into one dw; d = 64: four row groups per block; d = 13000: the block's
  // slots in its row of the global scratch.
  for (auto [rows, d] : {std::pair<int64_t, int64_t>{65536, 1024}, {131072, 64}, {4096, 13000}}) {
    const Tensor x = RandomOnGpu({rows, d}, DType::kBF16, 1);
    const Tensor w = RandomOnGpu({d}, DType::kBF16, 2);
    const Tensor dy = RandomOnGpu({rows, d}, DType::kBF16, 3);
    const Tensor dw0 = RandomOnGpu({d}, DType::kF32, 4);
    Tensor y, rstd;
    ASSERT_TRUE(RmsNorm(x, w, 1e-6, &y, &rstd).ok());
    Tensor dx[2], dw[2];
    for (int i = 0; i < 2; ++i) {
      dw[i] = Copy(dw0);
      const Status st = RmsNormGrad(x, w, rstd, dy, &dx[i], &dw[i]);
      ASSERT_TRUE(st.ok()) << st.ToString();
    }
    const std::string what = "rmsnorm " + std::to_string(rows) + " x " + std::to_string(d);
    ExpectSameBits(dx[0], dx[1], what + " dx");
    ExpectSameBits(dw[0], dw[1], what + " dw");
  }
}

TEST(DeterminismGpuTest, AttnResBackwardIsBitIdentical) {
  SKIP_WITHOUT_GPU();
  const int64_t rows = 32768, d = 1536, n = 5;
  std::vector<Tensor> src;
  for (int64_t i = 0; i < n; ++i) src.push_back(RandomOnGpu({rows, d}, DType::kBF16, 10 + i));
  const Tensor w = RandomOnGpu({d}, DType::kBF16, 20), gamma = RandomOnGpu({d}, DType::kBF16, 21);
  const Tensor dh = RandomOnGpu({rows, d}, DType::kBF16, 22);
  Tensor h, p;
  ASSERT_TRUE(AttnResMix(src, w, gamma, 1e-6, &h, &p).ok());
  const Tensor ds0 = RandomOnGpu({rows, d}, DType::kF32, 23);
  const Tensor dw0 = RandomOnGpu({d}, DType::kF32, 24), dg0 = RandomOnGpu({d}, DType::kF32, 25);
  std::vector<Tensor> ds[2];
  Tensor dw[2], dg[2];
  for (int r = 0; r < 2; ++r) {
    ds[r].resize(n);
    ds[r][0] = Copy(ds0);
    ds[r][3] = Copy(ds0);  // the others need no gradient
    dw[r] = Copy(dw0);
    dg[r] = Copy(dg0);
    const Status st = AttnResMixGrad(src, w, gamma, 1e-6, p, dh, &ds[r], &dw[r], &dg[r]);
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
  ExpectSameBits(ds[0][0], ds[1][0], "attn_res d_sources[0]");
  ExpectSameBits(ds[0][3], ds[1][3], "attn_res d_sources[3]");
  ExpectSameBits(dw[0], dw[1], "attn_res dw");
  ExpectSameBits(dg[0], dg[1], "attn_res dgamma");
}

TEST(DeterminismGpuTest, ShortConvBackwardIsBitIdentical) {
  SKIP_WITHOUT_GPU();
  const int64_t n = 32768, c = 2048, width = 4;
  const Tensor x = RandomOnGpu({n, c}, DType::kBF16, 30),
               dy = RandomOnGpu({n, c}, DType::kBF16, 31);
  const Tensor w = RandomOnGpu({c, width}, DType::kBF16, 32);
  const std::vector<int64_t> cu = {0, 5000, 5001, 20000, n};
  const Tensor cu_host = Tensor::FromVector<int64_t>({5}, cu);
  const Tensor cu_dev = cu_host.To(Device::Cuda(0)).value();
  const Tensor dw0 = RandomOnGpu({c, width}, DType::kF32, 33);
  Tensor dx[2], dw[2];
  for (int i = 0; i < 2; ++i) {
    dw[i] = Copy(dw0);
    const Status st = ShortConvSiluGrad(x, w, cu_dev, cu_host, dy, &dx[i], &dw[i]);
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
  ExpectSameBits(dx[0], dx[1], "short conv dx");
  ExpectSameBits(dw[0], dw[1], "short conv dw");
}

TEST(DeterminismGpuTest, RowBiasGradIsBitIdentical) {
  SKIP_WITHOUT_GPU();
  const Tensor dy = RandomOnGpu({65536, 300}, DType::kBF16, 50);
  const Tensor db0 = RandomOnGpu({300}, DType::kF32, 51);
  Tensor db[2];
  for (Tensor& b : db) {
    b = Copy(db0);
    ASSERT_TRUE(RowBiasGrad(dy, &b).ok());
  }
  ExpectSameBits(db[0], db[1], "row bias grad");
}

TEST(DeterminismGpuTest, SquaredNormIsBitIdentical) {
  SKIP_WITHOUT_GPU();
  std::vector<Tensor> grads;
  for (int64_t i = 0; i < 40; ++i) grads.push_back(RandomOnGpu({(i + 1) * 100003}, DType::kF32, i));
  Tensor ss[2];
  for (Tensor& s : ss) {
    s = Tensor::Allocate({1}, DType::kF64, Device::Cuda(0)).value();
    ASSERT_TRUE(SquaredNorm(grads, &s).ok());
  }
  ExpectSameBits(ss[0], ss[1], "squared norm of 82M gradients");
}

TEST(DeterminismGpuTest, MatmulIsBitIdentical) {
  SKIP_WITHOUT_GPU();
  // A weight gradient over many tokens (long K: where split-K would be chosen), accumulated.
  const Tensor dy = RandomOnGpu({65536, 512}, DType::kBF16, 60);
  const Tensor x = RandomOnGpu({65536, 1024}, DType::kBF16, 61);
  const Tensor dw0 = RandomOnGpu({512, 1024}, DType::kF32, 62);
  Tensor dw[2];
  for (Tensor& g : dw) {
    g = Copy(dw0);
    ASSERT_TRUE(Matmul(dy, x, {true, false, 1.0f, 1.0f}, &g).ok());
  }
  ExpectSameBits(dw[0], dw[1], "matmul dW += dy^T x");
}

TEST(DeterminismGpuTest, LmHeadLossesAreBitIdentical) {
  SKIP_WITHOUT_GPU();
  const int64_t n = 8192, d = 512, v = 16384;
  const Tensor x = RandomOnGpu({n, d}, DType::kBF16, 70);
  const Tensor w = RandomOnGpu({v, d}, DType::kBF16, 71);
  PhiloxGenerator rng(72, 0);
  std::vector<int32_t> targets(n);
  std::vector<float> mask(n), prox(n), weight(n), adv(n);
  for (int64_t i = 0; i < n; ++i) {
    targets[i] = static_cast<int32_t>(rng.UniformInt(v));
    mask[i] = i % 7 == 3 ? 0.0f : 1.0f;
    prox[i] = static_cast<float>(-10.0 + rng.Normal());
    weight[i] = 1.0f;
    adv[i] = static_cast<float>(rng.Normal());
  }
  auto dev = [](const Tensor& t) { return t.To(Device::Cuda(0)).value(); };
  const Tensor t_dev = dev(Tensor::FromVector<int32_t>({n}, targets));
  const Tensor m_dev = dev(Tensor::FromVector<float>({n}, mask));
  const Tensor dw0 = RandomOnGpu({v, d}, DType::kF32, 73);
  LmHeadLossOptions lo;
  lo.chunk_rows = 2048;
  lo.grad_scale = 1.0 / n;
  double loss[2];
  Tensor dx[2], dw[2];
  for (int i = 0; i < 2; ++i) {
    dw[i] = Copy(dw0);
    const Status st = LmHeadCrossEntropy(x, w, t_dev, m_dev, lo, &loss[i], &dx[i], &dw[i]);
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
  EXPECT_EQ(std::memcmp(&loss[0], &loss[1], sizeof(double)), 0) << loss[0] << " " << loss[1];
  ExpectSameBits(dx[0], dx[1], "lm head cross-entropy dx");
  ExpectSameBits(dw[0], dw[1], "lm head cross-entropy dw");

  PolicyRows rows;
  rows.targets = t_dev;
  rows.mask = m_dev;
  rows.proximal = dev(Tensor::FromVector<float>({n}, prox));
  rows.weight = dev(Tensor::FromVector<float>({n}, weight));
  rows.advantage = dev(Tensor::FromVector<float>({n}, adv));
  rows.ref = rows.proximal;
  LmHeadPolicyOptions po;
  po.chunk_rows = 2048;
  po.grad_scale = 1.0 / n;
  po.entropy_coef = 0.01;
  po.kl_coef = 0.05;
  PolicyRowSums sums[2];
  for (int i = 0; i < 2; ++i) {
    dw[i] = Copy(dw0);
    const Status st = LmHeadPolicyLoss(x, w, rows, po, &sums[i], nullptr, &dx[i], &dw[i]);
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
  EXPECT_EQ(std::memcmp(&sums[0], &sums[1], sizeof(PolicyRowSums)), 0)
      << "loss " << sums[0].loss_sum << " " << sums[1].loss_sum << ", entropy "
      << sums[0].entropy_sum << " " << sums[1].entropy_sum;
  ExpectSameBits(dx[0], dx[1], "lm head policy loss dx");
  ExpectSameBits(dw[0], dw[1], "lm head policy loss dw");
}

// The KDA op with the GPU model's transforms (q/k L2 norm, beta sigmoid, bounded gate with A_log
// and dt_bias): the tensor-core backward (bf16, from a kept forward) and the SIMT one (f32).
void CheckKda(DType dt, int64_t t, int64_t h, int64_t k, const std::vector<int64_t>& cu) {
  KdaInputs in;
  in.q = RandomOnGpu({1, t, h, k}, dt, 80);
  in.k = RandomOnGpu({1, t, h, k}, dt, 81);
  in.v = RandomOnGpu({1, t, h, k}, dt, 82);
  in.g = RandomOnGpu({1, t, h, k}, DType::kF32, 83);
  in.beta = RandomOnGpu({1, t, h}, dt, 84);
  in.a_log = RandomOnGpu({h}, DType::kF32, 85);
  in.dt_bias = RandomOnGpu({h * k}, DType::kF32, 86);
  in.cu_seqlens = Tensor::FromVector<int64_t>({static_cast<int64_t>(cu.size())}, cu);
  const Tensor d_o = RandomOnGpu({1, t, h, k}, dt, 87);
  KdaOptions o;
  o.output_final_state = false;
  o.keep_for_backward = true;
  o.transforms.qk_l2norm = true;
  o.transforms.beta_sigmoid = true;
  o.transforms.gate = true;
  KdaOutputs out;
  ASSERT_TRUE(KdaForward(in, o, &out).ok());
  KdaGrads g[2];
  for (KdaGrads& gr : g) {
    const Status st = KdaBackward(in, d_o, Tensor(), o, &gr, out.saved.get());
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
  const std::string what = "kda " + std::string(DTypeName(dt)) + " ";
  ExpectSameBits(g[0].dq, g[1].dq, what + "dq");
  ExpectSameBits(g[0].dk, g[1].dk, what + "dk");
  ExpectSameBits(g[0].dv, g[1].dv, what + "dv");
  ExpectSameBits(g[0].dg, g[1].dg, what + "dz");
  ExpectSameBits(g[0].dbeta, g[1].dbeta, what + "dbeta");
  ExpectSameBits(g[0].da_log, g[1].da_log, what + "dA_log");
  ExpectSameBits(g[0].ddt_bias, g[1].ddt_bias, what + "ddt_bias");
}

TEST(DeterminismGpuTest, KdaBackwardIsBitIdentical) {
  SKIP_WITHOUT_GPU();
  CheckKda(DType::kBF16, 16384, 16, 128, {0, 8192, 8193, 16384});  // tensor cores
  CheckKda(DType::kF32, 2048, 4, 64, {0, 1000, 2048});             // SIMT
}

}  // namespace
}  // namespace orrery::kernels
