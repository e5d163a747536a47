// The [run] section shared by every Orrery job: where outputs go, the seed, determinism, threads,
// logging.
#pragma once

#include <cstdint>
#include <string>

#include "core/config.h"
#include "core/dtype.h"
#include "core/logging.h"

namespace orrery {

// Where a job's model runs: the host model on the CPU, or the GPU model on CUDA device 0.
enum class RunDevice { kCpu, kCuda };

struct RunConfig {
  std::string name = "run";
  std::string dir = "runs/run";  // outputs: checkpoints, metrics, logs
  uint64_t seed = 0;
  // Fixed reduction orders: bit-identical results across runs, resumes and thread counts. The CPU
  // and the GPU kernels always work this way (docs/pretraining.md, "Determinism"), so the flag
  // changes nothing today; it stays for configs that set it and for a faster, order-dependent GPU
  // mode should one ever pay for itself.
  bool deterministic = false;
  // Threads of the default pool (ApplyRunConfig; ORRERY_NUM_THREADS wins); 0: the hardware's.
  int threads = 0;
  LogLevel log_level = LogLevel::kInfo;
  // device = "cpu" | "cuda". "cuda": pretraining, the RL learner and rollout roles and policy
  // evaluation run the GPU model (model/gpu/gpu_model.h); without a visible GPU the job stops with
  // one line before it starts.
  RunDevice device = RunDevice::kCpu;
  // dtype = "bf16" | "f32": the GPU model's compute dtype (f32: the debug mode, no TF32). Only
  // read with device = "cuda"; the CPU model is f32.
  DType dtype = DType::kBF16;
};

// Reads root.[run]; absent keys take the defaults above.
RunConfig ReadRunConfig(ConfigTable& root);

// Puts [run] into effect for this process: the log level, and the size of the default thread pool
// (ThreadPool::SetDefaultThreads(threads): ORRERY_NUM_THREADS, when set, takes precedence). Call
// once at startup, before any parallel work. Returns the number of threads in effect.
int ApplyRunConfig(const RunConfig& run);

}  // namespace orrery
