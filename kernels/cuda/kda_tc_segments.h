// The segments the tensor-core state passes split long sequences into (spec §2.5), and the i64
// tables of them the host side uploads (kda_forward_tc.cu, kda_backward_tc.cu). The forward and
// the backward split the same way, so that the backward can chain its segments through the
// forward's transitions.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "kernels/cuda/kda_cuda_util.cuh"
#include "kernels/cuda/kda_tc_layout.cuh"

namespace orrery::kernels::cuda {

// Sequence n's chunks [seq_chunk_first[n], seq_chunk_first[n + 1]) in min(segs_per_seq, its
// chunks) near-equal ranges (at least one), sequence after sequence, each in time order.
struct KdaSegmentSplit {
  std::vector<std::pair<int64_t, int64_t>> ranges;  // [chunk_begin, chunk_end)
  std::vector<int64_t> seq_first;  // [N + 1]: sequence n owns ranges [seq_first[n], seq_first[n+1])
};

inline KdaSegmentSplit SplitKdaSegments(const std::vector<int64_t>& seq_chunk_first,
                                        int64_t segs_per_seq) {
  KdaSegmentSplit split;
  split.seq_first.push_back(0);
  for (size_t n = 0; n + 1 < seq_chunk_first.size(); ++n) {
    const int64_t c0 = seq_chunk_first[n], nc = seq_chunk_first[n + 1] - c0;
    const int64_t segs = std::max<int64_t>(1, std::min(segs_per_seq, nc));
    for (int64_t j = 0; j < segs; ++j) {
      split.ranges.push_back({c0 + nc * j / segs, c0 + nc * (j + 1) / segs});
    }
    split.seq_first.push_back(static_cast<int64_t>(split.ranges.size()));
  }
  return split;
}

// Appends one SegmentDesc to a table of them in i64.
inline void AppendSegmentDesc(std::vector<int64_t>* table, std::pair<int64_t, int64_t> range,
                              const float* state_in, float* state_out, int64_t slice_begin = 0) {
  table->push_back(range.first);
  table->push_back(range.second);
  table->push_back(reinterpret_cast<int64_t>(state_in));
  table->push_back(reinterpret_cast<int64_t>(state_out));
  table->push_back(slice_begin);
}

constexpr int64_t kSegmentDescWords = sizeof(SegmentDesc) / sizeof(int64_t);

// A state pass's tables on the device, uploaded together in one copy before the pass's first
// kernel (a copy between two launches would wait for the first).
struct KdaSegmentTables {
  Tensor device;                               // owns the three below
  const SegmentDesc* output_pass = nullptr;    // the second (or only) pass
  const SegmentDesc* first_pass = nullptr;     // the split's first pass
  const int64_t* seq_segment_first = nullptr;  // [N + 1], for the combine
};

inline StatusOr<KdaSegmentTables> UploadKdaSegmentTables(const std::vector<int64_t>& output_pass,
                                                         const std::vector<int64_t>& first_pass,
                                                         const std::vector<int64_t>& seq_first,
                                                         const Device& device) {
  std::vector<int64_t> all = output_pass;
  all.insert(all.end(), first_pass.begin(), first_pass.end());
  all.insert(all.end(), seq_first.begin(), seq_first.end());
  KdaSegmentTables t;
  ORRERY_ASSIGN_OR_RETURN(t.device, Upload(all, device));
  const int64_t* base = t.device.data<int64_t>();
  t.output_pass = reinterpret_cast<const SegmentDesc*>(base);
  t.first_pass = reinterpret_cast<const SegmentDesc*>(base + output_pass.size());
  t.seq_segment_first = base + output_pass.size() + first_pass.size();
  return t;
}

}  // namespace orrery::kernels::cuda
