// Next-token sampling from logits: greedy, temperature, nucleus (top-p). Draws come from a
// Philox stream, so a generation is reproducible from its seed.
#pragma once

#include <cstdint>

#include "core/philox.h"

namespace orrery {

struct SamplingOptions {
  double temperature = 0.0;  // 0: greedy (argmax, lowest id on ties)
  double top_p = 1.0;        // keep the smallest set of tokens whose probability reaches top_p
};

// `logits` holds `vocab` scores.
int32_t SampleToken(const float* logits, int64_t vocab, const SamplingOptions& options,
                    PhiloxGenerator& rng);

}  // namespace orrery
