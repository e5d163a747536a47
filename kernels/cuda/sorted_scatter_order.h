// The plan of the embedding's deterministic scatter-add (embedding.cu), as plain code that host
// code runs too: tests/unit/kernels/sorted_scatter_order_test.cc checks it on the CPU against a
// plain scatter-add, and tests/gpu/determinism_gpu_test.cc requires the kernels' result to equal
// SortedScatterAddInOrder's bit for bit.
//
// dtable[ids[r]] += dy[r] for r < n, where many rows share an id (a frequent token). The rows are
// sorted by id (stable: rows of one id keep their order), so each id's rows form one segment of
// the sorted entries. Pass 1 cuts the sorted entries into chunks of kScatterChunk; per column, a
// chunk sums each run of equal ids in entry order, starting from zero, and
//   - a run that is its whole segment is added to the table row (its one writer);
//   - a run that continues a segment from the chunk before (the chunk's first run) goes to the
//     chunk's first slot, one that continues into the next chunk (its last run) to its last slot.
// Pass 2: the chunk where a segment crossing a chunk end starts (its owner) adds, per column, its
// last slot, then the first slots of the following chunks in order, and adds that total to the
// table row. Every table row has one writer and every sum a fixed order, so the same inputs give
// the same bits on every run. Ids outside [0, vocab) sort last (key = vocab) and are skipped.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#if defined(__CUDACC__)
#define ORRERY_SCATTER_ORDER __host__ __device__ __forceinline__
#else
#define ORRERY_SCATTER_ORDER inline
#endif

namespace orrery::kernels::cuda {

inline constexpr int kScatterChunk = 32;  // sorted entries per chunk

enum ScatterDestination { kScatterTable = 0, kScatterFirstSlot = 1, kScatterLastSlot = 2 };

// Sorted entry i begins its key's segment.
ORRERY_SCATTER_ORDER bool SegmentStartsAt(const int32_t* keys, int64_t i) {
  return i == 0 || keys[i - 1] != keys[i];
}

// The entries before `end` (exclusive, end > 0) end their key's segment there.
ORRERY_SCATTER_ORDER bool SegmentEndsAt(const int32_t* keys, int64_t n, int64_t end) {
  return end == n || keys[end] != keys[end - 1];
}

// Where pass 1 puts the sum of the run [s, t) of a chunk.
ORRERY_SCATTER_ORDER ScatterDestination RunDestination(const int32_t* keys, int64_t n, int64_t s,
                                                       int64_t t) {
  if (!SegmentStartsAt(keys, s)) return kScatterFirstSlot;  // s is the chunk's first entry
  if (!SegmentEndsAt(keys, n, t)) return kScatterLastSlot;  // t is the chunk's end
  return kScatterTable;
}

// Chunk k's entries are [ScatterChunkBegin(k), ScatterChunkEnd(n, k)).
ORRERY_SCATTER_ORDER int64_t ScatterChunkBegin(int64_t k) { return k * kScatterChunk; }
ORRERY_SCATTER_ORDER int64_t ScatterChunkEnd(int64_t n, int64_t k) {
  return (k + 1) * kScatterChunk < n ? (k + 1) * kScatterChunk : n;
}

// Chunk k owns the segment of its last entry in pass 2: the segment starts in chunk k and runs
// past its end.
ORRERY_SCATTER_ORDER bool ChunkOwnsSpanningSegment(const int32_t* keys, int64_t n, int64_t k) {
  const int64_t begin = ScatterChunkBegin(k), end = ScatterChunkEnd(n, k);
  if (end == n) return false;
  const int32_t key = keys[end - 1];
  if (keys[end] != key) return false;
  return keys[begin] != key || SegmentStartsAt(keys, begin);
}

// The segment that reaches chunk j from before goes on into chunk j + 1 (chunk j is all of it).
ORRERY_SCATTER_ORDER bool SegmentContinuesPast(const int32_t* keys, int64_t n, int64_t j) {
  const int64_t begin = ScatterChunkBegin(j), end = ScatterChunkEnd(n, j);
  return end < n && keys[end - 1] == keys[begin] && keys[end] == keys[begin];
}

// Bits of the sort keys: enough for vocab itself (the key of an id out of range).
inline int ScatterKeyBits(int64_t vocab) {
  int bits = 1;
  while ((int64_t{1} << bits) <= vocab) ++bits;
  return bits;
}

// The host twin: the same additions in the same order (f32 dy, as the kernel reads bf16 or f32
// rows into f32).
inline void SortedScatterAddInOrder(const int32_t* ids, int64_t n, int64_t vocab, const float* dy,
                                    int64_t d, float* dtable) {
  std::vector<int32_t> key_of(static_cast<size_t>(n));
  for (int64_t r = 0; r < n; ++r) {
    key_of[r] = ids[r] >= 0 && ids[r] < vocab ? ids[r] : static_cast<int32_t>(vocab);
  }
  std::vector<int32_t> pos(static_cast<size_t>(n));
  std::iota(pos.begin(), pos.end(), 0);
  std::stable_sort(pos.begin(), pos.end(),
                   [&](int32_t a, int32_t b) { return key_of[a] < key_of[b]; });
  std::vector<int32_t> keys(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) keys[i] = key_of[pos[i]];
  const int64_t chunks = (n + kScatterChunk - 1) / kScatterChunk;
  std::vector<float> first(static_cast<size_t>(chunks * d)), last(first.size());
  for (int64_t k = 0; k < chunks; ++k) {
    const int64_t begin = ScatterChunkBegin(k), end = ScatterChunkEnd(n, k);
    for (int64_t c = 0; c < d; ++c) {
      float acc = 0.0f;
      int64_t s = begin;
      for (int64_t e = begin; e < end; ++e) {
        acc += dy[static_cast<int64_t>(pos[e]) * d + c];
        if (e + 1 < end && keys[e + 1] == keys[e]) continue;
        if (keys[e] < vocab) {
          switch (RunDestination(keys.data(), n, s, e + 1)) {
            case kScatterTable:
              dtable[static_cast<int64_t>(keys[e]) * d + c] += acc;
              break;
            case kScatterFirstSlot:
              first[k * d + c] = acc;
              break;
            case kScatterLastSlot:
              last[k * d + c] = acc;
              break;
          }
        }
        acc = 0.0f;
        s = e + 1;
      }
    }
  }
  for (int64_t k = 0; k < chunks; ++k) {
    if (!ChunkOwnsSpanningSegment(keys.data(), n, k)) continue;
    const int32_t key = keys[ScatterChunkEnd(n, k) - 1];
    if (key >= vocab) continue;
    for (int64_t c = 0; c < d; ++c) {
      float total = last[k * d + c];
      int64_t j = k + 1;
      total += first[j * d + c];
      while (SegmentContinuesPast(keys.data(), n, j)) {
        ++j;
        total += first[j * d + c];
      }
      dtable[static_cast<int64_t>(key) * d + c] += total;
    }
  }
}

}  // namespace orrery::kernels::cuda
