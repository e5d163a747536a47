// Absorbed MLA decode over a paged latent cache (kernels/mla_decode.h) on the GPU against its CPU
// twin (f64 loops) on fresh random inputs; skipped without a GPU.
//
// The cache (tests/unit/kernels/paged_cache_test_util.h): ragged context lengths (20000, 1,
// page_size - 1, page_size, 3 pages + 5; each at least Q), pages shuffled through a pool with spare
// pages, the first page of sequence 0 shared by the sequences with more than one page, and NaN in
// every slot no sequence owns (and in the spare pages unused block-table entries point at), so a
// read outside a context fails the check. The reference runs in f64 on the very values the GPU
// sees (q and the pages rounded to its dtype). Every case runs with the automatic split, splitting
// off (max_splits 1) and a forced 7 splits (empty splits for the short contexts), each against the
// CPU, and the automatic split against splitting off. Outputs are NaN-poisoned before each call.
// Dims: K3's D 576 / dv 512 (the tensor-core kernel in bf16), 80 / 64 (tensor cores, one column
// tile per warp, 5 k steps split 3 + 2) and 24 / 16 (the SIMT kernel in both dtypes); H 16 and 8
// (8 rows of padding in a 16-row group), Q 1 and 4 (Q * H / 16 row groups reading one split).
// Tolerances (relative RMS error ||gpu - ref|| / ||ref|| over o; max abs error over lse):
//   bf16 o: 5e-3. The output's rounding to bf16 gives ~1.1e-3 (2^-9 / sqrt(3)); the tensor-core
//     kernel also rounds the softmax weights to bf16 before P . V (another ~1.1e-3 relative: each
//     weight's error is relative and independent) while the normaliser sums the unrounded ones
//     (unbiased: round to nearest); scores are exact products of the bf16 inputs summed in f32.
//     About 1.6e-3 in all; 5e-3 is 3x that and fails on a wrong mask, page or split (>= 1e-1).
//   f32 o: 2e-5. f32 sums of <= 576 products and <= 20000 weighted rows: sqrt(20000) * 6e-8 ~
//     1e-5 in the worst (random-walk) case; __expf's relative error (~1e-6 at |x| < 20) averages
//     out over the rows.
//   lse (f32, both dtypes): 1e-4 absolute. It is max + log(sum) of f32 scores (exact bf16 products
//     in bf16) and f32 weights: |lse| < 40 here, f32 rounding of the sum ~ 20000 * 6e-8 relative.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <tuple>
#include <vector>

#include "core/device.h"
#include "core/philox.h"
#include "kernels/mla_decode.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/unit/kernels/kda_test_util.h"
#include "tests/unit/kernels/paged_cache_test_util.h"

namespace orrery::kernels {
namespace {

using gpu_test::Poisoned;
using gpu_test::Round;
using gpu_test::ToGpu;
using gpu_test::ToHostF64;
using gpu_test::TolFor;
using testing::PagedCacheSpec;
using testing::RandomNormal;
using testing::RandomPagedCache;
using testing::RelRmsError;

constexpr double kLseTol = 1e-4;

PagedLatentCache ToGpuCache(const PagedLatentCache& c, DType dt) {
  return {ToGpu(c.pages, dt), ToGpu(c.block_table), ToGpu(c.context_lens)};
}

// Index i of a row-major tensor of `shape` as "[a, b, ...]".
std::string Position(const Shape& shape, int64_t i) {
  std::string s;
  for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
    s = std::to_string(i % shape[d]) + (s.empty() ? "" : ", ") + s;
    i /= shape[d];
  }
  return "[" + s + "]";
}

// gpu (any device, any float dtype) fully written and within `tol` relative RMS of ref; prints
// the error and where the largest one is.
void ExpectCloseRel(const Tensor& gpu, const Tensor& ref, double tol, const std::string& what) {
  const Tensor g = ToHostF64(gpu), r = ToHostF64(ref);
  int64_t worst = 0;
  double max_err = 0;
  for (int64_t i = 0; i < g.numel(); ++i) {
    const double x = g.data<double>()[i];
    ASSERT_TRUE(std::isfinite(x)) << what << ": element " << Position(g.shape(), i) << " = " << x;
    const double e = std::abs(x - r.data<double>()[i]);
    if (e > max_err) max_err = e, worst = i;
  }
  const double err = RelRmsError(g, r);
  EXPECT_LE(err, tol) << what;
  std::printf("  %-40s rel RMS %.3g (tol %.0e), max abs %.3g at %s (gpu %.6g, cpu %.6g)\n",
              what.c_str(), err, tol, max_err, Position(g.shape(), worst).c_str(),
              g.data<double>()[worst], r.data<double>()[worst]);
}

// Max abs error of an f32 lse.
void ExpectCloseAbs(const Tensor& gpu, const Tensor& ref, double tol, const std::string& what) {
  const Tensor g = ToHostF64(gpu), r = ToHostF64(ref);
  int64_t worst = 0;
  double max_err = 0;
  for (int64_t i = 0; i < g.numel(); ++i) {
    const double x = g.data<double>()[i];
    ASSERT_TRUE(std::isfinite(x)) << what << ": element " << Position(g.shape(), i) << " = " << x;
    const double e = std::abs(x - r.data<double>()[i]);
    if (e > max_err) max_err = e, worst = i;
  }
  EXPECT_LE(max_err, tol) << what << " at " << Position(g.shape(), worst);
  std::printf("  %-40s max abs %.3g (tol %.0e) at %s (gpu %.8g, cpu %.8g)\n", what.c_str(), max_err,
              tol, Position(g.shape(), worst).c_str(), g.data<double>()[worst],
              r.data<double>()[worst]);
}

struct Dims {
  int64_t width, dv, page_size;
};
using DecodeCase = std::tuple<DType, Dims, int64_t, int64_t>;  // dtype, dims, heads, queries
class MlaDecodeGpuTest : public ::testing::TestWithParam<DecodeCase> {};

TEST_P(MlaDecodeGpuTest, MatchesCpuTwinWithAndWithoutSplits) {
  SKIP_WITHOUT_GPU();
  const auto [dt, dims, heads, nq] = GetParam();
  const int32_t ps = static_cast<int32_t>(dims.page_size), q_min = static_cast<int32_t>(nq);
  PagedCacheSpec spec;
  for (int32_t len : {20000, 1, ps - 1, ps, 3 * ps + 5}) {
    spec.context_lens.push_back(std::max(len, q_min));
  }
  spec.page_size = ps;
  spec.width = dims.width;
  spec.share_first_page = true;
  PhiloxGenerator rng(static_cast<uint64_t>(7000 + dims.width * 13 + heads * 5 + nq), 0);
  PagedLatentCache cache = RandomPagedCache(spec, rng);
  cache.pages = Round(cache.pages, dt);
  const int64_t n = static_cast<int64_t>(spec.context_lens.size());
  // q at twice the unit spread: scores ~ N(0, 4 D / 192) at the model's scale, peaked enough that
  // the running max matters.
  const Tensor q = Round(RandomNormal({n, nq, heads, dims.width}, DType::kF64, rng, 2.0), dt);
  const float scale = static_cast<float>(1.0 / std::sqrt(192.0));

  Tensor o_ref, lse_ref;
  const Status ref = MlaDecodePaged(q, cache, dims.dv, scale, &o_ref, &lse_ref);
  ASSERT_TRUE(ref.ok()) << ref.ToString();
  const PagedLatentCache gc = ToGpuCache(cache, dt);
  const Tensor qg = ToGpu(q, dt);
  Tensor o_auto;
  for (int splits : {0, 1, 7}) {
    MlaDecodeOptions opt;
    opt.max_splits = splits;
    Tensor o = Poisoned({n, nq, heads, dims.dv}, dt), lse = Poisoned({n, nq, heads}, DType::kF32);
    const Status st = MlaDecodePaged(qg, gc, dims.dv, scale, opt, &o, &lse);
    ASSERT_TRUE(st.ok()) << st.ToString();
    const std::string tag = "splits " + std::to_string(splits) + ": ";
    ExpectCloseRel(o, o_ref, TolFor(dt), tag + "o");
    ExpectCloseAbs(lse, lse_ref, kLseTol, tag + "lse");
    if (splits == 0) o_auto = o;
    if (splits == 1) ExpectCloseRel(o_auto, o, TolFor(dt), "o: auto split vs no split");
  }
}

// K3's row (576 = 512 latent + 64 rope, 64-token pages), a small tensor-core shape (80 / 64) and
// one only the SIMT kernel takes (24 / 16, 5-token pages).
INSTANTIATE_TEST_SUITE_P(All, MlaDecodeGpuTest,
                         ::testing::Combine(::testing::Values(DType::kBF16, DType::kF32),
                                            ::testing::Values(Dims{576, 512, 64}, Dims{80, 64, 16},
                                                              Dims{24, 16, 5}),
                                            ::testing::Values(int64_t{16}, int64_t{8}),
                                            ::testing::Values(int64_t{1}, int64_t{4})),
                         [](const auto& info) {
                           const Dims d = std::get<1>(info.param);
                           return std::string(DTypeName(std::get<0>(info.param))) + "_d" +
                                  std::to_string(d.width) + "_dv" + std::to_string(d.dv) + "_h" +
                                  std::to_string(std::get<2>(info.param)) + "_q" +
                                  std::to_string(std::get<3>(info.param));
                         });

// Many sequences at once: more blocks than SMs (no automatic split) and every row group.
TEST(MlaDecodeGpuBatch, ManySequencesMatchCpuTwin) {
  SKIP_WITHOUT_GPU();
  PhiloxGenerator rng(99, 0);
  PagedCacheSpec spec;
  for (int i = 0; i < 300; ++i)
    spec.context_lens.push_back(1 + static_cast<int32_t>(rng.UniformInt(700)));
  spec.page_size = 64;
  spec.width = 576;
  spec.share_first_page = true;
  for (DType dt : {DType::kBF16, DType::kF32}) {
    PagedLatentCache cache = RandomPagedCache(spec, rng);
    cache.pages = Round(cache.pages, dt);
    const Tensor q = Round(RandomNormal({300, 1, 16, 576}, DType::kF64, rng, 2.0), dt);
    Tensor o_ref, lse_ref;
    ASSERT_TRUE(MlaDecodePaged(q, cache, 512, 0.072f, &o_ref, &lse_ref).ok());
    Tensor o = Poisoned({300, 1, 16, 512}, dt), lse = Poisoned({300, 1, 16}, DType::kF32);
    const Status st = MlaDecodePaged(ToGpu(q, dt), ToGpuCache(cache, dt), 512, 0.072f, &o, &lse);
    ASSERT_TRUE(st.ok()) << st.ToString();
    ExpectCloseRel(o, o_ref, TolFor(dt), std::string(DTypeName(dt)) + " o");
    ExpectCloseAbs(lse, lse_ref, kLseTol, std::string(DTypeName(dt)) + " lse");
  }
}

// PagedLatentWrite: the GPU's pages equal the CPU's bit for bit after writing rows to shuffled
// slots (padding rows at -1 skipped); rows written then decode as the CPU decodes them.
TEST(PagedLatentWriteGpu, MatchesCpuBitForBit) {
  SKIP_WITHOUT_GPU();
  for (DType dt : {DType::kBF16, DType::kF32}) {
    PhiloxGenerator rng(5, 0);
    const int64_t pages_n = 9, ps = 16, d = 576, rows = 100;
    const Tensor pages0 = Round(RandomNormal({pages_n, ps, d}, DType::kF64, rng), dt);
    std::vector<int32_t> slots(pages_n * ps);
    for (size_t i = 0; i < slots.size(); ++i) slots[i] = static_cast<int32_t>(i);
    for (size_t i = slots.size() - 1; i > 0; --i) {
      std::swap(slots[i], slots[rng.UniformInt(i + 1)]);
    }
    slots.resize(rows);
    for (int64_t t = 0; t < rows; t += 9) slots[t] = -1;
    const Tensor slot_t = Tensor::FromVector<int32_t>({rows}, slots);
    const Tensor latents = Round(RandomNormal({rows, d}, DType::kF64, rng), dt);
    Tensor cpu_pages = pages0.Clone();
    ASSERT_TRUE(PagedLatentWrite(latents, slot_t, &cpu_pages).ok());
    Tensor gpu_pages = ToGpu(pages0, dt);
    const Status st = PagedLatentWrite(ToGpu(latents, dt), ToGpu(slot_t), &gpu_pages);
    ASSERT_TRUE(st.ok()) << st.ToString();
    EXPECT_EQ(RelRmsError(ToHostF64(gpu_pages), cpu_pages), 0.0) << DTypeName(dt);
  }
}

TEST(MlaDecodeGpuErrors, RejectsBadArguments) {
  SKIP_WITHOUT_GPU();
  PagedLatentCache c{Poisoned({2, 4, 1100}, DType::kBF16),
                     ToGpu(Tensor::FromVector<int32_t>({1, 1}, {0})),
                     ToGpu(Tensor::FromVector<int32_t>({1}, {1}))};
  Tensor o, lse;
  Status st = MlaDecodePaged(Poisoned({1, 1, 2, 1100}, DType::kBF16), c, 512, 1.f, &o, &lse);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find("expected D <= 1024 on cuda"), std::string::npos) << st.ToString();
  c.pages = Poisoned({2, 4, 576}, DType::kF64);
  st = MlaDecodePaged(Poisoned({1, 1, 2, 576}, DType::kF64), c, 512, 1.f, &o, &lse);
  EXPECT_NE(st.message().find("expected bf16 or f32 on cuda"), std::string::npos) << st.ToString();
}

}  // namespace
}  // namespace orrery::kernels
