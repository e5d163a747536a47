// The CPU twins of the GPU model's sequence and gating ops (kernels/short_conv.h, the Tensor forms
// of kernels/attn_res.h, kernels/gates.h): the short conv against its definition and fp64 finite
// differences, the Tensor forms against the templates, and their bad-input errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "core/half.h"
#include "core/philox.h"
#include "kernels/attn_res.h"
#include "kernels/gates.h"
#include "kernels/short_conv.h"
#include "tests/unit/kernels/kda_test_util.h"

namespace orrery::kernels {
namespace {

using testing::RandomNormal;

double* D(const Tensor& t) { return t.data<double>(); }

// Every entry of `x` perturbed by +-1e-6: central differences of `loss` against `grad`.
void ExpectFiniteDifferences(const Tensor& x, const Tensor& grad,
                             const std::function<double()>& loss, const char* what) {
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double old = D(x)[i], e = 1e-6;
    D(x)[i] = old + e;
    const double lp = loss();
    D(x)[i] = old - e;
    const double lm = loss();
    D(x)[i] = old;
    EXPECT_NEAR(D(grad)[i], (lp - lm) / (2 * e), 1e-7 * std::max(1.0, std::abs(D(grad)[i])))
        << what << "[" << i << "]";
  }
}

// One InvalidArgument line that contains `want`.
void ExpectInvalid(const Status& st, const std::string& want) {
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find(want), std::string::npos) << st.ToString();
  EXPECT_EQ(st.message().find('\n'), std::string::npos) << st.ToString();
}

// Documents of lengths 1, 3, 0 (empty), 6, 1, 2: ragged, single tokens, shorter than W.
const std::vector<int64_t> kCu = {0, 1, 4, 4, 10, 11, 13};
Tensor Cu() { return Tensor::FromVector<int64_t>({static_cast<int64_t>(kCu.size())}, kCu); }

TEST(ShortConvTest, ForwardMatchesItsDefinitionPerDocument) {
  const int64_t n = kCu.back(), c = 5, width = 4;
  PhiloxGenerator rng(1, 0);
  const Tensor x = RandomNormal({n, c}, DType::kF64, rng),
               w = RandomNormal({c, width}, DType::kF64, rng);
  Tensor y;
  ASSERT_TRUE(ShortConvSilu(x, w, Cu(), &y).ok());
  for (size_t d = 0; d + 1 < kCu.size(); ++d) {
    for (int64_t t = kCu[d]; t < kCu[d + 1]; ++t) {
      for (int64_t ch = 0; ch < c; ++ch) {
        // The document on its own, zero-padded with W - 1 tokens in front.
        double a = 0;
        for (int64_t back = 0; back < width; ++back) {
          if (t - back >= kCu[d])
            a += D(w)[ch * width + width - 1 - back] * D(x)[(t - back) * c + ch];
        }
        EXPECT_NEAR(D(y)[t * c + ch], a / (1 + std::exp(-a)), 1e-14) << t << ", " << ch;
      }
    }
  }
}

// The decode form over several steps equals the forward over each sequence's whole history (the
// rows of a history table in a scrambled order; an untouched row stays as it was).
TEST(ShortConvTest, DecodeStepsEqualTheForwardOverTheWholeSequence) {
  for (int64_t width : {1, 2, 4, 7}) {
    const int64_t c = 5, steps = 6, seqs = 3, table = 5;
    const std::vector<int32_t> rows = {3, 0, 4};
    PhiloxGenerator rng(30 + width, 0);
    const Tensor w = RandomNormal({c, width}, DType::kF64, rng);
    const Tensor xs = RandomNormal({seqs * steps, c}, DType::kF64, rng);  // [seq][step] rows
    Tensor hist;
    if (width > 1) {
      hist = Tensor::Zeros({table, width - 1, c}, DType::kF64);
      D(hist)[1 * (width - 1) * c] = 7.0;  // row 1 is nobody's: must stay
    }
    std::vector<double> got(static_cast<size_t>(seqs * steps * c));
    for (int64_t t = 0; t < steps; ++t) {
      Tensor x = Tensor::Empty({seqs, c}, DType::kF64), y;
      for (int64_t i = 0; i < seqs; ++i) {
        std::copy_n(D(xs) + (i * steps + t) * c, c, D(x) + i * c);
      }
      ASSERT_TRUE(
          ShortConvSiluDecode(x, w, Tensor::FromVector<int32_t>({seqs}, rows), &hist, &y).ok());
      for (int64_t i = 0; i < seqs; ++i) {
        std::copy_n(D(y) + i * c, c, got.data() + (i * steps + t) * c);
      }
    }
    Tensor ref;
    const Tensor cu = Tensor::FromVector<int64_t>({seqs + 1}, {0, steps, 2 * steps, 3 * steps});
    ASSERT_TRUE(ShortConvSilu(xs, w, cu, &ref).ok());
    for (int64_t e = 0; e < ref.numel(); ++e) {
      EXPECT_NEAR(got[static_cast<size_t>(e)], D(ref)[e], 1e-14) << "width " << width << " " << e;
    }
    if (width > 1) {
      EXPECT_EQ(D(hist)[1 * (width - 1) * c], 7.0);
      // Row rows[i] holds the last W - 1 inputs of sequence i.
      for (int64_t i = 0; i < seqs; ++i) {
        for (int64_t j = 0; j < width - 1; ++j) {
          const int64_t t = steps - (width - 1) + j;
          for (int64_t ch = 0; ch < c; ++ch) {
            const double want = t >= 0 ? D(xs)[(i * steps + t) * c + ch] : 0.0;
            EXPECT_EQ(D(hist)[(rows[i] * (width - 1) + j) * c + ch], want);
          }
        }
      }
    }
  }
  // A padding row (-1) sees a zero history and writes none.
  {
    PhiloxGenerator rng(3, 3);
    const int64_t c = 4, width = 3;
    const Tensor w = RandomNormal({c, width}, DType::kF64, rng);
    const Tensor x = RandomNormal({1, c}, DType::kF64, rng);
    Tensor hist = RandomNormal({2, width - 1, c}, DType::kF64, rng), y, ref;
    const Tensor before = hist.Clone();
    ASSERT_TRUE(ShortConvSiluDecode(x, w, Tensor::FromVector<int32_t>({1}, {-1}), &hist, &y).ok());
    for (int64_t e = 0; e < hist.numel(); ++e) EXPECT_EQ(D(hist)[e], D(before)[e]);
    ASSERT_TRUE(ShortConvSilu(x, w, Tensor::FromVector<int64_t>({2}, {0, 1}), &ref).ok());
    for (int64_t e = 0; e < c; ++e) EXPECT_NEAR(D(y)[e], D(ref)[e], 1e-15);
  }
  // A row outside the table is one clear line.
  const Tensor w = Tensor::Zeros({2, 3}, DType::kF32), x = Tensor::Zeros({1, 2}, DType::kF32);
  Tensor hist = Tensor::Zeros({2, 2, 2}, DType::kF32), y;
  ExpectInvalid(ShortConvSiluDecode(x, w, Tensor::FromVector<int32_t>({1}, {2}), &hist, &y),
                "rows[0] = 2 is outside the history table [0, 2)");
  ExpectInvalid(ShortConvSiluDecode(x, w, Tensor::FromVector<int32_t>({2}, {0, 1}), &hist, &y),
                "rows");
}

TEST(ShortConvTest, GradientsMatchFiniteDifferences) {
  for (int64_t width : {1, 4, 7}) {
    const int64_t n = kCu.back(), c = 3;
    PhiloxGenerator rng(2 + width, 0);
    const Tensor x = RandomNormal({n, c}, DType::kF64, rng);
    const Tensor w = RandomNormal({c, width}, DType::kF64, rng, 0.7);
    const Tensor r = RandomNormal({n, c}, DType::kF64, rng);
    const Tensor cu = Cu();
    auto loss = [&]() {
      Tensor y;
      EXPECT_TRUE(ShortConvSilu(x, w, cu, &y).ok());
      double s = 0;
      for (int64_t i = 0; i < y.numel(); ++i) s += D(y)[i] * D(r)[i];
      return s;
    };
    Tensor dx = RandomNormal({n, c}, DType::kF64, rng);                         // overwritten
    Tensor dw0 = RandomNormal({c, width}, DType::kF64, rng), dw = dw0.Clone();  // accumulated
    ASSERT_TRUE(ShortConvSiluGrad(x, w, cu, r, &dx, &dw).ok());
    for (int64_t i = 0; i < dw.numel(); ++i) D(dw)[i] -= D(dw0)[i];
    ExpectFiniteDifferences(x, dx, loss, "dx");
    ExpectFiniteDifferences(w, dw, loss, "dw");
  }
}

TEST(ShortConvTest, RejectsBadInputs) {
  const Tensor x = Tensor::Zeros({13, 3}, DType::kF32), w = Tensor::Zeros({3, 4}, DType::kF32);
  Tensor y;
  ExpectInvalid(ShortConvSilu(x, Tensor::Zeros({3, 17}, DType::kF32), Cu(), &y),
                "short_conv: w f32[3, 17] on cpu, expected f32[3, W] with 1 <= W <= 16 on cpu");
  ExpectInvalid(ShortConvSilu(x, Tensor::Zeros({3, 4}, DType::kF64), Cu(), &y), "short_conv: w");
  ExpectInvalid(ShortConvSilu(Tensor::Zeros({13, 3}, DType::kBF16), w, Cu(), &y),
                "expected f32 or f64 on cpu");
  ExpectInvalid(ShortConvSilu(x, w, Tensor::FromVector<int64_t>({3}, {0, 5, 12}), &y),
                "short_conv: cu_seqlens must start at 0 and end at N = 13, got 0 .. 12");
  ExpectInvalid(ShortConvSilu(x, w, Tensor::FromVector<int64_t>({4}, {0, 7, 5, 13}), &y),
                "not non-decreasing at index 2");
  ExpectInvalid(ShortConvSilu(x, w, Tensor::FromVector<int32_t>({2}, {0, 13}), &y),
                "expected i64 [docs + 1]");
  Tensor dx, dw = Tensor::Zeros({3, 4}, DType::kF64);
  ExpectInvalid(ShortConvSiluGrad(x, w, Cu(), x, &dx, &dw), "short_conv: dw f64[3, 4]");
}

// With a host copy of the starts given (the GPU model's form: no read-back of the device copy),
// the host copy is what is checked, and it must have the device copy's shape.
TEST(ShortConvTest, HostStartsAreCheckedInsteadOfReadingBack) {
  const Tensor x = Tensor::Zeros({13, 3}, DType::kF32), w = Tensor::Zeros({3, 4}, DType::kF32);
  Tensor y;
  ExpectInvalid(
      ShortConvSilu(x, w, Cu(), Tensor::FromVector<int64_t>({7}, {0, 1, 4, 4, 10, 11, 12}), &y),
      "short_conv: cu_seqlens must start at 0 and end at N = 13, got 0 .. 12");
  ExpectInvalid(ShortConvSilu(x, w, Cu(), Tensor::FromVector<int64_t>({2}, {0, 13}), &y),
                "short_conv: cu_host i64[2] on cpu, expected i64 [7] on cpu");
  Tensor dx, dw;
  ExpectInvalid(
      ShortConvSiluGrad(x, w, Cu(), Tensor::FromVector<int32_t>({7}, {0, 1, 4, 4, 10, 11, 13}), x,
                        &dx, &dw),
      "short_conv: cu_host i32[7] on cpu, expected i64 [7] on cpu");
  // Valid: the same result as with the starts read from cu_seqlens.
  PhiloxGenerator rng(3, 1);
  const Tensor xr = RandomNormal({13, 3}, DType::kF32, rng),
               wr = RandomNormal({3, 4}, DType::kF32, rng);
  Tensor a, b;
  ASSERT_TRUE(ShortConvSilu(xr, wr, Cu(), &a).ok());
  ASSERT_TRUE(ShortConvSilu(xr, wr, Cu(), Cu(), &b).ok());
  for (int64_t i = 0; i < a.numel(); ++i) EXPECT_EQ(a.data<float>()[i], b.data<float>()[i]) << i;
}

// ---- AttnRes: the Tensor forms are the templates (checked against finite differences in
// model_ops_test.cc) behind the checks ----

TEST(AttnResMixTest, TensorFormsMatchTheTemplates) {
  const int64_t rows = 7, d = 10, n = 4;
  PhiloxGenerator rng(10, 0);
  std::vector<Tensor> src;
  for (int64_t i = 0; i < n; ++i) src.push_back(RandomNormal({rows, d}, DType::kF64, rng, 1.0 + i));
  const Tensor w = RandomNormal({d}, DType::kF64, rng), g = RandomNormal({d}, DType::kF64, rng);
  const Tensor dh = RandomNormal({rows, d}, DType::kF64, rng);
  std::vector<const double*> sp;
  for (const Tensor& s : src) sp.push_back(D(s));
  std::vector<double> h_ref(rows * d), p_ref(rows * n);
  AttnResForward(sp, rows, d, D(w), D(g), 1e-6, h_ref.data(), p_ref.data());

  Tensor h, p;
  ASSERT_TRUE(AttnResMix(src, w, g, 1e-6, &h, &p).ok());
  for (int64_t i = 0; i < rows * d; ++i) EXPECT_EQ(D(h)[i], h_ref[i]);
  for (int64_t i = 0; i < rows * n; ++i) EXPECT_EQ(D(p)[i], p_ref[i]);
  Tensor h2;
  ASSERT_TRUE(AttnResMix(src, w, g, 1e-6, &h2, nullptr).ok());  // p not saved
  for (int64_t i = 0; i < rows * d; ++i) EXPECT_EQ(D(h2)[i], h_ref[i]);

  // Source 1 skipped; the others and dw, dgamma accumulate onto what they held.
  std::vector<std::vector<double>> ds_ref(n, std::vector<double>(rows * d, 0.5));
  std::vector<double*> dsp;
  for (int64_t i = 0; i < n; ++i) dsp.push_back(i == 1 ? nullptr : ds_ref[i].data());
  std::vector<double> dw_ref(d, 0.25), dg_ref(d, 0.25);
  AttnResBackward(sp, rows, d, D(w), D(g), 1e-6, p_ref.data(), D(dh), dsp, dw_ref.data(),
                  dg_ref.data());
  std::vector<Tensor> ds(n);
  for (int64_t i = 0; i < n; ++i) {
    if (i == 1) continue;
    ds[i] = Tensor::Empty({rows, d}, DType::kF64);
    for (int64_t j = 0; j < rows * d; ++j) D(ds[i])[j] = 0.5;
  }
  Tensor dw = Tensor::Empty({d}, DType::kF64), dg = Tensor::Empty({d}, DType::kF64);
  for (int64_t j = 0; j < d; ++j) D(dw)[j] = D(dg)[j] = 0.25;
  ASSERT_TRUE(AttnResMixGrad(src, w, g, 1e-6, p, dh, &ds, &dw, &dg).ok());
  EXPECT_FALSE(ds[1].defined());
  for (int64_t i = 0; i < n; ++i) {
    if (i == 1) continue;
    for (int64_t j = 0; j < rows * d; ++j) EXPECT_EQ(D(ds[i])[j], ds_ref[i][j]);
  }
  for (int64_t j = 0; j < d; ++j) {
    EXPECT_EQ(D(dw)[j], dw_ref[j]);
    EXPECT_EQ(D(dg)[j], dg_ref[j]);
  }
}

TEST(AttnResMixTest, RejectsBadInputs) {
  const Tensor a = Tensor::Zeros({3, 4}, DType::kF32), v = Tensor::Zeros({4}, DType::kF32);
  Tensor h, p;
  ExpectInvalid(AttnResMix({}, v, v, 1e-6, &h, &p), "attn_res: no sources");
  ExpectInvalid(AttnResMix({a, Tensor::Zeros({3, 5}, DType::kF32)}, v, v, 1e-6, &h, &p),
                "attn_res: sources[1] f32[3, 5] on cpu, expected f32[3, 4] on cpu");
  ExpectInvalid(AttnResMix({a}, Tensor::Zeros({5}, DType::kF32), v, 1e-6, &h, &p),
                "attn_res: w f32[5] on cpu, expected f32[4] on cpu");
  Tensor pf = Tensor::Zeros({3, 1}, DType::kF32), dh = a;
  std::vector<Tensor> ds(2);
  Tensor dw, dg;
  ExpectInvalid(AttnResMixGrad({a}, v, v, 1e-6, pf, dh, &ds, &dw, &dg),
                "attn_res: d_sources has 2 entries, expected 1");
  ds = {Tensor::Zeros({3, 4}, DType::kF64)};
  ExpectInvalid(AttnResMixGrad({a}, v, v, 1e-6, pf, dh, &ds, &dw, &dg),
                "attn_res: d_sources[0] f64[3, 4] on cpu, expected f32[3, 4] on cpu");
  ds = {Tensor()};
  ExpectInvalid(
      AttnResMixGrad({a}, v, v, 1e-6, Tensor::Zeros({3, 2}, DType::kF32), dh, &ds, &dw, &dg),
      "attn_res: p f32[3, 2] on cpu, expected f32[3, 1] on cpu");
}

// ---- gates ----

TEST(GatesTest, SigmoidGateGradientsMatchFiniteDifferences) {
  const int64_t n = 40;
  PhiloxGenerator rng(20, 0);
  const Tensor x = RandomNormal({n}, DType::kF64, rng, 2.0),
               z = RandomNormal({n}, DType::kF64, rng, 3.0);
  const Tensor r = RandomNormal({n}, DType::kF64, rng);
  auto loss = [&]() {
    Tensor y;
    EXPECT_TRUE(SigmoidGate(x, z, &y).ok());
    double s = 0;
    for (int64_t i = 0; i < n; ++i) s += D(y)[i] * D(r)[i];
    return s;
  };
  Tensor dx, dz;
  ASSERT_TRUE(SigmoidGateGrad(x, z, r, &dx, &dz).ok());
  ExpectFiniteDifferences(x, dx, loss, "dx");
  ExpectFiniteDifferences(z, dz, loss, "dz");
  Tensor s;
  ASSERT_TRUE(Sigmoid(z, &s).ok());
  for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(D(s)[i], 1 / (1 + std::exp(-D(z)[i])), 1e-15);
}

TEST(GatesTest, AddIntoAndCastInto) {
  const std::vector<float> xs = {1.0f, -2.5f, 3.0e-3f, 1.00390625f, 65504.0f};
  const Tensor x = Tensor::FromVector<float>({5}, xs);
  Tensor b = Tensor::Zeros({5}, DType::kBF16);
  ASSERT_TRUE(CastInto(x, &b).ok());
  const Tensor want = x.Cast(DType::kBF16).value();  // round to nearest even
  for (int64_t i = 0; i < 5; ++i)
    EXPECT_EQ(b.data<BFloat16>()[i].bits, want.data<BFloat16>()[i].bits);
  Tensor back = Tensor::Zeros({5}, DType::kF32);
  ASSERT_TRUE(CastInto(b, &back).ok());
  Tensor y = Tensor::FromVector<float>({5}, {1, 1, 1, 1, 1});
  ASSERT_TRUE(AddInto(b, -2.0f, &y).ok());  // bf16 into f32
  ASSERT_TRUE(AddInto(x, 0.5f, &y).ok());   // f32 into f32
  for (int64_t i = 0; i < 5; ++i) {
    EXPECT_EQ(back.data<float>()[i], BFloat16ToFloat(want.data<BFloat16>()[i]));
    EXPECT_EQ(y.data<float>()[i], 1.0f - 2.0f * back.data<float>()[i] + 0.5f * xs[i]);
  }
}

TEST(GatesTest, RejectBadInputs) {
  const Tensor x = Tensor::Zeros({2, 3}, DType::kF32);
  Tensor y;
  ExpectInvalid(SigmoidGate(x, Tensor::Zeros({3, 2}, DType::kF32), &y),
                "sigmoid_gate: z f32[3, 2] on cpu, expected f32[2, 3] on cpu");
  Tensor yb = Tensor::Zeros({2, 3}, DType::kBF16);
  ExpectInvalid(AddInto(x, 1.0f, &yb), "add_into: y bf16[2, 3] on cpu, expected f32 [2, 3] on cpu");
  ExpectInvalid(AddInto(Tensor::Zeros({2, 3}, DType::kBF16), 1.0f, &yb), "expected f32 [2, 3]");
  Tensor undefined;
  ExpectInvalid(CastInto(x, &undefined), "cast_into: y is undefined, expected f32 or bf16");
  Tensor y64 = Tensor::Zeros({2, 3}, DType::kF64);
  ExpectInvalid(CastInto(x, &y64), "cast_into: y f64[2, 3] on cpu, expected f32 or bf16 [2, 3]");
  Tensor s32 = Tensor::Zeros({2, 3}, DType::kF32);
  ExpectInvalid(Sigmoid(Tensor::Zeros({2, 3}, DType::kF64), &s32),
                "sigmoid: y f32[2, 3] on cpu, expected f64 [2, 3] on cpu");
}

}  // namespace
}  // namespace orrery::kernels
