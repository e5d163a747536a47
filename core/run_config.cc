#include "core/run_config.h"

#include "core/thread_pool.h"

namespace orrery {

RunConfig ReadRunConfig(ConfigTable& root) {
  RunConfig c;
  ConfigTable t = root.Table("run");
  c.name = t.String("name", c.name);
  c.dir = t.Path("dir", "runs/" + c.name);
  c.seed = static_cast<uint64_t>(t.Int("seed", 0, 0));
  c.deterministic = t.Bool("deterministic", false);
  c.threads = static_cast<int>(t.Int("threads", 0, 0, 1024));
  const std::string level = t.Enum("log_level", "info", {"debug", "info", "warn", "error"});
  ParseLogLevel(level, &c.log_level);
  c.device =
      t.Enum("device", "cpu", {"cpu", "cuda"}) == "cuda" ? RunDevice::kCuda : RunDevice::kCpu;
  c.dtype = t.Enum("dtype", "bf16", {"bf16", "f32"}) == "f32" ? DType::kF32 : DType::kBF16;
  return c;
}

int ApplyRunConfig(const RunConfig& run) {
  SetMinLogLevel(run.log_level);
  return ThreadPool::SetDefaultThreads(run.threads);
}

}  // namespace orrery
