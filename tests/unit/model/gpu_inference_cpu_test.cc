// The GPU inference engine (model/gpu/gpu_inference.h) on the ops' CPU twins against the host
// model's inference path, on a machine without a GPU: the engine's own orchestration (slot state
// gathered and scattered, the conv history, the paged latent cache with copy-on-write, chunked and
// multi-turn prefill, batched decode) is what these checks can fail on.
#include <gtest/gtest.h>

#include "tests/gpu/gpu_inference_check.h"

namespace orrery::model {
namespace {

// Both sides compute in f32 on the CPU. They differ in the order of sums: the KDA op's chunked
// form (from the slot's state, in other chunk boundaries) against the host's recurrent decode
// step, the MLA twin's f64-accumulated attention over pages against the host's f32 loops, the
// absorbed query per head. That is about 1e-7 relative per op; through four layers 1e-5 on the
// logits leaves a wide margin and is far below the O(1) error of a wrong row, page or state.
// Routing is compared exactly: a near-tie flipped by 1e-7 is improbable for these weights, and a
// state or cache error changes many ids.
constexpr inference_check::Tolerance kF32{1e-5, 0.0};

TEST(GpuInferenceCpuTest, SlotsOfDifferentLengthsOverPagesMatchTheHost) {
  inference_check::MultiSlot(Device::Cpu(), DType::kF32, kF32);
}

TEST(GpuInferenceCpuTest, ForkedPromptEqualsSeparatePrefills) {
  inference_check::Fork(Device::Cpu(), DType::kF32, kF32);
}

// The MHA-form prefill (keys and values decompressed per head, prefix-causal attention over them;
// the PrefixCausalAttention twin) for feeds of 8 or 7 tokens and more, beside absorbed ones in
// the same call, across chunks, a second turn over a cached context and contexts in shared
// pages: the same host, the same tolerance (the attention sums in another order, in f32).
TEST(GpuInferenceCpuTest, MhaFormPrefillMatchesTheHost) {
  inference_check::MultiSlot(Device::Cpu(), DType::kF32, kF32, 8);
}

TEST(GpuInferenceCpuTest, MhaFormPrefillOverSharedPagesMatchesTheHost) {
  inference_check::Fork(Device::Cpu(), DType::kF32, kF32, 7);
}

TEST(GpuInferenceCpuTest, ReleasedEpisodesReturnEveryPage) {
  inference_check::PagesNeverLeak(Device::Cpu(), DType::kF32, 60);
}

TEST(GpuInferenceCpuTest, AnEmptyPoolIsResourceExhausted) {
  inference_check::PoolExhaustion(Device::Cpu(), DType::kF32);
}

}  // namespace
}  // namespace orrery::model
