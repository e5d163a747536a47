// SampleTokens' CPU twin (kernels/token_sampling.h): the radix descent of
// kernels/cpu/token_sampling.h, one row at a time.
#include "kernels/cpu/token_sampling.h"

#include <cmath>

namespace orrery::kernels::cpu {
namespace {

double ValueOf(uint64_t key) {
  double x;
  std::memcpy(&x, &key, sizeof(x));
  return x;
}

// The position of the j-th (1-based) id, in id order, whose p has `key`.
int32_t NthWithKey(const double* p, int64_t v, uint64_t key, int64_t j) {
  int64_t seen = 0, last = -1;
  for (int64_t i = 0; i < v; ++i) {
    if (SampleKey(p[i]) != key) continue;
    last = i;
    if (++seen == j) return static_cast<int32_t>(i);
  }
  return static_cast<int32_t>(last);  // j beyond the count: not reached (j <= count)
}

}  // namespace

SampledRow SampleRowCpu(const float* z, int64_t v, double temperature, double top_p, double u,
                        double* p) {
  float best = z[0];
  int32_t arg = 0;
  for (int64_t j = 1; j < v; ++j) {
    if (z[j] > best) {
      best = z[j];
      arg = static_cast<int32_t>(j);
    }
  }
  const double mx = best, t = temperature > 0 ? temperature : 1.0;
  double sum = 0;
  for (int64_t j = 0; j < v; ++j) {
    p[j] = std::exp((static_cast<double>(z[j]) - mx) / t);
    sum += p[j];
  }
  const double log_sum = std::log(sum);
  auto draw = [&](int32_t id) {
    return SampledRow{id, static_cast<float>((static_cast<double>(z[id]) - mx) / t - log_sum)};
  };
  if (temperature == 0) return draw(arg);
  if (!(top_p < 1.0)) {  // no nucleus: the first id, in id order, reaching u * sum
    const double target = u * sum;
    double acc = 0;
    for (int64_t j = 0; j < v; ++j) {
      acc += p[j];
      if (acc >= target) return draw(static_cast<int32_t>(j));
    }
    return draw(static_cast<int32_t>(v - 1));
  }
  // The nucleus: the value c of its last member, the r members equal to c it takes.
  const double bound = top_p * sum;
  SampleCut cut = SampleFindCut(p, v, bound, false, 0, false);
  int64_t r = 0;
  if (cut.found) {
    r = SampleTiesNeeded(cut.mass_above, ValueOf(cut.key), cut.count, bound);
  } else {  // rounding left the whole mass short of top_p: everything is kept
    cut = SampleFindCut(p, v, 0, false, 0, true);
    r = cut.count;
  }
  const double c = ValueOf(cut.key);
  const double target = u * (cut.mass_above + static_cast<double>(r) * c);
  // The draw: among the members above c, or else among the r taken at c.
  const SampleCut cross = SampleFindCut(p, v, target, true, cut.key, false);
  if (cross.found) {
    const double w = ValueOf(cross.key);
    return draw(
        NthWithKey(p, v, cross.key, SampleTiesNeeded(cross.mass_above, w, cross.count, target)));
  }
  return draw(NthWithKey(p, v, cut.key, SampleTiesNeeded(cut.mass_above, c, r, target)));
}

}  // namespace orrery::kernels::cpu
