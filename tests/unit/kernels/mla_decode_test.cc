// The CPU twin of absorbed MLA decode over a paged latent cache (kernels/mla_decode.h): against
// the causal attention templates of kernels/mla_attention.h run on each sequence's rows gathered
// into one contiguous document (the latent row as a key shared by every head, its first dv columns
// as the value), the paged write round trip, and the bad-input errors.
#include "kernels/mla_decode.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/philox.h"
#include "kernels/mla_attention.h"
#include "tests/unit/kernels/kda_test_util.h"
#include "tests/unit/kernels/paged_cache_test_util.h"

namespace orrery::kernels {
namespace {

using testing::ContiguousRows;
using testing::PagedCacheSpec;
using testing::RandomNormal;
using testing::RandomPagedCache;

// One InvalidArgument line that contains `want`.
void ExpectInvalid(const Status& st, const std::string& want) {
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find(want), std::string::npos) << st.ToString();
  EXPECT_EQ(st.message().find('\n'), std::string::npos) << st.ToString();
}

// o [N, Q, H, dv] and lse [N, Q, H] of the decode, from CausalAttentionForward on each sequence as
// one document of its len tokens: keys = the rows repeated over heads, values = their first dv
// columns, and the Q queries placed at the last Q positions (the earlier positions' queries are
// zeros; their outputs are not looked at).
void Reference(const Tensor& q, const PagedLatentCache& c, int64_t dv, double scale, Tensor* o,
               Tensor* lse) {
  const int64_t n = q.dim(0), nq = q.dim(1), h = q.dim(2), d = q.dim(3);
  *o = Tensor::Zeros({n, nq, h, dv}, DType::kF64);
  *lse = Tensor::Zeros({n, nq, h}, DType::kF64);
  for (int64_t i = 0; i < n; ++i) {
    const Tensor rows = ContiguousRows(c, i);
    const int64_t len = rows.dim(0);
    Tensor qq = Tensor::Zeros({len, h, d}, DType::kF64),
           k = Tensor::Empty({len, h, d}, DType::kF64),
           v = Tensor::Empty({len, h, dv}, DType::kF64);
    for (int64_t t = 0; t < len; ++t) {
      for (int64_t hh = 0; hh < h; ++hh) {
        for (int64_t x = 0; x < d; ++x)
          k.data<double>()[(t * h + hh) * d + x] = rows.data<double>()[t * d + x];
        for (int64_t x = 0; x < dv; ++x)
          v.data<double>()[(t * h + hh) * dv + x] = rows.data<double>()[t * d + x];
      }
    }
    for (int64_t j = 0; j < nq; ++j) {
      std::copy_n(q.data<double>() + (i * nq + j) * h * d, h * d,
                  qq.data<double>() + (len - nq + j) * h * d);
    }
    Tensor oo = Tensor::Empty({len, h, dv}, DType::kF64), ll = Tensor::Empty({len, h}, DType::kF64);
    CausalAttentionForward<double>({len, h, d, dv}, {0, len}, scale, qq.data<double>(),
                                   k.data<double>(), v.data<double>(), oo.data<double>(),
                                   ll.data<double>());
    for (int64_t j = 0; j < nq; ++j) {
      std::copy_n(oo.data<double>() + (len - nq + j) * h * dv, h * dv,
                  o->data<double>() + (i * nq + j) * h * dv);
      std::copy_n(ll.data<double>() + (len - nq + j) * h, h,
                  lse->data<double>() + (i * nq + j) * h);
    }
  }
}

double MaxAbsDiff(const Tensor& a, const Tensor& b) {
  const Tensor x = a.Cast(DType::kF64).value(), y = b.Cast(DType::kF64).value();
  double m = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double e = std::abs(x.data<double>()[i] - y.data<double>()[i]);
    m = std::isnan(e) ? INFINITY : std::max(m, e);
  }
  return m;
}

struct Case {
  std::vector<int32_t> lens;
  int64_t page_size, width, dv, heads, queries;
  bool share;
};

TEST(MlaDecodePagedTest, MatchesCausalAttentionOnTheGatheredRows) {
  // Ragged lengths around the page size (1, ps - 1, ps, ps + 1, 3 pages + 5), Q = 1 and 4, pages
  // shuffled in a pool with NaN-filled spares, shared first pages.
  const std::vector<Case> cases = {
      {{1, 7, 8, 9, 29}, 8, 24, 16, 3, 1, false},
      {{4, 7, 8, 9, 29}, 8, 24, 16, 3, 4, true},
      {{13, 40, 5}, 5, 10, 10, 1, 2, true},
      {{64, 3}, 16, 20, 4, 4, 3, false},
  };
  uint64_t seed = 1;
  for (const Case& cs : cases) {
    PhiloxGenerator rng(seed++, 0);
    PagedCacheSpec spec;
    spec.context_lens = cs.lens;
    spec.page_size = cs.page_size;
    spec.width = cs.width;
    spec.share_first_page = cs.share;
    const PagedLatentCache cache = RandomPagedCache(spec, rng);
    const int64_t n = static_cast<int64_t>(cs.lens.size());
    const Tensor q = RandomNormal({n, cs.queries, cs.heads, cs.width}, DType::kF64, rng, 1.5);
    const float scale = 0.37f;
    Tensor o, lse, o_ref, lse_ref;
    ASSERT_TRUE(MlaDecodePaged(q, cache, cs.dv, scale, &o, &lse).ok());
    Reference(q, cache, cs.dv, scale, &o_ref, &lse_ref);
    EXPECT_EQ(lse.dtype(), DType::kF32);
    // f64 sums of <= 64 terms against the templates' f64 GEMMs: rounding only.
    EXPECT_LE(MaxAbsDiff(o, o_ref), 1e-12) << "page_size " << cs.page_size;
    // lse is stored in f32: half an f32 ulp of values below ~20.
    EXPECT_LE(MaxAbsDiff(lse, lse_ref), 4e-6) << "page_size " << cs.page_size;

    // f32 inputs: the same f64 accumulation over f32-rounded values.
    const auto f32 = [](const Tensor& t) { return t.Cast(DType::kF32).value(); };
    PagedLatentCache c32 = cache;
    c32.pages = f32(cache.pages);
    Tensor o32, lse32;
    ASSERT_TRUE(MlaDecodePaged(f32(q), c32, cs.dv, scale, &o32, &lse32).ok());
    EXPECT_EQ(o32.dtype(), DType::kF32);
    EXPECT_LE(MaxAbsDiff(o32, o_ref), 1e-5);
    EXPECT_LE(MaxAbsDiff(lse32, lse_ref), 1e-5);
  }
}

TEST(MlaDecodePagedTest, DefinedOutputsAreOverwrittenAndOptionsDoNotChangeTheCpuResult) {
  PhiloxGenerator rng(11, 0);
  PagedCacheSpec spec;
  spec.context_lens = {5, 17};
  const PagedLatentCache cache = RandomPagedCache(spec, rng);
  const Tensor q = RandomNormal({2, 1, 2, spec.width}, DType::kF64, rng);
  Tensor o, lse;
  ASSERT_TRUE(MlaDecodePaged(q, cache, 8, 0.5f, &o, &lse).ok());
  Tensor o2 = Tensor::Zeros({2, 1, 2, 8}, DType::kF64),
         lse2 = Tensor::Zeros({2, 1, 2}, DType::kF32);
  MlaDecodeOptions opt;
  opt.max_splits = 1;
  ASSERT_TRUE(MlaDecodePaged(q, cache, 8, 0.5f, opt, &o2, &lse2).ok());
  EXPECT_EQ(MaxAbsDiff(o, o2), 0.0);
  EXPECT_EQ(MaxAbsDiff(lse, lse2), 0.0);
}

TEST(PagedLatentWriteTest, RowsLandInTheirSlotsAndReadBackThroughTheBlockTable) {
  PhiloxGenerator rng(3, 0);
  const int64_t ps = 4, d = 6, pages_n = 5;
  Tensor pages = Tensor::Zeros({pages_n, ps, d}, DType::kF64);
  // Sequence of 7 tokens in pages 3, 1 (in that order); slot -1 is a padding row.
  const std::vector<int32_t> slots = {3 * ps + 0, 3 * ps + 1, 3 * ps + 2, 3 * ps + 3,
                                      -1,         1 * ps + 0, 1 * ps + 1, 1 * ps + 2};
  const Tensor latents = RandomNormal({8, d}, DType::kF64, rng);
  ASSERT_TRUE(PagedLatentWrite(latents, Tensor::FromVector<int32_t>({8}, slots), &pages).ok());
  PagedLatentCache c;
  c.pages = pages;
  c.block_table = Tensor::FromVector<int32_t>({1, 2}, {3, 1});
  c.context_lens = Tensor::FromVector<int32_t>({1}, {7});
  const Tensor rows = ContiguousRows(c, 0);
  for (int64_t t = 0, src = 0; t < 7; ++t, ++src) {
    if (src == 4) ++src;  // the padding row was skipped
    for (int64_t x = 0; x < d; ++x) {
      EXPECT_EQ(rows.data<double>()[t * d + x], latents.data<double>()[src * d + x]) << t;
    }
  }
  double untouched = 0;  // pages 0, 2, 4 and the last slot of page 1 stay zero
  for (int64_t i = 0; i < pages.numel(); ++i) untouched += std::abs(pages.data<double>()[i]);
  double written = 0;
  for (int64_t i = 0; i < latents.numel(); ++i) {
    if (i / d != 4) written += std::abs(latents.data<double>()[i]);
  }
  EXPECT_NEAR(untouched, written, 1e-12);

  Tensor bad = Tensor::FromVector<int32_t>({1}, {pages_n * ps});
  Tensor one = RandomNormal({1, d}, DType::kF64, rng);
  ExpectInvalid(PagedLatentWrite(one, bad, &pages), "slot_mapping[0] = 20, expected < 20");
  Tensor narrow = Tensor::Zeros({pages_n, ps, d - 1}, DType::kF64);
  ExpectInvalid(PagedLatentWrite(one, Tensor::FromVector<int32_t>({1}, {0}), &narrow), "pages");
  ExpectInvalid(PagedLatentWrite(one, Tensor::FromVector<int64_t>({1}, {0}), &pages),
                "slot_mapping");
}

TEST(MlaDecodePagedTest, BadInputsGetOneClearLine) {
  PhiloxGenerator rng(5, 0);
  PagedCacheSpec spec;
  spec.context_lens = {5, 17};
  spec.page_size = 8;
  const PagedLatentCache cache = RandomPagedCache(spec, rng);
  const Tensor q = RandomNormal({2, 2, 3, spec.width}, DType::kF64, rng);
  Tensor o, lse;
  ExpectInvalid(MlaDecodePaged(q.Cast(DType::kBF16).value(), cache, 8, 1.f, &o, &lse),
                "expected f32 or f64 on cpu");
  ExpectInvalid(
      MlaDecodePaged(RandomNormal({2, 3, spec.width}, DType::kF64, rng), cache, 8, 1.f, &o, &lse),
      "expected [N, Q >= 1, H, D >= 1]");
  ExpectInvalid(
      MlaDecodePaged(RandomNormal({2, 2, 3, 7}, DType::kF64, rng), cache, 4, 1.f, &o, &lse),
      "pages");
  ExpectInvalid(MlaDecodePaged(q, cache, spec.width + 1, 1.f, &o, &lse), "dv 25");
  ExpectInvalid(MlaDecodePaged(q, cache, 8, NAN, &o, &lse), "scale");
  PagedLatentCache c = cache;
  c.context_lens = Tensor::FromVector<int32_t>({2}, {1, 17});
  ExpectInvalid(MlaDecodePaged(q, c, 8, 1.f, &o, &lse), "context_lens[0] = 1, expected in [2 (Q)");
  c.context_lens = Tensor::FromVector<int32_t>({2}, {5, 1000});
  ExpectInvalid(MlaDecodePaged(q, c, 8, 1.f, &o, &lse), "context_lens[1] = 1000");
  c = cache;
  c.block_table = cache.block_table.Clone();
  c.block_table.data<int32_t>()[c.block_table.dim(1) + 1] = 99;
  ExpectInvalid(MlaDecodePaged(q, c, 8, 1.f, &o, &lse), "block_table[1, 1] = 99");
  c.block_table = Tensor::FromVector<int32_t>({1, 3}, {0, 1, 2});
  ExpectInvalid(MlaDecodePaged(q, c, 8, 1.f, &o, &lse), "block_table");
  c = cache;
  c.context_lens = Tensor::FromVector<int64_t>({2}, {5, 17});
  ExpectInvalid(MlaDecodePaged(q, c, 8, 1.f, &o, &lse), "context_lens");
  Tensor wrong_o = Tensor::Zeros({2, 2, 3, 9}, DType::kF64);
  ExpectInvalid(MlaDecodePaged(q, cache, 8, 1.f, &wrong_o, &lse), "o ");
}

}  // namespace
}  // namespace orrery::kernels
