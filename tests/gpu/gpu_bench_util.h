// Shared by the GPU op benchmarks (tests/gpu/*_gpu_bench.cc): random device inputs and the median
// time of an op by CUDA events.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include "core/cuda_allocator.h"
#include "core/philox.h"
#include "core/status.h"
#include "core/tensor.h"

namespace orrery::kernels::gpu_bench {

// N(0, 1) entries (|N(0, 1)| when `positive`: a second moment must not be negative). A block
// of 1M host draws is tiled over the tensor by device copies: drawing every element on the host
// took minutes at these sizes, and a repeating block of random values times like random data.
inline Tensor RandomOnGpu(const Shape& shape, DType dt, uint64_t seed, bool positive = false) {
  constexpr int64_t kBlock = int64_t{1} << 20;
  const int64_t numel = ShapeNumel(shape);
  PhiloxGenerator rng(seed, 0);
  Tensor h = Tensor::Empty({std::min(numel, kBlock)}, DType::kF32);
  for (int64_t i = 0; i < h.numel(); ++i) {
    const float x = static_cast<float>(rng.Normal());
    h.data<float>()[i] = positive ? std::abs(x) : x;
  }
  const Tensor block = (dt == DType::kF32 ? h : h.Cast(dt).value()).To(Device::Cuda(0)).value();
  Tensor out = Tensor::Allocate(shape, dt, Device::Cuda(0)).value();
  const size_t esize = DTypeSize(dt);
  for (int64_t off = 0; off < numel; off += block.numel()) {
    const int64_t n = std::min(block.numel(), numel - off);
    cudaMemcpy(static_cast<char*>(out.raw_data()) + off * esize, block.raw_data(), n * esize,
               cudaMemcpyDeviceToDevice);
  }
  return out;
}

// Median milliseconds of `fn` over `runs` timed runs after `warmups` (-1 when a run fails), by
// events on device 0's stream, where the ops queue their work (core/cuda_allocator.h).
inline double TimeMs(const std::function<Status()>& fn, int warmups, int runs) {
  for (int i = 0; i < warmups; ++i) {
    if (!fn().ok()) return -1;
  }
  StatusOr<CUstream_st*> stream = CudaStream(0);
  if (!stream.ok()) return -1;
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<double> ms;
  for (int i = 0; i < runs; ++i) {
    cudaEventRecord(a, *stream);
    if (!fn().ok()) return -1;
    cudaEventRecord(b, *stream);
    cudaEventSynchronize(b);
    float t = 0;
    cudaEventElapsedTime(&t, a, b);
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace orrery::kernels::gpu_bench
