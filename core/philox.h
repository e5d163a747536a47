// Philox 4x32-10, the counter-based generator of Salmon et al. (SC'11), usable on CPU and GPU.
//
// A random stream is a pure function of (seed, counter): element i of stream (seed, stream_id)
// is the same number whichever device, thread count or order produces it. That is what makes
// initialisation, dropout and sampling reproducible across CPU and CUDA.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define ORRERY_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define ORRERY_HOST_DEVICE inline
#endif

namespace orrery {

struct Philox4x32 {
  uint32_t v[4];
};

// One Philox4x32-10 block: 10 rounds over a 128-bit counter with a 64-bit key.
ORRERY_HOST_DEVICE Philox4x32 PhiloxBlock(Philox4x32 ctr, uint32_t key0, uint32_t key1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kM0) * ctr.v[0];
    const uint64_t p1 = static_cast<uint64_t>(kM1) * ctr.v[2];
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    ctr = Philox4x32{{hi1 ^ ctr.v[1] ^ key0, lo1, hi0 ^ ctr.v[3] ^ key1, lo0}};
    key0 += kW0;
    key1 += kW1;
  }
  return ctr;
}

// The 32-bit word `index` of the stream (seed, stream): block index/4 of counter
// (index/4 low, index/4 high, stream low, stream high), word index%4.
ORRERY_HOST_DEVICE uint32_t PhiloxWord(uint64_t seed, uint64_t stream, uint64_t index) {
  const uint64_t block = index >> 2;
  Philox4x32 ctr{{static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
                  static_cast<uint32_t>(stream), static_cast<uint32_t>(stream >> 32)}};
  Philox4x32 r = PhiloxBlock(ctr, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  return r.v[index & 3];
}

// Uniform in (0, 1]: never 0, so log() is safe; 24 bits of resolution.
ORRERY_HOST_DEVICE float UniformFromBits(uint32_t bits) {
  return (static_cast<float>(bits >> 8) + 1.0f) * (1.0f / 16777216.0f);
}

// Element `index` of a uniform (0, 1] stream.
ORRERY_HOST_DEVICE float PhiloxUniform(uint64_t seed, uint64_t stream, uint64_t index) {
  return UniformFromBits(PhiloxWord(seed, stream, index));
}

// Element `index` of a standard normal stream (Box-Muller on words 2i and 2i+1).
ORRERY_HOST_DEVICE float PhiloxNormal(uint64_t seed, uint64_t stream, uint64_t index) {
  const float u1 = UniformFromBits(PhiloxWord(seed, stream, 2 * index));
  const float u2 = UniformFromBits(PhiloxWord(seed, stream, 2 * index + 1));
  return sqrtf(-2.0f * logf(u1)) * cosf(6.283185307179586f * u2);
}

// A sequential CPU generator over one stream, for code that draws numbers one after another.
class PhiloxGenerator {
 public:
  PhiloxGenerator(uint64_t seed, uint64_t stream) : seed_(seed), stream_(stream) {}
  uint32_t NextU32() { return PhiloxWord(seed_, stream_, offset_++); }
  uint64_t NextU64() {
    uint64_t hi = NextU32();
    return (hi << 32) | NextU32();
  }
  // Uniform in (0, 1].
  float Uniform() { return UniformFromBits(NextU32()); }
  // Uniform integer in [0, n) (n > 0), without modulo bias.
  uint64_t UniformInt(uint64_t n) {
    const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do {
      x = NextU64();
    } while (x >= limit);
    return x % n;
  }
  float Normal() {
    const float u1 = Uniform(), u2 = Uniform();
    return std::sqrt(-2.0f * std::log(u1)) * std::cos(6.283185307179586f * u2);
  }
  // Position in the stream, for checkpointing; restore with set_offset.
  uint64_t offset() const { return offset_; }
  void set_offset(uint64_t offset) { offset_ = offset; }
  uint64_t seed() const { return seed_; }
  uint64_t stream() const { return stream_; }

 private:
  uint64_t seed_;
  uint64_t stream_;
  uint64_t offset_ = 0;
};

}  // namespace orrery
