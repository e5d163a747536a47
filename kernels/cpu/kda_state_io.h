// Views of one (sequence, head) slice of the KDA tensors, shared by the CPU algorithms.
//
// Token rows of sequence n are r in [seq_start[n], seq_start[n + 1]) of the flattened [B * T];
// head h of row r starts at (r * H + h) * K in q/k/g, at (r * H + h) * V in v/o, and at r * H + h
// in beta. States are [N, H, K, V] in f32 or f64 and are converted to the compute type T here.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "kernels/kda_problem.h"

namespace orrery::kernels::cpu {

// Copies state (n, h) of `s` (f32 or f64, may be undefined = zeros) into `dst` [K * V].
template <typename T>
void LoadState(const Tensor& s, int64_t n, int64_t h, const KdaProblem& p, T* dst) {
  const int64_t kv = p.key_dim * p.value_dim;
  if (!s.defined()) {
    std::fill(dst, dst + kv, T(0));
    return;
  }
  const int64_t off = (n * p.heads + h) * kv;
  if (s.dtype() == DType::kF64) {
    const double* src = s.data<double>() + off;
    for (int64_t i = 0; i < kv; ++i) dst[i] = static_cast<T>(src[i]);
  } else {
    const float* src = s.data<float>() + off;
    for (int64_t i = 0; i < kv; ++i) dst[i] = static_cast<T>(src[i]);
  }
}

// Writes `src` [K * V] into state (n, h) of `s` (f32 or f64).
template <typename T>
void StoreState(const T* src, int64_t n, int64_t h, const KdaProblem& p, const Tensor& s) {
  const int64_t kv = p.key_dim * p.value_dim;
  const int64_t off = (n * p.heads + h) * kv;
  if (s.dtype() == DType::kF64) {
    double* dst = s.data<double>() + off;
    for (int64_t i = 0; i < kv; ++i) dst[i] = static_cast<double>(src[i]);
  } else {
    float* dst = s.data<float>() + off;
    for (int64_t i = 0; i < kv; ++i) dst[i] = static_cast<float>(src[i]);
  }
}

// The dtype of states and state gradients for inputs of dtype `dt`.
inline DType KdaStateDType(DType dt) { return dt == DType::kF64 ? DType::kF64 : DType::kF32; }

}  // namespace orrery::kernels::cpu
