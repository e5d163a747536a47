// Prefix-causal attention (kernels/attention.h PrefixCausalAttention) on the CPU: its twin (the
// PrefixCausalAttentionForward template of kernels/mla_attention.h) against a naive f64 softmax
// written here from the definition, against CausalAttention where the two coincide (cu_q ==
// cu_k), in both dtypes, and the argument checks.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/philox.h"
#include "kernels/attention.h"
#include "tests/unit/kernels/kda_test_util.h"

namespace orrery::kernels {
namespace {

using testing::RandomNormal;
using testing::RelRmsError;

Tensor Offsets(const std::vector<int64_t>& lengths) {
  std::vector<int64_t> cu = {0};
  for (int64_t len : lengths) cu.push_back(cu.back() + len);
  return Tensor::FromVector<int64_t>({static_cast<int64_t>(cu.size())}, cu);
}

// The definition, one query at a time in f64: query i of document d sees keys 0 .. L - n + i.
void Naive(const Tensor& q, const Tensor& k, const Tensor& v, const std::vector<int64_t>& nq,
           const std::vector<int64_t>& nk, double scale, Tensor* o, Tensor* lse) {
  const int64_t h = q.dim(1), dqk = q.dim(2), dv = v.dim(2);
  *o = Tensor::Zeros({q.dim(0), h, dv}, DType::kF64);
  *lse = Tensor::Zeros({q.dim(0), h}, DType::kF64);
  const double* qp = q.data<double>();
  const double* kp = k.data<double>();
  const double* vp = v.data<double>();
  int64_t q0 = 0, k0 = 0;
  for (size_t d = 0; d < nq.size(); ++d) {
    for (int64_t i = 0; i < nq[d]; ++i) {
      for (int64_t hh = 0; hh < h; ++hh) {
        const int64_t visible = nk[d] - nq[d] + i + 1;
        std::vector<double> s(static_cast<size_t>(visible));
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < visible; ++j) {
          double dot = 0;
          for (int64_t c = 0; c < dqk; ++c) {
            dot += qp[((q0 + i) * h + hh) * dqk + c] * kp[((k0 + j) * h + hh) * dqk + c];
          }
          s[static_cast<size_t>(j)] = scale * dot;
          m = std::max(m, scale * dot);
        }
        double sum = 0;
        for (double& x : s) sum += (x = std::exp(x - m));
        double* orow = o->data<double>() + ((q0 + i) * h + hh) * dv;
        for (int64_t j = 0; j < visible; ++j) {
          for (int64_t c = 0; c < dv; ++c) {
            orow[c] += s[static_cast<size_t>(j)] / sum * vp[((k0 + j) * h + hh) * dv + c];
          }
        }
        lse->data<double>()[(q0 + i) * h + hh] = m + std::log(sum);
      }
    }
    q0 += nq[d];
    k0 += nk[d];
  }
}

struct Case {
  std::vector<int64_t> nq, nk;
  int64_t heads, dqk, dv;
};

TEST(PrefixCausalAttentionTest, MatchesTheDefinition) {
  // Ragged documents: one query at the end of a long context (decode-like), a document that is
  // all queries (n = L: causal), an empty one, contexts and query counts that cross the twin's
  // 64-query blocks and no tile boundary, a document of keys without queries.
  const std::vector<Case> cases = {
      {{1, 70, 0, 3, 130, 0}, {200, 70, 0, 9, 131, 5}, 3, 12, 5},
      {{1}, {1}, 1, 4, 3},
      {{65}, {300}, 1, 24, 16},
      {{5, 64, 1}, {5, 129, 77}, 2, 8, 8},
  };
  PhiloxGenerator rng(11, 0);
  for (const Case& c : cases) {
    const Tensor cu_q = Offsets(c.nq), cu_k = Offsets(c.nk);
    const int64_t nq = cu_q.data<int64_t>()[cu_q.numel() - 1];
    const int64_t nk = cu_k.data<int64_t>()[cu_k.numel() - 1];
    const Tensor q = RandomNormal({nq, c.heads, c.dqk}, DType::kF64, rng, 2.0);
    const Tensor k = RandomNormal({nk, c.heads, c.dqk}, DType::kF64, rng);
    const Tensor v = RandomNormal({nk, c.heads, c.dv}, DType::kF64, rng);
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.dqk));
    Tensor o, lse, o_ref, lse_ref;
    const Status st = PrefixCausalAttention(q, k, v, cu_q, cu_k, scale, &o, &lse);
    ASSERT_TRUE(st.ok()) << st.ToString();
    Naive(q, k, v, c.nq, c.nk, scale, &o_ref, &lse_ref);
    // f64 both sides, sums of at most 300 terms in another order: ~1e-15.
    EXPECT_LE(RelRmsError(o, o_ref), 1e-12) << "nq " << nq << " nk " << nk;
    EXPECT_LE(RelRmsError(lse, lse_ref), 1e-12) << "nq " << nq << " nk " << nk;

    // f32: the same computation in single precision (dot products of <= 24 terms and sums over
    // <= 300 keys: ~1e-6 relative).
    const auto f32 = [](const Tensor& t) { return t.Cast(DType::kF32).value(); };
    Tensor o32, lse32;
    ASSERT_TRUE(
        PrefixCausalAttention(f32(q), f32(k), f32(v), cu_q, cu_k, scale, &o32, &lse32).ok());
    EXPECT_EQ(o32.dtype(), DType::kF32);
    EXPECT_LE(RelRmsError(o32, o_ref), 1e-5);
    EXPECT_LE(RelRmsError(lse32, lse_ref), 1e-5);
  }
}

TEST(PrefixCausalAttentionTest, EqualsCausalAttentionWhenQueriesAreTheWholeContext) {
  const Tensor cu = Offsets({1, 7, 0, 90, 33});
  const int64_t n = 131, h = 2, dqk = 10, dv = 6;
  PhiloxGenerator rng(12, 0);
  const Tensor q = RandomNormal({n, h, dqk}, DType::kF64, rng, 2.0);
  const Tensor k = RandomNormal({n, h, dqk}, DType::kF64, rng);
  const Tensor v = RandomNormal({n, h, dv}, DType::kF64, rng);
  Tensor o, lse, o_c, lse_c;
  ASSERT_TRUE(PrefixCausalAttention(q, k, v, cu, cu, 0.4, &o, &lse).ok());
  ASSERT_TRUE(CausalAttention(q, k, v, cu, 0.4, &o_c, &lse_c).ok());
  EXPECT_LE(RelRmsError(o, o_c), 1e-12);
  EXPECT_LE(RelRmsError(lse, lse_c), 1e-12);
}

TEST(PrefixCausalAttentionTest, RejectsBadArguments) {
  const Tensor q = Tensor::Zeros({4, 1, 4}, DType::kF64), k = Tensor::Zeros({6, 1, 4}, DType::kF64);
  const Tensor v = Tensor::Zeros({6, 1, 3}, DType::kF64);
  Tensor o, lse;
  // Three queries against two keys in the second document.
  Status st = PrefixCausalAttention(q, k, v, Offsets({1, 3}), Offsets({4, 2}), 1.0, &o, &lse);
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(st.message(),
            "prefix_causal_attention: document 1 has 3 queries but 2 keys, expected queries <= "
            "keys (the queries are the last positions of the context)");
  st = PrefixCausalAttention(q, k, v, Offsets({4}), Offsets({3, 3}), 1.0, &o, &lse);
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(st.message(),
            "prefix_causal_attention: cu_q has 2 offsets and cu_k 3, expected one per document "
            "boundary in both");
  st = PrefixCausalAttention(q, k, v, Offsets({4}), Offsets({5}), 1.0, &o, &lse);
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(st.message(),
            "prefix_causal_attention: cu_q and cu_k must rise from 0 to the query count 4 and the "
            "key count 6 without falling");
  st = PrefixCausalAttention(q, k, Tensor::Zeros({5, 1, 3}, DType::kF64), Offsets({4}),
                             Offsets({6}), 1.0, &o, &lse);
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(st.message(),
            "prefix_causal_attention: v f64[5, 1, 3] on cpu, expected f64[6, 1, 3] on cpu");
  st = PrefixCausalAttention(q, Tensor::Zeros({6, 1, 5}, DType::kF64), v, Offsets({4}),
                             Offsets({6}), 1.0, &o, &lse);
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(st.message(),
            "prefix_causal_attention: k f64[6, 1, 5] on cpu, expected f64[6, 1, 4] on cpu");
}

}  // namespace
}  // namespace orrery::kernels
