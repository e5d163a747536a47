// KDA CUDA kernels against the CPU reference on fresh random inputs (skipped without a GPU).
//
// The reference runs in f64 on the very values the GPU sees (inputs rounded to f32 or bf16
// first), so the comparison measures the kernel's arithmetic only. Tolerances are fla's relative
// RMS errors (spec §2.8) for bf16 inputs, and fp32-rounding level for f32 inputs.
#include <gtest/gtest.h>

#include <cstring>
#include <tuple>

#include "core/device.h"
#include "kernels/cuda/kda_cuda.h"
#include "kernels/kda.h"
#include "kernels/kda_problem.h"
#include "tests/unit/kernels/kda_test_util.h"

namespace orrery::kernels {
namespace {

using testing::KdaShape;
using testing::RandomKdaInputs;
using testing::RelRmsError;

#define SKIP_WITHOUT_GPU() \
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device"

Tensor Round(const Tensor& t, DType dt) { return t.Cast(dt).value().Cast(DType::kF64).value(); }
Tensor ToGpu(const Tensor& t, DType dt) {
  return (t.dtype() == dt ? t : t.Cast(dt).value()).To(Device::Cuda(0)).value();
}

struct Case {
  KdaShape shape;
  DType dtype;
  bool with_state;
  double g_lo;                    // -5: bounded gate range; -40: original (unbounded) gate
  std::vector<int64_t> seq_lens;  // packed when not empty (shape.b must be 1)
  double g_hi = 0.0;              // g uniform in (g_lo, g_hi)
};

// Forward on the GPU against the f64 CPU chunked forward. segments > 0 calls the tensor-core
// forward directly with that many segments per sequence (the long-sequence split, spec §2.5);
// 0 goes through KdaForward's dispatch.
void CheckForward(const Case& c, uint64_t seed, int segments = 0) {
  KdaInputs ref_in = RandomKdaInputs(c.shape, DType::kF64, seed, false, c.g_lo);
  if (c.g_hi != 0.0) {
    PhiloxGenerator grng(seed + 7, 0);
    ref_in.g = testing::RandomUniform(ref_in.g.shape(), DType::kF64, grng, c.g_lo, c.g_hi);
  }
  for (Tensor* t : {&ref_in.q, &ref_in.k, &ref_in.v, &ref_in.g, &ref_in.beta})
    *t = Round(*t, c.dtype);
  const int64_t n = c.seq_lens.empty() ? c.shape.b : static_cast<int64_t>(c.seq_lens.size());
  if (!c.seq_lens.empty()) {
    std::vector<int64_t> cu = {0};
    for (int64_t len : c.seq_lens) cu.push_back(cu.back() + len);
    ref_in.cu_seqlens = Tensor::FromVector<int64_t>({n + 1}, cu);
  }
  if (c.with_state) {
    PhiloxGenerator rng(seed + 1, 0);
    ref_in.initial_state = Round(
        testing::RandomNormal({n, c.shape.h, c.shape.k, c.shape.v}, DType::kF64, rng), DType::kF32);
  }
  KdaOptions options;
  options.algorithm = KdaAlgorithm::kChunked;
  KdaOutputs ref;
  ASSERT_TRUE(KdaForward(ref_in, options, &ref).ok());

  KdaInputs gpu_in;
  gpu_in.q = ToGpu(ref_in.q, c.dtype);
  gpu_in.k = ToGpu(ref_in.k, c.dtype);
  gpu_in.v = ToGpu(ref_in.v, c.dtype);
  gpu_in.g = ToGpu(ref_in.g, DType::kF32);
  gpu_in.beta = ToGpu(ref_in.beta, c.dtype);
  if (c.with_state) gpu_in.initial_state = ToGpu(ref_in.initial_state, DType::kF32);
  gpu_in.cu_seqlens = ref_in.cu_seqlens;
  KdaOutputs got;
  if (segments > 0) {
    const StatusOr<KdaProblem> p = ValidateKdaInputs(gpu_in, options);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    ASSERT_TRUE(cuda::KdaTcSupported(*p, gpu_in));
    got.o = Tensor::Allocate(gpu_in.v.shape(), gpu_in.v.dtype(), Device::Cuda(0)).value();
    got.final_state =
        Tensor::Allocate({n, c.shape.h, c.shape.k, c.shape.v}, DType::kF32, Device::Cuda(0))
            .value();
    cuda::KdaTcTuning tuning;
    tuning.segments_per_sequence = segments;
    const Status s = cuda::LaunchKdaForwardTc(*p, gpu_in, tuning, &got);
    ASSERT_TRUE(s.ok()) << s.ToString();
  } else {
    const Status s = KdaForward(gpu_in, options, &got);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  const double o_err = RelRmsError(got.o, ref.o),
               s_err = RelRmsError(got.final_state, ref.final_state);
  // bf16: fla's tolerance for o and ht (0.005). f32: fp32 arithmetic with __expf over a few
  // hundred accumulated terms lands near 1e-6; 1e-4 leaves room without hiding a wrong formula
  // (a wrong term gives errors of order 1).
  const double tol = c.dtype == DType::kBF16 ? 5e-3 : 1e-4;
  EXPECT_LT(o_err, tol) << "o";
  EXPECT_LT(s_err, tol) << "final_state";
  std::printf(
      "  %s B=%lld T=%lld H=%lld K=%lld V=%lld g in (%g, %g) packed=%zu segments=%d: o %.2e, "
      "state %.2e\n",
      std::string(DTypeName(c.dtype)).c_str(), (long long)c.shape.b, (long long)c.shape.t,
      (long long)c.shape.h, (long long)c.shape.k, (long long)c.shape.v, c.g_lo, c.g_hi,
      c.seq_lens.size(), segments, o_err, s_err);
}

TEST(KdaGpu, ForwardMatchesCpuReference) {
  SKIP_WITHOUT_GPU();
  const Case cases[] = {
      {{2, 100, 3, 64, 64}, DType::kF32, true, -5.0, {}},
      {{2, 100, 3, 64, 64}, DType::kBF16, true, -5.0, {}},
      {{1, 300, 2, 128, 128}, DType::kF32, false, -5.0, {}},
      {{1, 300, 2, 128, 128}, DType::kBF16, true, -40.0, {}},
      {{1, 64, 96, 128, 128}, DType::kBF16, true, -5.0, {}},
      {{1, 33, 1, 128, 80}, DType::kF32, true, -5.0, {}},
      {{1, 151, 4, 128, 128}, DType::kBF16, true, -5.0, {1, 17, 100, 0, 33}},
      {{1, 151, 4, 64, 64}, DType::kF32, false, -40.0, {50, 101}},
  };
  uint64_t seed = 100;
  for (const Case& c : cases) CheckForward(c, seed++);
}

// bf16 with K, V in {64, 128} takes the tensor-core forward: 64-token chunks, 16x16 MMA tiles,
// the pairwise diagonal tiles where the decay across a tile is too strong (g_lo = -40), the
// state pass per 64-wide V slice; the long single sequence splits itself into segments.
TEST(KdaGpu, TensorCoreForwardMatchesCpuReference) {
  SKIP_WITHOUT_GPU();
  const Case cases[] = {
      {{2, 200, 3, 128, 64}, DType::kBF16, true, -5.0, {}},
      {{1, 130, 2, 64, 128}, DType::kBF16, false, -5.0, {}},
      // Every step near the bound: diagonal tiles span ~107 (log2), Y up to 2^107 in bf16.
      {{1, 256, 2, 128, 128}, DType::kBF16, true, -5.0, {}, -4.95},
      {{2, 257, 2, 128, 128}, DType::kBF16, true, -40.0, {}},
      {{1, 4096, 2, 128, 128}, DType::kBF16, true, -5.0, {}},  // auto split at B = 1
      {{1, 1, 1, 64, 64}, DType::kBF16, true, -5.0, {}},
  };
  uint64_t seed = 300;
  for (const Case& c : cases) CheckForward(c, seed++);
}

TEST(KdaGpu, TensorCoreForwardSegmentsMatchCpuReference) {
  SKIP_WITHOUT_GPU();
  CheckForward({{1, 2000, 2, 128, 128}, DType::kBF16, true, -5.0, {}}, 400, 5);
  CheckForward({{1, 2000, 2, 64, 64}, DType::kBF16, false, -5.0, {}}, 401, 7);
  CheckForward({{1, 2000, 3, 128, 128}, DType::kBF16, true, -40.0, {700, 0, 65, 1235}}, 402, 3);
  CheckForward({{2, 1000, 2, 128, 64}, DType::kBF16, true, -1.0, {}}, 403, 16);  // 16 chunks
}

// K = 128, V = 80 takes the wide (float4) kernel; K = 48, V = 30 the general one.
void CheckDecode(int64_t kd, int64_t vd) {
  const int64_t n = 5, h = 3, steps = 7;
  PhiloxGenerator rng(7, 0);
  Tensor state = testing::RandomNormal({n, h, kd, vd}, DType::kF32, rng);
  Tensor gpu_state = state.To(Device::Cuda(0)).value();
  Tensor o_cpu, o_gpu;
  for (int64_t step = 0; step < steps; ++step) {
    const KdaInputs x = RandomKdaInputs({n, 1, h, kd, vd}, DType::kF32, 50 + step, false);
    auto tok = [](const Tensor& t) {
      Shape s = t.shape();
      s.erase(s.begin() + 1);
      return t.Reshape(s).value();
    };
    ASSERT_TRUE(
        KdaDecodeStep(tok(x.q), tok(x.k), tok(x.v), tok(x.g), tok(x.beta), 0.0f, &state, &o_cpu)
            .ok());
    const Status s = KdaDecodeStep(ToGpu(tok(x.q), DType::kF32), ToGpu(tok(x.k), DType::kF32),
                                   ToGpu(tok(x.v), DType::kF32), ToGpu(tok(x.g), DType::kF32),
                                   ToGpu(tok(x.beta), DType::kF32), 0.0f, &gpu_state, &o_gpu);
    ASSERT_TRUE(s.ok()) << s.ToString();
    // f32 on both sides; only the order of the two K-reductions differs.
    EXPECT_LT(RelRmsError(o_gpu, o_cpu), 1e-5) << "step " << step;
  }
  EXPECT_LT(RelRmsError(gpu_state, state), 1e-5) << "K=" << kd << " V=" << vd;
}

TEST(KdaGpu, DecodeMatchesCpuDecode) {
  SKIP_WITHOUT_GPU();
  CheckDecode(128, 80);
  CheckDecode(64, 128);
  CheckDecode(48, 30);
}

// The inference engine's form: raw inputs with the transforms fused (L2 norm, gate from z with
// A_log and dt_bias, beta sigmoid), states as rows of a table (scrambled, one padding row), bf16
// and f32 inputs (K = 128 and 64: the wide kernel; K = 48: the general one), over several steps,
// against the CPU twin in f64 on the same (rounded) inputs.
void CheckEngineDecode(int64_t kd, int64_t vd, DType dt, double tol) {
  const int64_t n = 4, h = 2, table = 6, steps = 5;
  const std::vector<int32_t> rows = {3, -1, 0, 5};
  PhiloxGenerator rng(17 + kd, 1);
  Tensor state = testing::RandomNormal({table, h, kd, vd}, DType::kF64, rng);
  const Tensor a_log = testing::RandomNormal({h}, DType::kF64, rng);
  const Tensor dt_bias = testing::RandomNormal({h * kd}, DType::kF64, rng);
  Tensor gpu_state = state.Cast(DType::kF32).value().To(Device::Cuda(0)).value();
  KdaDecodeOptions cpu_o, gpu_o;
  for (KdaDecodeOptions* o : {&cpu_o, &gpu_o}) {
    o->transforms.qk_l2norm = o->transforms.beta_sigmoid = o->transforms.gate = true;
  }
  cpu_o.a_log = a_log;
  cpu_o.dt_bias = dt_bias;
  cpu_o.rows = Tensor::FromVector<int32_t>({n}, rows);
  gpu_o.a_log = ToGpu(a_log, DType::kF32);
  gpu_o.dt_bias = ToGpu(dt_bias, DType::kF32);
  gpu_o.rows = ToGpu(cpu_o.rows, DType::kI32);
  for (int64_t step = 0; step < steps; ++step) {
    auto in = [&](const Shape& shape) {
      return Round(testing::RandomNormal(shape, DType::kF64, rng), dt);
    };
    const Tensor q = in({n, h, kd}), k = in({n, h, kd}), v = in({n, h, vd}), z = in({n, h, kd});
    const Tensor beta = in({n, h});
    Tensor o_cpu, o_gpu;
    ASSERT_TRUE(KdaDecodeStep(q, k, v, z, beta, cpu_o, &state, &o_cpu).ok());
    const Status s = KdaDecodeStep(ToGpu(q, dt), ToGpu(k, dt), ToGpu(v, dt), ToGpu(z, dt),
                                   ToGpu(beta, dt), gpu_o, &gpu_state, &o_gpu);
    ASSERT_TRUE(s.ok()) << s.ToString();
    const Tensor got = o_gpu.To(Device::Cpu()).value().Cast(DType::kF64).value();
    EXPECT_LT(RelRmsError(got, o_cpu), tol) << "K=" << kd << " step " << step;
  }
  // f32 state arithmetic on the GPU against f64, from the same rounded inputs: 1e-5 (the plain
  // decode test's bound; five steps of f32 rounding are about 1e-6).
  const Tensor got = gpu_state.To(Device::Cpu()).value().Cast(DType::kF64).value();
  EXPECT_LT(RelRmsError(got, state), 1e-5) << "state table, K=" << kd;
}

TEST(KdaGpu, EngineDecodeWithTransformsAndRowsMatchesCpuTwin) {
  SKIP_WITHOUT_GPU();
  // o in bf16: its rounding (~1.1e-3 relative) under 5e-3; in f32, summation order: 1e-5.
  CheckEngineDecode(128, 128, DType::kBF16, 5e-3);
  CheckEngineDecode(64, 64, DType::kF32, 1e-5);
  CheckEngineDecode(48, 40, DType::kF32, 1e-5);
}

// Every gradient of the CUDA backward against the f64 CPU chunked backward on the same (rounded)
// inputs, d_o and d_final_state. segments > 0 calls the tensor-core backward directly with that
// many segments per sequence in its reverse state pass; 0 goes through KdaBackward's dispatch.
void CheckBackward(const Case& c, uint64_t seed, int segments = 0) {
  KdaInputs ref_in = RandomKdaInputs(c.shape, DType::kF64, seed, false, c.g_lo);
  if (c.g_hi != 0.0) {
    PhiloxGenerator grng(seed + 7, 0);
    ref_in.g = testing::RandomUniform(ref_in.g.shape(), DType::kF64, grng, c.g_lo, c.g_hi);
  }
  for (Tensor* t : {&ref_in.q, &ref_in.k, &ref_in.v, &ref_in.g, &ref_in.beta})
    *t = Round(*t, c.dtype);
  const int64_t n = c.seq_lens.empty() ? c.shape.b : static_cast<int64_t>(c.seq_lens.size());
  if (!c.seq_lens.empty()) {
    std::vector<int64_t> cu = {0};
    for (int64_t len : c.seq_lens) cu.push_back(cu.back() + len);
    ref_in.cu_seqlens = Tensor::FromVector<int64_t>({n + 1}, cu);
  }
  PhiloxGenerator rng(seed + 1, 0);
  Tensor d_o = Round(testing::RandomNormal(ref_in.v.shape(), DType::kF64, rng), c.dtype);
  Tensor dht;
  if (c.with_state) {
    const Shape st = {n, c.shape.h, c.shape.k, c.shape.v};
    ref_in.initial_state = Round(testing::RandomNormal(st, DType::kF64, rng), DType::kF32);
    dht = Round(testing::RandomNormal(st, DType::kF64, rng), DType::kF32);
  }
  KdaOptions options;
  options.algorithm = KdaAlgorithm::kChunked;
  KdaGrads ref;
  ASSERT_TRUE(KdaBackward(ref_in, d_o, dht, options, &ref).ok());

  KdaInputs gpu_in;
  gpu_in.q = ToGpu(ref_in.q, c.dtype);
  gpu_in.k = ToGpu(ref_in.k, c.dtype);
  gpu_in.v = ToGpu(ref_in.v, c.dtype);
  gpu_in.g = ToGpu(ref_in.g, DType::kF32);
  gpu_in.beta = ToGpu(ref_in.beta, c.dtype);
  if (c.with_state) gpu_in.initial_state = ToGpu(ref_in.initial_state, DType::kF32);
  gpu_in.cu_seqlens = ref_in.cu_seqlens;
  KdaGrads got;
  const Tensor gpu_dht = c.with_state ? ToGpu(dht, DType::kF32) : Tensor();
  if (segments > 0) {
    const StatusOr<KdaProblem> p = ValidateKdaInputs(gpu_in, options);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    ASSERT_TRUE(cuda::KdaTcSupported(*p, gpu_in));
    cuda::KdaTcTuning tuning;
    tuning.segments_per_sequence = segments;
    const Status s =
        cuda::LaunchKdaBackwardTc(*p, gpu_in, ToGpu(d_o, c.dtype), gpu_dht, tuning, &got);
    ASSERT_TRUE(s.ok()) << s.ToString();
  } else {
    const Status s = KdaBackward(gpu_in, ToGpu(d_o, c.dtype), gpu_dht, options, &got);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  ASSERT_EQ(got.dq.dtype(), c.dtype);
  ASSERT_EQ(got.dg.dtype(), DType::kF32);  // g was given in f32
  const bool bf16 = c.dtype == DType::kBF16;
  // bf16: fla's tolerances (spec 2.8): dq, dk, dv, dh0 0.008; dg, dbeta 0.02. f32: fp32
  // arithmetic over ~K*C accumulated terms lands near 1e-6; dg is a reverse cumsum of terms that
  // largely cancel (its norm is far below its summands'), so it gets 10x the room of the others.
  const double tol = bf16 ? 8e-3 : 1e-4, tol_g = bf16 ? 2e-2 : 1e-3;
  const double e_q = RelRmsError(got.dq, ref.dq), e_k = RelRmsError(got.dk, ref.dk),
               e_v = RelRmsError(got.dv, ref.dv), e_g = RelRmsError(got.dg, ref.dg),
               e_b = RelRmsError(got.dbeta, ref.dbeta);
  EXPECT_LT(e_q, tol) << "dq";
  EXPECT_LT(e_k, tol) << "dk";
  EXPECT_LT(e_v, tol) << "dv";
  EXPECT_LT(e_g, tol_g) << "dg";
  EXPECT_LT(e_b, tol_g) << "dbeta";
  double e_h = 0;
  if (c.with_state) {
    ASSERT_TRUE(got.dinitial_state.defined());
    e_h = RelRmsError(got.dinitial_state, ref.dinitial_state);
    EXPECT_LT(e_h, tol) << "dh0";
  }
  std::printf(
      "  bwd %s B=%lld T=%lld H=%lld K=%lld V=%lld g in (%g, %g) packed=%zu segments=%d: dq %.2e "
      "dk %.2e dv %.2e dg %.2e dbeta %.2e dh0 %.2e\n",
      std::string(DTypeName(c.dtype)).c_str(), (long long)c.shape.b, (long long)c.shape.t,
      (long long)c.shape.h, (long long)c.shape.k, (long long)c.shape.v, c.g_lo, c.g_hi,
      c.seq_lens.size(), segments, e_q, e_k, e_v, e_g, e_b, e_h);
}

TEST(KdaGpu, BackwardMatchesCpuReference) {
  SKIP_WITHOUT_GPU();
  const Case cases[] = {
      {{2, 100, 3, 64, 64}, DType::kF32, true, -5.0, {}},
      {{2, 100, 3, 64, 64}, DType::kBF16, true, -5.0, {}},
      {{1, 300, 2, 128, 128}, DType::kF32, false, -5.0, {}},
      {{1, 300, 2, 128, 128}, DType::kBF16, true, -40.0, {}},
      {{1, 64, 96, 128, 128}, DType::kBF16, true, -5.0, {}},
      {{1, 33, 1, 128, 80}, DType::kF32, true, -5.0, {}},
      {{1, 151, 4, 128, 128}, DType::kBF16, true, -5.0, {1, 17, 100, 0, 33}},
      {{1, 151, 4, 64, 64}, DType::kF32, false, -40.0, {50, 101}},
  };
  uint64_t seed = 200;
  for (const Case& c : cases) CheckBackward(c, seed++);
}

// bf16 with K, V in {64, 128} takes the tensor-core backward: the forward's 64-token chunks and
// 16x16 tiles, the reverse state pass per 64-wide V slice, the pairwise diagonal tiles where the
// decay across a tile is too strong (g_lo = -40); the long single sequence splits itself.
TEST(KdaGpu, TensorCoreBackwardMatchesCpuReference) {
  SKIP_WITHOUT_GPU();
  const Case cases[] = {
      {{2, 200, 3, 128, 64}, DType::kBF16, true, -5.0, {}},
      {{1, 130, 2, 64, 128}, DType::kBF16, false, -5.0, {}},
      {{2, 64, 2, 64, 64}, DType::kBF16, true, -5.0, {}},
      // Every step near the bound: diagonal tiles span ~107 (log2), factors up to 2^107 in bf16.
      {{1, 256, 2, 128, 128}, DType::kBF16, true, -5.0, {}, -4.95},
      {{2, 257, 2, 128, 128}, DType::kBF16, true, -40.0, {}},
      {{1, 4096, 2, 128, 128}, DType::kBF16, true, -5.0, {}},  // auto split at B = 1
      {{1, 1, 1, 64, 64}, DType::kBF16, true, -5.0, {}},
      {{1, 300, 3, 128, 128}, DType::kBF16, false, -40.0, {1, 0, 120, 179}},
  };
  uint64_t seed = 500;
  for (const Case& c : cases) CheckBackward(c, seed++);
}

TEST(KdaGpu, TensorCoreBackwardSegmentsMatchCpuReference) {
  SKIP_WITHOUT_GPU();
  CheckBackward({{1, 2000, 2, 128, 128}, DType::kBF16, true, -5.0, {}}, 600, 5);
  CheckBackward({{1, 2000, 2, 64, 64}, DType::kBF16, false, -5.0, {}}, 601, 7);
  CheckBackward({{1, 2000, 3, 128, 128}, DType::kBF16, true, -40.0, {700, 0, 65, 1235}}, 602, 3);
  CheckBackward({{2, 1000, 2, 128, 64}, DType::kBF16, true, -1.0, {}}, 603, 16);  // 16 chunks
}

// x's q, k, v, beta in `dtype` and g in f32 on the GPU (bf16: what the tensor-core path takes).
KdaInputs GpuInputs(const KdaInputs& x, DType dtype = DType::kBF16) {
  return KdaInputs{
      ToGpu(x.q, dtype),    ToGpu(x.k, dtype), ToGpu(x.v, dtype), ToGpu(x.g, DType::kF32),
      ToGpu(x.beta, dtype), Tensor(),          Tensor()};
}

bool BitEqual(const Tensor& a, const Tensor& b) {
  const Tensor x = a.To(Device::Cpu()).value(), y = b.To(Device::Cpu()).value();
  return x.shape() == y.shape() && x.dtype() == y.dtype() &&
         std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()) == 0;
}

// A forward with keep_for_backward computes exactly what the backward's own recompute does, so
// the backward from the kept intermediates must give bit-identical gradients (and the kept
// forward the same output); the recompute path is checked against the CPU reference above.
TEST(KdaGpu, TensorCoreBackwardFromKeptForwardEqualsRecompute) {
  SKIP_WITHOUT_GPU();
  struct KeptCase {
    KdaShape shape;
    std::vector<int64_t> seq_lens;
  };
  const KeptCase cases[] = {{{2, 200, 3, 128, 64}, {}},
                            {{1, 4096, 2, 128, 128}, {}},  // split into segments
                            {{1, 300, 3, 64, 128}, {1, 0, 120, 179}}};
  uint64_t seed = 700;
  for (const KeptCase& c : cases) {
    const KdaInputs x = RandomKdaInputs(c.shape, DType::kF32, seed++, false, -5.0);
    KdaInputs in = GpuInputs(x);
    const int64_t n = c.seq_lens.empty() ? c.shape.b : static_cast<int64_t>(c.seq_lens.size());
    if (!c.seq_lens.empty()) {
      std::vector<int64_t> cu = {0};
      for (int64_t len : c.seq_lens) cu.push_back(cu.back() + len);
      in.cu_seqlens = Tensor::FromVector<int64_t>({n + 1}, cu);
    }
    PhiloxGenerator rng(seed, 0);
    const Tensor d_o = ToGpu(testing::RandomNormal(x.v.shape(), DType::kF32, rng), DType::kBF16);
    const Tensor dht = ToGpu(
        testing::RandomNormal({n, c.shape.h, c.shape.k, c.shape.v}, DType::kF32, rng), DType::kF32);
    KdaOptions plain, keep;
    keep.keep_for_backward = true;
    KdaOutputs out_plain, out_keep;
    ASSERT_TRUE(KdaForward(in, plain, &out_plain).ok());
    ASSERT_TRUE(KdaForward(in, keep, &out_keep).ok());
    EXPECT_FALSE(out_plain.saved);
    ASSERT_TRUE(out_keep.saved);
    EXPECT_TRUE(BitEqual(out_plain.o, out_keep.o));
    EXPECT_TRUE(BitEqual(out_plain.final_state, out_keep.final_state));
    KdaGrads recomputed, from_kept;
    ASSERT_TRUE(KdaBackward(in, d_o, dht, plain, &recomputed).ok());
    const Status s = KdaBackward(in, d_o, dht, plain, &from_kept, out_keep.saved.get());
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_TRUE(BitEqual(recomputed.dq, from_kept.dq)) << "dq";
    EXPECT_TRUE(BitEqual(recomputed.dk, from_kept.dk)) << "dk";
    EXPECT_TRUE(BitEqual(recomputed.dv, from_kept.dv)) << "dv";
    EXPECT_TRUE(BitEqual(recomputed.dg, from_kept.dg)) << "dg";
    EXPECT_TRUE(BitEqual(recomputed.dbeta, from_kept.dbeta)) << "dbeta";
  }
}

TEST(KdaGpu, BackwardRefusesKeptForwardOfAnotherShape) {
  SKIP_WITHOUT_GPU();
  const KdaInputs a = GpuInputs(RandomKdaInputs({1, 128, 2, 64, 64}, DType::kF32, 9, false));
  const KdaInputs b = GpuInputs(RandomKdaInputs({1, 200, 2, 64, 64}, DType::kF32, 9, false));
  KdaOptions keep;
  keep.keep_for_backward = true;
  KdaOutputs out;
  ASSERT_TRUE(KdaForward(a, keep, &out).ok());
  KdaGrads grads;
  const Status s = KdaBackward(b, b.v, Tensor(), KdaOptions(), &grads, out.saved.get());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
}

// The op's input transforms on the GPU (q/k L2 norm, beta sigmoid, gate activation from z with
// A_log and dt_bias, both gate forms) against the f64 CPU op with the same transforms on the same
// raw values: forward outputs and every raw input's gradient, da_log and ddt_bias included.
// Tolerances: fla's for bf16 (spec 2.8; da_log and ddt_bias are sums over tokens of dg-like
// terms, so dg's 2e-2), fp32 levels for f32 as in CheckBackward.
// Which of the transforms are on (all by default), and whether the GPU forward keeps its
// intermediates for the backward.
struct TransformCase {
  bool qk_l2norm = true, beta_sigmoid = true, gate = true, keep = false;
};

void CheckTransforms(const KdaShape& shape, DType dtype, DType g_dtype, KdaGateKind kind,
                     std::vector<int64_t> seq_lens, uint64_t seed, TransformCase tc = {}) {
  KdaInputs raw = RandomKdaInputs(shape, DType::kF64, seed, false);
  PhiloxGenerator rng(seed + 1, 0);
  // Raw inputs where a transform takes them; the recurrence's own (normalised q and k, beta in
  // (0, 1), g in (-5, 0)) where it is off.
  if (tc.qk_l2norm) {
    raw.q = testing::RandomNormal(raw.q.shape(), DType::kF64, rng);
    raw.k = testing::RandomNormal(raw.k.shape(), DType::kF64, rng);
  }
  raw.g = tc.gate ? testing::RandomNormal(raw.g.shape(), DType::kF64, rng)
                  : testing::RandomUniform(raw.g.shape(), DType::kF64, rng, -5, 0);
  if (tc.beta_sigmoid) raw.beta = testing::RandomNormal(raw.beta.shape(), DType::kF64, rng);
  raw.a_log = Round(testing::RandomUniform({shape.h}, DType::kF64, rng, -1.0, 0.5), DType::kF32);
  raw.dt_bias = Round(testing::RandomNormal({shape.h * shape.k}, DType::kF64, rng), DType::kF32);
  for (Tensor* t : {&raw.q, &raw.k, &raw.v, &raw.beta}) *t = Round(*t, dtype);
  raw.g = Round(raw.g, g_dtype);
  const int64_t n = seq_lens.empty() ? shape.b : static_cast<int64_t>(seq_lens.size());
  if (!seq_lens.empty()) {
    std::vector<int64_t> cu = {0};
    for (int64_t len : seq_lens) cu.push_back(cu.back() + len);
    raw.cu_seqlens = Tensor::FromVector<int64_t>({n + 1}, cu);
  }
  const Shape st = {n, shape.h, shape.k, shape.v};
  raw.initial_state = Round(testing::RandomNormal(st, DType::kF64, rng), DType::kF32);
  const Tensor d_o = Round(testing::RandomNormal(raw.v.shape(), DType::kF64, rng), dtype);
  const Tensor dht = Round(testing::RandomNormal(st, DType::kF64, rng), DType::kF32);
  KdaOptions options;
  options.transforms.qk_l2norm = tc.qk_l2norm;
  options.transforms.beta_sigmoid = tc.beta_sigmoid;
  options.transforms.gate = tc.gate;
  options.transforms.gate_kind = kind;
  if (!tc.gate) raw.a_log = raw.dt_bias = Tensor();  // the gate's parameters
  KdaOutputs ref_out;
  KdaGrads ref;
  ASSERT_TRUE(KdaForward(raw, options, &ref_out).ok());
  const Status rs = KdaBackward(raw, d_o, dht, options, &ref);
  ASSERT_TRUE(rs.ok()) << rs.ToString();

  KdaInputs gpu = raw;
  for (Tensor* t : {&gpu.q, &gpu.k, &gpu.v, &gpu.beta}) *t = ToGpu(*t, dtype);
  gpu.g = ToGpu(raw.g, g_dtype);
  for (Tensor* t : {&gpu.a_log, &gpu.dt_bias, &gpu.initial_state}) {
    if (t->defined()) *t = ToGpu(*t, DType::kF32);
  }
  KdaOutputs out;
  KdaGrads got;
  KdaOptions gpu_options = options;
  gpu_options.keep_for_backward = tc.keep;
  const Status fs = KdaForward(gpu, gpu_options, &out);
  ASSERT_TRUE(fs.ok()) << fs.ToString();
  const Status bs =
      KdaBackward(gpu, ToGpu(d_o, dtype), ToGpu(dht, DType::kF32), options, &got, out.saved.get());
  ASSERT_TRUE(bs.ok()) << bs.ToString();
  ASSERT_EQ(got.dg.dtype(), g_dtype);
  ASSERT_EQ(got.da_log.defined() && got.ddt_bias.defined(), tc.gate);
  const bool bf16 = dtype == DType::kBF16;
  const double t_out = bf16 ? 5e-3 : 1e-4, t_grad = bf16 ? 8e-3 : 1e-4, t_g = bf16 ? 2e-2 : 1e-3;
  const std::tuple<const char*, const Tensor*, const Tensor*, double> checks[] = {
      {"o", &out.o, &ref_out.o, t_out},
      {"final_state", &out.final_state, &ref_out.final_state, t_out},
      {"dq", &got.dq, &ref.dq, t_grad},
      {"dk", &got.dk, &ref.dk, t_grad},
      {"dv", &got.dv, &ref.dv, t_grad},
      {"dh0", &got.dinitial_state, &ref.dinitial_state, t_grad},
      {"dz", &got.dg, &ref.dg, t_g},
      {"dbeta", &got.dbeta, &ref.dbeta, t_g},
      {"da_log", &got.da_log, &ref.da_log, t_g},
      {"ddt_bias", &got.ddt_bias, &ref.ddt_bias, t_g}};
  std::printf(
      "  transforms %s g %s %s B=%lld T=%lld H=%lld K=%lld V=%lld packed=%zu l2norm=%d "
      "sigmoid=%d gate=%d kept=%d:",
      std::string(DTypeName(dtype)).c_str(), std::string(DTypeName(g_dtype)).c_str(),
      kind == KdaGateKind::kBounded ? "bounded" : "original", (long long)shape.b,
      (long long)shape.t, (long long)shape.h, (long long)shape.k, (long long)shape.v,
      seq_lens.size(), tc.qk_l2norm, tc.beta_sigmoid, tc.gate, tc.keep);
  for (const auto& [name, a, b, tol] : checks) {
    if (!b->defined()) continue;  // da_log, ddt_bias without the gate
    const double e = RelRmsError(*a, *b);
    std::printf(" %s %.2e", name, e);
    EXPECT_LT(e, tol) << name;
  }
  std::printf("\n");
}

TEST(KdaGpu, InputTransformsMatchCpuReference) {
  SKIP_WITHOUT_GPU();
  CheckTransforms({2, 200, 3, 128, 128}, DType::kBF16, DType::kF32, KdaGateKind::kBounded, {}, 800);
  CheckTransforms({1, 300, 2, 64, 64}, DType::kBF16, DType::kBF16, KdaGateKind::kOriginal,
                  {1, 0, 120, 179}, 801);
  CheckTransforms({1, 4096, 2, 128, 64}, DType::kBF16, DType::kF32, KdaGateKind::kBounded, {},
                  802);  // the segment split
  CheckTransforms({2, 100, 2, 64, 32}, DType::kF32, DType::kF32, KdaGateKind::kBounded, {}, 803);
  CheckTransforms({1, 150, 2, 32, 48}, DType::kF32, DType::kF32, KdaGateKind::kOriginal, {70, 80},
                  804);
  // The tensor-core backward applies the transforms itself: from a kept forward, and with each
  // transform alone (the others off).
  CheckTransforms({2, 200, 3, 128, 128}, DType::kBF16, DType::kBF16, KdaGateKind::kBounded, {}, 805,
                  {.keep = true});
  CheckTransforms({1, 300, 2, 64, 128}, DType::kBF16, DType::kF32, KdaGateKind::kOriginal,
                  {1, 0, 120, 179}, 806, {.keep = true});
  CheckTransforms({1, 130, 2, 128, 64}, DType::kBF16, DType::kF32, KdaGateKind::kBounded, {}, 807,
                  {.beta_sigmoid = false, .gate = false});
  CheckTransforms({1, 130, 2, 64, 64}, DType::kBF16, DType::kBF16, KdaGateKind::kBounded, {}, 808,
                  {.qk_l2norm = false, .gate = false});
  CheckTransforms({1, 130, 2, 128, 128}, DType::kBF16, DType::kF32, KdaGateKind::kBounded, {}, 809,
                  {.qk_l2norm = false, .beta_sigmoid = false});
}

TEST(KdaGpu, BackwardRefusesWideValues) {
  SKIP_WITHOUT_GPU();
  const KdaInputs x = RandomKdaInputs({1, 8, 1, 16, 160}, DType::kF32, 1, false);
  const KdaInputs g = GpuInputs(x, DType::kF32);
  KdaGrads grads;
  const Status s = KdaBackward(g, ToGpu(x.v, DType::kF32), Tensor(), KdaOptions(), &grads);
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented);
}

}  // namespace
}  // namespace orrery::kernels
