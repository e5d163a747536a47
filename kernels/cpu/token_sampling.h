// The radix descent of SampleTokens (kernels/token_sampling.h): the per-level decision, shared
// with the CUDA kernel (kernels/cuda/token_sampling.cu, which computes the per-digit masses and
// counts with block reductions and calls the same SampleChooseDigit), and the CPU twin's
// sequential descent.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define ORRERY_SAMPLE_HD __host__ __device__
#else
#define ORRERY_SAMPLE_HD
#endif

namespace orrery::kernels::cpu {

// The digits of the descent: 16 levels of 4 bits, most significant first.
inline constexpr int kSampleDigitBits = 4;
inline constexpr int kSampleDigits = 1 << kSampleDigitBits;
inline constexpr int kSampleLevels = 64 / kSampleDigitBits;

// A non-negative double's order key (its bit pattern: monotone in the value for x >= 0).
inline uint64_t SampleKey(double x) {
  uint64_t k;
  std::memcpy(&k, &x, sizeof(k));
  return k;
}

// One level's choice from the per-digit masses and counts, largest digit first: the first
// non-empty digit whose mass brings *mass_above to `bound` (passed = true), the larger digits'
// masses added to *mass_above. When none does (at the first level: the whole mass is short of the
// bound; below it, rounding: a bin's digits sum to a little less than the bin did), or with
// `lowest`, the lowest non-empty digit, everything above it added (passed = false). digit = -1
// when every digit is empty.
struct SampleDigit {
  int digit = -1;
  bool passed = false;
};
ORRERY_SAMPLE_HD inline SampleDigit SampleChooseDigit(const double* mass, const int64_t* count,
                                                      double bound, bool lowest,
                                                      double* mass_above) {
  double above = *mass_above;
  int low = -1;
  for (int d = kSampleDigits - 1; d >= 0; --d) {
    if (count[d] == 0) continue;
    if (!lowest && above + mass[d] >= bound) {
      *mass_above = above;
      return {d, true};
    }
    low = d;
    above += mass[d];
  }
  if (low >= 0) *mass_above = above - mass[low];
  return {low, false};
}

// How many of `count` equal candidates of value c, after `mass_above`, bring the running sum to
// `bound`: the smallest r >= 1 with mass_above + r c >= bound, at most count.
ORRERY_SAMPLE_HD inline int64_t SampleTiesNeeded(double mass_above, double c, int64_t count,
                                                 double bound) {
  if (!(c > 0.0)) return count;
  const double need = (bound - mass_above) / c;
  if (!(need > 1.0)) return 1;
  if (need >= static_cast<double>(count)) return count;
  int64_t r = static_cast<int64_t>(need);
  if (mass_above + static_cast<double>(r) * c < bound) ++r;
  return r < count ? r : count;
}

// The outcome of a descent: the value found (its key), the mass of the candidates above it and
// how many candidates equal it; found = false when even all candidates' mass is short of the
// bound (or there is no candidate).
struct SampleCut {
  bool found = false;
  uint64_t key = 0;
  double mass_above = 0;
  int64_t count = 0;
};

// The largest value c among the candidates (the p_j with key > floor; every j without a floor)
// such that the candidates >= c have mass >= bound; with `lowest`, the smallest candidate value
// (mass_above: all the other candidates' mass). The CPU twin of the kernel's descent.
inline SampleCut SampleFindCut(const double* p, int64_t n, double bound, bool has_floor,
                               uint64_t floor, bool lowest) {
  SampleCut cut;
  uint64_t prefix = 0, mask = 0;
  double above = 0;
  for (int level = 0; level < kSampleLevels; ++level) {
    const int shift = 64 - kSampleDigitBits * (level + 1);
    double mass[kSampleDigits] = {};
    int64_t count[kSampleDigits] = {};
    for (int64_t j = 0; j < n; ++j) {
      const uint64_t key = SampleKey(p[j]);
      if ((has_floor && key <= floor) || (key & mask) != prefix) continue;
      const int d = static_cast<int>((key >> shift) & (kSampleDigits - 1));
      mass[d] += p[j];
      ++count[d];
    }
    const SampleDigit d = SampleChooseDigit(mass, count, bound, lowest, &above);
    if (d.digit < 0 || (level == 0 && !d.passed && !lowest)) return cut;
    prefix |= static_cast<uint64_t>(d.digit) << shift;
    mask |= static_cast<uint64_t>(kSampleDigits - 1) << shift;
    cut.count = count[d.digit];
  }
  cut.found = true;
  cut.key = prefix;
  cut.mass_above = above;
  return cut;
}

// One row's draw by the rule of kernels/token_sampling.h, sequentially: the CPU twin. p is
// scratch for the row's v probabilities.
struct SampledRow {
  int32_t id = 0;
  float logprob = 0;
};
SampledRow SampleRowCpu(const float* z, int64_t v, double temperature, double top_p, double u,
                        double* p);

}  // namespace orrery::kernels::cpu
