// The CPU KDA reference: chunked == naive recurrence, backward == fp64 finite differences,
// packed rows == sequences alone, decode == recurrent forward, and clear errors on bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/kda.h"
#include "tests/unit/kernels/kda_test_util.h"

namespace orrery::kernels {
namespace {

using testing::KdaShape;
using testing::MaxRelError;
using testing::RandomKdaInputs;
using testing::RandomNormal;

KdaOutputs RunKda(const KdaInputs& in, KdaAlgorithm algorithm, int chunk) {
  KdaOptions options;
  options.algorithm = algorithm;
  options.chunk_size = chunk;
  KdaOutputs out;
  const Status s = KdaForward(in, options, &out);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return out;
}

// (shape, chunk, with initial state)
using ChunkCase = std::tuple<KdaShape, int, bool>;
class KdaChunkedVsRecurrent : public ::testing::TestWithParam<ChunkCase> {};

TEST_P(KdaChunkedVsRecurrent, OutputsAndFinalStateMatchInF64) {
  const auto& [shape, chunk, with_state] = GetParam();
  const KdaInputs in = RandomKdaInputs(shape, DType::kF64, 11 + chunk + shape.t, with_state);
  const KdaOutputs ref = RunKda(in, KdaAlgorithm::kRecurrent, 0);
  const KdaOutputs got = RunKda(in, KdaAlgorithm::kChunked, chunk);
  // Both are exact algorithms in f64; only summation order differs.
  EXPECT_LT(MaxRelError(got.o, ref.o), 1e-10);
  EXPECT_LT(MaxRelError(got.final_state, ref.final_state), 1e-10);
}

INSTANTIATE_TEST_SUITE_P(Shapes, KdaChunkedVsRecurrent,
                         ::testing::Values(ChunkCase{{1, 1, 1, 8, 8}, 16, false},
                                           ChunkCase{{1, 37, 1, 8, 8}, 16, true},
                                           ChunkCase{{2, 100, 3, 16, 8}, 64, true},
                                           ChunkCase{{2, 64, 2, 8, 16}, 16, false},
                                           ChunkCase{{1, 130, 4, 32, 32}, 64, true},
                                           ChunkCase{{1, 77, 2, 24, 12}, 32, true}));

TEST(KdaChunked, UnboundedOriginalGateStaysExact) {
  // Decays far below the bounded range (down to -40 per step): the pairwise exponents stay <= 0.
  const KdaInputs in = RandomKdaInputs({1, 150, 2, 16, 16}, DType::kF64, 5, true, -40.0);
  const KdaOutputs ref = RunKda(in, KdaAlgorithm::kRecurrent, 0);
  for (int chunk : {16, 64}) {
    const KdaOutputs got = RunKda(in, KdaAlgorithm::kChunked, chunk);
    EXPECT_LT(MaxRelError(got.o, ref.o), 1e-10) << chunk;
    EXPECT_LT(MaxRelError(got.final_state, ref.final_state), 1e-10) << chunk;
  }
}

TEST(KdaChunked, F32AgreesWithF64Recurrence) {
  const KdaShape shape{2, 200, 2, 32, 32};
  const KdaInputs in64 = RandomKdaInputs(shape, DType::kF64, 3, true);
  const KdaInputs in32 = RandomKdaInputs(shape, DType::kF32, 3, true);
  const KdaOutputs ref = RunKda(in64, KdaAlgorithm::kRecurrent, 0);
  for (auto [algorithm, chunk] :
       {std::pair{KdaAlgorithm::kChunked, 64}, std::pair{KdaAlgorithm::kChunked, 16},
        std::pair{KdaAlgorithm::kRecurrent, 0}}) {
    const KdaOutputs got = RunKda(in32, algorithm, chunk);
    // The inputs were rounded to f32 (relative 6e-8) and 200 steps accumulate; 1e-5 is ~100x that.
    EXPECT_LT(MaxRelError(got.o, ref.o), 1e-5);
    EXPECT_LT(MaxRelError(got.final_state, ref.final_state), 1e-5);
  }
}

// Packs sequences of the given lengths into one row and checks every sequence against a run of
// that sequence alone (outputs and final states), for both algorithms.
void CheckPacked(const std::vector<int64_t>& lengths, KdaAlgorithm algorithm, int chunk) {
  int64_t total = 0;
  std::vector<int64_t> cu = {0};
  for (int64_t len : lengths) cu.push_back(total += len);
  const int64_t n = static_cast<int64_t>(lengths.size());
  const KdaShape shape{1, total, 2, 8, 12};
  KdaInputs packed = RandomKdaInputs(shape, DType::kF64, 21, false);
  PhiloxGenerator rng(22, 0);
  packed.initial_state = RandomNormal({n, 2, 8, 12}, DType::kF64, rng);
  packed.cu_seqlens = Tensor::FromVector<int64_t>({n + 1}, cu);
  const KdaOutputs all = RunKda(packed, algorithm, chunk);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t len = lengths[i];
    KdaInputs one;
    auto rows = [&](const Tensor& t) {
      Shape s = t.shape();
      s[1] = len;
      Tensor flat = t.Reshape({t.shape()[1], t.numel() / t.shape()[1]}).value();
      return flat.Slice(cu[i], cu[i + 1]).value().Clone().Reshape(s).value();
    };
    one.q = rows(packed.q);
    one.k = rows(packed.k);
    one.v = rows(packed.v);
    one.g = rows(packed.g);
    one.beta = rows(packed.beta);
    one.initial_state = packed.initial_state.Slice(i, i + 1).value().Clone();
    const KdaOutputs alone = RunKda(one, algorithm, chunk);
    EXPECT_LT(MaxRelError(rows(all.o), alone.o), 1e-12) << "sequence " << i;
    EXPECT_LT(MaxRelError(all.final_state.Slice(i, i + 1).value(), alone.final_state), 1e-12)
        << "sequence " << i;
  }
}

TEST(KdaPacked, RowsEqualSequencesAlone) {
  const std::vector<int64_t> lengths = {5, 0, 70, 16, 33};  // includes an empty sequence
  CheckPacked(lengths, KdaAlgorithm::kChunked, 16);
  CheckPacked(lengths, KdaAlgorithm::kChunked, 64);
  CheckPacked(lengths, KdaAlgorithm::kRecurrent, 0);
}

// Loss = <o, wo> + <final_state, ws> with fixed random weights; the backward gets do = wo,
// d_final_state = ws. Every element of every input is checked against central differences.
// With `transforms`, the inputs are the raw ones (and a_log / dt_bias are checked too).
void CheckGradients(const KdaInputs& base, KdaAlgorithm algorithm, int chunk,
                    const KdaInputTransforms& transforms = {}) {
  KdaOptions options;
  options.transforms = transforms;
  options.algorithm = algorithm;
  options.chunk_size = chunk;
  KdaOutputs out0;
  ASSERT_TRUE(KdaForward(base, options, &out0).ok());
  PhiloxGenerator rng(99, 1);
  const Tensor wo = RandomNormal(out0.o.shape(), DType::kF64, rng);
  const Tensor ws = RandomNormal(out0.final_state.shape(), DType::kF64, rng);
  auto loss = [&](const KdaInputs& in) {
    KdaOutputs out;
    EXPECT_TRUE(KdaForward(in, options, &out).ok());
    double l = 0;
    for (int64_t i = 0; i < out.o.numel(); ++i) l += out.o.data<double>()[i] * wo.data<double>()[i];
    for (int64_t i = 0; i < out.final_state.numel(); ++i) {
      l += out.final_state.data<double>()[i] * ws.data<double>()[i];
    }
    return l;
  };
  KdaGrads grads;
  const Status s = KdaBackward(base, wo, ws, options, &grads);
  ASSERT_TRUE(s.ok()) << s.ToString();
  const std::pair<const char*, Tensor KdaInputs::*> inputs[] = {
      {"q", &KdaInputs::q},         {"k", &KdaInputs::k},
      {"v", &KdaInputs::v},         {"g", &KdaInputs::g},
      {"beta", &KdaInputs::beta},   {"initial_state", &KdaInputs::initial_state},
      {"a_log", &KdaInputs::a_log}, {"dt_bias", &KdaInputs::dt_bias}};
  const Tensor* analytic[] = {&grads.dq,     &grads.dk,      &grads.dv,
                              &grads.dg,     &grads.dbeta,   &grads.dinitial_state,
                              &grads.da_log, &grads.ddt_bias};
  for (int i = 0; i < 8; ++i) {
    const auto& [name, member] = inputs[i];
    if (!(base.*member).defined()) continue;
    ASSERT_TRUE(analytic[i]->defined()) << name;
    KdaInputs in = base;
    in.*member = (base.*member).Clone();
    double* x = (in.*member).data<double>();
    double worst = 0;
    for (int64_t j = 0; j < (in.*member).numel(); ++j) {
      const double saved = x[j], eps = 1e-6;
      x[j] = saved + eps;
      const double lp = loss(in);
      x[j] = saved - eps;
      const double lm = loss(in);
      x[j] = saved;
      const double fd = (lp - lm) / (2 * eps);
      const double got = analytic[i]->data<double>()[j];
      worst = std::max(worst, std::abs(got - fd) / (1.0 + std::abs(fd)));
    }
    // Central differences at eps = 1e-6 in f64: truncation ~eps^2, rounding ~1e-16/eps = 1e-10.
    EXPECT_LT(worst, 1e-7) << name;
  }
}

TEST(KdaBackward, ChunkedC16MatchesFiniteDifferences) {
  CheckGradients(RandomKdaInputs({1, 20, 2, 4, 3}, DType::kF64, 7, true), KdaAlgorithm::kChunked,
                 16);
}

TEST(KdaBackward, ChunkedC64MatchesFiniteDifferencesWithTwoBatchRows) {
  CheckGradients(RandomKdaInputs({2, 66, 1, 3, 2}, DType::kF64, 8, true), KdaAlgorithm::kChunked,
                 64);
}

TEST(KdaBackward, RecurrentMatchesFiniteDifferencesAcrossSegments) {
  // 70 tokens span two of the recurrent backward's 64-token checkpoint segments.
  CheckGradients(RandomKdaInputs({1, 70, 1, 3, 2}, DType::kF64, 9, true), KdaAlgorithm::kRecurrent,
                 0);
}

TEST(KdaBackward, PackedSequencesMatchFiniteDifferences) {
  KdaInputs in = RandomKdaInputs({1, 29, 2, 4, 3}, DType::kF64, 10, false);
  PhiloxGenerator rng(12, 0);
  in.initial_state = RandomNormal({3, 2, 4, 3}, DType::kF64, rng);
  in.cu_seqlens = Tensor::FromVector<int64_t>({4}, {0, 11, 12, 29});
  CheckGradients(in, KdaAlgorithm::kChunked, 16);
}

// The op's input transforms (q/k L2 norm, beta sigmoid, gate activation from z, A_log and
// dt_bias): every raw input's gradient, a_log's and dt_bias's against central differences through
// the whole transformed op, for both gate forms; and the forward equals the transforms applied by
// hand (the reference functions) followed by the plain op, exactly.
TEST(KdaBackward, InputTransformsMatchFiniteDifferences) {
  for (const KdaGateKind kind : {KdaGateKind::kBounded, KdaGateKind::kOriginal}) {
    KdaInputs raw = RandomKdaInputs({1, 21, 2, 4, 3}, DType::kF64, 14, true);
    PhiloxGenerator rng(15, 0);
    raw.q = RandomNormal(raw.q.shape(), DType::kF64, rng);  // not normalised: the op does it
    raw.k = RandomNormal(raw.k.shape(), DType::kF64, rng);
    raw.g = RandomNormal(raw.g.shape(), DType::kF64, rng);        // the gate's pre-activation z
    raw.beta = RandomNormal(raw.beta.shape(), DType::kF64, rng);  // a logit
    raw.a_log = testing::RandomUniform({2}, DType::kF64, rng, -1.0, 0.5);
    raw.dt_bias = RandomNormal({8}, DType::kF64, rng);
    KdaInputTransforms t;
    t.qk_l2norm = t.beta_sigmoid = t.gate = true;
    t.gate_kind = kind;
    t.gate_lower_bound = -5.0f;
    KdaOptions with;
    with.transforms = t;
    KdaOutputs fused, by_hand;
    ASSERT_TRUE(KdaForward(raw, with, &fused).ok());
    KdaInputs prepared = raw;
    prepared.a_log = prepared.dt_bias = Tensor();
    Tensor rstd;
    ASSERT_TRUE(KdaL2NormForward(raw.q, t.l2norm_eps, &prepared.q, &rstd).ok());
    ASSERT_TRUE(KdaL2NormForward(raw.k, t.l2norm_eps, &prepared.k, &rstd).ok());
    for (int64_t i = 0; i < raw.beta.numel(); ++i) {
      prepared.beta.data<double>()[i] = 1.0 / (1.0 + std::exp(-raw.beta.data<double>()[i]));
    }
    ASSERT_TRUE(KdaGateForward(raw.g, raw.a_log, raw.dt_bias, kind, -5.0f, &prepared.g).ok());
    ASSERT_TRUE(KdaForward(prepared, KdaOptions(), &by_hand).ok());
    EXPECT_EQ(MaxRelError(fused.o, by_hand.o), 0.0);
    EXPECT_EQ(MaxRelError(fused.final_state, by_hand.final_state), 0.0);
    CheckGradients(raw, KdaAlgorithm::kChunked, 16, t);
  }
}

TEST(KdaErrors, InputTransformParametersAreChecked) {
  KdaInputs in = RandomKdaInputs({1, 8, 2, 4, 3}, DType::kF32, 16, false);
  KdaOutputs out;
  KdaOptions options;
  in.a_log = Tensor::Zeros({2}, DType::kF32);
  Status s = KdaForward(in, options, &out);  // a_log without the gate transform
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("transforms.gate is off"), std::string::npos) << s.message();
  options.transforms.gate = true;
  in.a_log = Tensor::Zeros({3}, DType::kF32);  // H = 2
  s = KdaForward(in, options, &out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("a_log"), std::string::npos) << s.message();
  in.a_log = Tensor::Zeros({2}, DType::kF32);
  options.transforms.gate_lower_bound = 1.0f;
  s = KdaForward(in, options, &out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("gate_lower_bound"), std::string::npos) << s.message();
}

TEST(KdaBackward, ChunkedEqualsRecurrentAtLargerShapes) {
  const KdaInputs in = RandomKdaInputs({2, 150, 3, 16, 24}, DType::kF64, 13, true);
  PhiloxGenerator rng(14, 0);
  const Tensor d_o = RandomNormal(in.v.shape(), DType::kF64, rng);
  KdaOptions rec;
  rec.algorithm = KdaAlgorithm::kRecurrent;
  KdaGrads ref;
  ASSERT_TRUE(KdaBackward(in, d_o, Tensor(), rec, &ref).ok());  // no d_final_state: zeros
  for (int chunk : {16, 64}) {
    KdaOptions ch;
    ch.chunk_size = chunk;
    KdaGrads got;
    ASSERT_TRUE(KdaBackward(in, d_o, Tensor(), ch, &got).ok());
    EXPECT_LT(MaxRelError(got.dq, ref.dq), 1e-10);
    EXPECT_LT(MaxRelError(got.dk, ref.dk), 1e-10);
    EXPECT_LT(MaxRelError(got.dv, ref.dv), 1e-10);
    EXPECT_LT(MaxRelError(got.dg, ref.dg), 1e-10);
    EXPECT_LT(MaxRelError(got.dbeta, ref.dbeta), 1e-10);
    EXPECT_LT(MaxRelError(got.dinitial_state, ref.dinitial_state), 1e-10);
  }
}

TEST(KdaDecode, StepsEqualRecurrentForward) {
  const KdaShape shape{3, 25, 2, 16, 8};
  for (DType dt : {DType::kF64, DType::kF32}) {
    const KdaInputs in = RandomKdaInputs(shape, dt, 31, true);
    KdaOptions options;
    options.algorithm = KdaAlgorithm::kRecurrent;
    KdaOutputs ref;
    ASSERT_TRUE(KdaForward(in, options, &ref).ok());
    Tensor state = in.initial_state.Clone();
    Tensor o;
    auto token = [&](const Tensor& t, int64_t step) {
      // [B, T, ...] -> [B, ...] at `step`.
      Shape s = t.shape();
      s.erase(s.begin() + 1);
      Tensor out = Tensor::Empty(s, t.dtype());
      const int64_t per = t.numel() / (t.dim(0) * t.dim(1));
      const size_t esz = DTypeSize(t.dtype());
      for (int64_t b = 0; b < t.dim(0); ++b) {
        std::memcpy(static_cast<char*>(out.raw_data()) + b * per * esz,
                    static_cast<char*>(t.raw_data()) + (b * t.dim(1) + step) * per * esz,
                    per * esz);
      }
      return out;
    };
    double worst = 0;
    for (int64_t step = 0; step < shape.t; ++step) {
      ASSERT_TRUE(KdaDecodeStep(token(in.q, step), token(in.k, step), token(in.v, step),
                                token(in.g, step), token(in.beta, step), 0.0f, &state, &o)
                      .ok());
      worst = std::max(worst, MaxRelError(o, token(ref.o, step)));
    }
    // The decode step performs the recurrent forward's operations in the same order.
    EXPECT_EQ(worst, 0.0) << DTypeName(dt);
    EXPECT_EQ(MaxRelError(state, ref.final_state), 0.0) << DTypeName(dt);
  }
}

// The inference engine's decode step: raw inputs with the op's transforms, and states as rows of
// a table (in a scrambled order, some rows untouched), against KdaForward with the same
// transforms on one-token sequences from the gathered states (recurrent algorithm).
TEST(KdaDecode, TransformsAndStateRowsEqualForwardFromGatheredStates) {
  const int64_t n = 3, h = 2, kd = 16, vd = 8, table = 6;
  const std::vector<int32_t> rows = {4, 0, 2};
  for (KdaGateKind kind : {KdaGateKind::kBounded, KdaGateKind::kOriginal}) {
    PhiloxGenerator rng(77 + static_cast<int>(kind), 3);
    const Tensor q = RandomNormal({n, h, kd}, DType::kF64, rng);
    const Tensor k = RandomNormal({n, h, kd}, DType::kF64, rng);
    const Tensor v = RandomNormal({n, h, vd}, DType::kF64, rng);
    const Tensor z = RandomNormal({n, h, kd}, DType::kF64, rng);
    const Tensor beta = RandomNormal({n, h}, DType::kF64, rng);
    const Tensor a_log = RandomNormal({h}, DType::kF64, rng);
    const Tensor dt_bias = RandomNormal({h * kd}, DType::kF64, rng);
    Tensor states = RandomNormal({table, h, kd, vd}, DType::kF64, rng);
    const Tensor before = states.Clone();

    KdaDecodeOptions o;
    o.transforms.qk_l2norm = o.transforms.beta_sigmoid = o.transforms.gate = true;
    o.transforms.gate_kind = kind;
    o.a_log = a_log;
    o.dt_bias = dt_bias;
    o.rows = Tensor::FromVector<int32_t>({n}, rows);
    Tensor out;
    ASSERT_TRUE(KdaDecodeStep(q, k, v, z, beta, o, &states, &out).ok());

    KdaInputs in;
    in.q = q.Reshape({1, n, h, kd}).value();
    in.k = k.Reshape({1, n, h, kd}).value();
    in.v = v.Reshape({1, n, h, vd}).value();
    in.g = z.Reshape({1, n, h, kd}).value();
    in.beta = beta.Reshape({1, n, h}).value();
    in.a_log = a_log;
    in.dt_bias = dt_bias;
    in.cu_seqlens = Tensor::FromVector<int64_t>({n + 1}, {0, 1, 2, 3});
    in.initial_state = Tensor::Empty({n, h, kd, vd}, DType::kF64);
    const int64_t row = h * kd * vd;
    for (int64_t i = 0; i < n; ++i) {
      std::memcpy(in.initial_state.data<double>() + i * row, before.data<double>() + rows[i] * row,
                  row * sizeof(double));
    }
    KdaOptions fo;
    fo.algorithm = KdaAlgorithm::kRecurrent;
    fo.transforms = o.transforms;
    KdaOutputs ref;
    ASSERT_TRUE(KdaForward(in, fo, &ref).ok());
    EXPECT_LT(MaxRelError(out, ref.o.Reshape({n, h, vd}).value()), 1e-12);
    for (int64_t r = 0; r < table; ++r) {
      const auto at = std::find(rows.begin(), rows.end(), static_cast<int32_t>(r));
      const Tensor got = states.Slice(r, r + 1).value();
      if (at == rows.end()) {
        EXPECT_EQ(MaxRelError(got, before.Slice(r, r + 1).value()), 0.0) << "row " << r;
      } else {
        const int64_t i = at - rows.begin();
        EXPECT_LT(MaxRelError(got, ref.final_state.Slice(i, i + 1).value()), 1e-12) << "row " << r;
      }
    }
  }
  // A padding row (-1) computes from a zero state and writes nothing: its output is a
  // one-token forward from no initial state; the table is untouched.
  {
    PhiloxGenerator rng(9, 9);
    const Tensor q = RandomNormal({1, h, kd}, DType::kF64, rng);
    const Tensor k = RandomNormal({1, h, kd}, DType::kF64, rng);
    const Tensor v = RandomNormal({1, h, vd}, DType::kF64, rng);
    const Tensor z = RandomNormal({1, h, kd}, DType::kF64, rng);
    const Tensor beta = RandomNormal({1, h}, DType::kF64, rng);
    Tensor states = RandomNormal({table, h, kd, vd}, DType::kF64, rng), out;
    const Tensor before = states.Clone();
    KdaDecodeOptions o;
    o.transforms.qk_l2norm = o.transforms.beta_sigmoid = o.transforms.gate = true;
    o.rows = Tensor::FromVector<int32_t>({1}, {-1});
    ASSERT_TRUE(KdaDecodeStep(q, k, v, z, beta, o, &states, &out).ok());
    EXPECT_EQ(MaxRelError(states, before), 0.0);
    KdaInputs in;
    in.q = q.Reshape({1, 1, h, kd}).value();
    in.k = k.Reshape({1, 1, h, kd}).value();
    in.v = v.Reshape({1, 1, h, vd}).value();
    in.g = z.Reshape({1, 1, h, kd}).value();
    in.beta = beta.Reshape({1, 1, h}).value();
    KdaOptions fo;
    fo.algorithm = KdaAlgorithm::kRecurrent;
    fo.transforms = o.transforms;
    KdaOutputs ref;
    ASSERT_TRUE(KdaForward(in, fo, &ref).ok());
    EXPECT_LT(MaxRelError(out, ref.o.Reshape({1, h, vd}).value()), 1e-12);
  }
  // A row outside the table is one clear error.
  PhiloxGenerator rng(5, 5);
  const Tensor q = RandomNormal({1, h, kd}, DType::kF64, rng);
  const Tensor v = RandomNormal({1, h, vd}, DType::kF64, rng);
  const Tensor beta = RandomNormal({1, h}, DType::kF64, rng);
  Tensor states = RandomNormal({table, h, kd, vd}, DType::kF64, rng), out;
  KdaDecodeOptions o;
  o.rows = Tensor::FromVector<int32_t>({1}, {6});
  const Status st = KdaDecodeStep(q, q, v, q, beta, o, &states, &out);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("rows[0] = 6 is outside the state table [0, 6)"), std::string::npos)
      << st.message();
}

TEST(KdaErrors, BadInputsGetOneClearLine) {
  KdaInputs in = RandomKdaInputs({2, 10, 2, 8, 8}, DType::kF64, 1, false);
  KdaOutputs out;
  KdaOptions options;
  KdaInputs bad = in;
  bad.g = RandomKdaInputs({2, 10, 2, 4, 8}, DType::kF64, 1, false).g;
  Status s = KdaForward(bad, options, &out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("g f64[2, 10, 2, 4]"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("expected shape [2, 10, 2, 8]"), std::string::npos) << s.message();

  bad = in;
  bad.cu_seqlens = Tensor::FromVector<int64_t>({2}, {0, 10});
  s = KdaForward(bad, options, &out);
  EXPECT_NE(s.message().find("expected B = 1"), std::string::npos) << s.message();

  KdaInputs one = RandomKdaInputs({1, 10, 2, 8, 8}, DType::kF64, 1, false);
  one.cu_seqlens = Tensor::FromVector<int64_t>({3}, {0, 4, 9});
  s = KdaForward(one, options, &out);
  EXPECT_NE(s.message().find("end at T = 10"), std::string::npos) << s.message();

  options.chunk_size = 48;
  s = KdaForward(in, options, &out);
  EXPECT_NE(s.message().find("chunk_size 48"), std::string::npos) << s.message();

  options.chunk_size = 64;
  bad = in;
  bad.beta = bad.beta.Cast(DType::kF32).value();
  s = KdaForward(bad, options, &out);
  EXPECT_NE(s.message().find("beta f32"), std::string::npos) << s.message();

  bad = in;
  bad.initial_state = Tensor::Zeros({2, 2, 8, 4}, DType::kF32);
  s = KdaForward(bad, options, &out);
  EXPECT_NE(s.message().find("initial_state"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace orrery::kernels
