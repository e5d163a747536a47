// KdaProblem: the validated sizes of one KDA call, shared by the CPU and CUDA implementations.
//
// Internal to kernels/: KdaForward/KdaBackward validate their inputs once (shapes, dtypes,
// devices, cu_seqlens) and hand the implementations this description, so they never re-check.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "kernels/kda.h"

namespace orrery::kernels {

struct KdaProblem {
  int64_t batch = 0;      // B
  int64_t tokens = 0;     // T (per row)
  int64_t heads = 0;      // H
  int64_t key_dim = 0;    // K
  int64_t value_dim = 0;  // V
  // Sequence n covers the flattened token rows [seq_start[n], seq_start[n + 1]) of [B * T];
  // without cu_seqlens sequence n is batch row n. seq_start.size() == num_sequences() + 1.
  std::vector<int64_t> seq_start;
  float scale = 0.0f;  // resolved (K^-1/2 when the option is <= 0)
  int chunk_size = 64;
  KdaAlgorithm algorithm = KdaAlgorithm::kChunked;
  DType dtype = DType::kF32;  // of q, k, v, g, beta
  Device device;

  int64_t num_sequences() const { return static_cast<int64_t>(seq_start.size()) - 1; }
};

// Checks every input against the contract in kernels/kda.h. Errors name the tensor, its shape
// and what was expected.
StatusOr<KdaProblem> ValidateKdaInputs(const KdaInputs& in, const KdaOptions& options);

}  // namespace orrery::kernels
