// How long a new policy version takes to reach a rollout on the same GPU, by phase (issue 26's
// weight-update benchmark), against the file path it replaces, measured in the same run.
//
//   shared_weights_gpu_bench CONFIG [VERSIONS] [DIR] [cpu]
//
// Two processes on one GPU: this one is the learner (a GpuModel of CONFIG in bf16, its masters
// published into CUDA IPC buffers: model/shared_weights.h), a child (this binary with --child) is
// the rollout (a GpuModel of its own). Per version:
//   snapshot  the learner's masters (and balancing biases) into the shared buffer, synchronised;
//   transfer  the rollout's copy out of the mapped buffer into its masters, device to device;
//   apply     the rollout's compute copies refreshed from its masters (bf16 casts), synchronised;
//   live      from the learner's snapshot start to the version applied in the rollout (the
//             announcement through a pipe in between: the fleet's channel is not part of this).
// The file path (what `weights = "directory"` does per version), in the learner process:
//   host_copy the masters to the host model (GpuModel::CopyToHost), write (safetensors, fsync,
//   rename, in DIR, default the working directory), read (the file back into host tensors),
//   load (host tensors into the GPU masters, compute copies refreshed).
// Prints the median and minimum of each phase over VERSIONS versions (default 8; the first one is
// not counted: mapping and first-touch costs) and the bytes of a version. With "cpu" both
// processes run the GPU model on the ops' CPU twins in f32 and share a memfd: a rehearsal of this
// program on a machine without a GPU (its figures are not the GPU's).
//
// Measured: not yet timed.
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/cuda_ipc.h"
#include "core/file_io.h"
#include "core/metrics.h"
#include "core/safetensors.h"
#include "model/config.h"
#include "model/gpu/gpu_model.h"
#include "model/model.h"
#include "model/shared_weights.h"

extern char** environ;

namespace orrery::model {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "shared_weights_gpu_bench: %s\n", what.c_str());
  std::exit(1);
}

template <typename T>
T OrDie(StatusOr<T> v, const std::string& what) {
  if (!v.ok()) Die(what + ": " + v.status().message());
  return std::move(v).value();
}

void OrDie(const Status& s, const std::string& what) {
  if (!s.ok()) Die(what + ": " + s.message());
}

std::unique_ptr<GpuModel> MakeModel(const std::string& config_path, uint64_t seed, Device device,
                                    std::unique_ptr<Model>* host) {
  const ModelConfig c = OrDie(LoadModelConfig(config_path), config_path);
  *host = OrDie(Model::Create(c, seed), "host model");
  GpuModelOptions o;
  o.device = device;
  o.compute_dtype = device.is_cuda() ? DType::kBF16 : DType::kF32;
  return OrDie(GpuModel::FromHost(**host, o), "GPU model");
}

void Sync(Device device) {
  if (device.is_cuda()) OrDie(CudaDeviceSynchronize(device.index), "sync");
}

std::string ReadLine(FILE* in) {
  char line[4096];
  if (std::fgets(line, sizeof(line), in) == nullptr) Die("the other process closed the pipe");
  return line;
}

// The rollout: reads "layout PATH", then "version V HANDLE PUBLISHED_AT" lines until "quit".
int Child(const std::string& config_path, Device device) {
  FILE* in = fdopen(3, "r");
  FILE* out = fdopen(4, "w");
  if (in == nullptr || out == nullptr) Die("--child: no pipes on descriptors 3 and 4");
  std::unique_ptr<Model> host;
  std::unique_ptr<GpuModel> gpu = MakeModel(config_path, 7, device, &host);
  char path[4096];
  if (std::sscanf(ReadLine(in).c_str(), "layout %4095s", path) != 1) Die("expected a layout");
  const SharedWeightLayout layout =
      OrDie(SharedWeightLayout::Parse(OrDie(ReadFileToString(path), path)), "layout");
  SharedWeightReader reader;
  std::fprintf(out, "ready\n");
  std::fflush(out);
  for (;;) {
    const std::string line = ReadLine(in);
    if (line.rfind("quit", 0) == 0) return 0;
    long long v = 0;
    char handle[512];
    double published_at = 0;
    if (std::sscanf(line.c_str(), "version %lld %511s %lf", &v, handle, &published_at) != 3) {
      Die("bad command: " + line);
    }
    const double transfer = OrDie(reader.CopyInto(handle, layout, gpu->NamedMasters()), "copy");
    const Clock::time_point apply_start = Clock::now();
    OrDie(gpu->RefreshComputeCopies(), "refresh");
    Sync(device);
    const double apply = Since(apply_start);
    const double live = UnixSeconds() - published_at;
    std::fprintf(out, "done %lld %.9f %.9f %.9f\n", v, transfer, apply, live);
    std::fflush(out);
  }
}

struct Series {
  std::vector<double> v;
  double Median() const {
    std::vector<double> s = v;
    std::sort(s.begin(), s.end());
    return s.empty() ? 0 : s[s.size() / 2];
  }
  double Min() const { return v.empty() ? 0 : *std::min_element(v.begin(), v.end()); }
};

int Parent(const std::string& config_path, int versions, const std::string& dir, Device device) {
  const Clock::time_point start = Clock::now();
  std::unique_ptr<Model> host;
  std::unique_ptr<GpuModel> learner = MakeModel(config_path, 1, device, &host);
  std::printf("learner model of %s on %s ready in %.1f s\n", config_path.c_str(),
              device.ToString().c_str(), Since(start));
  auto publisher =
      OrDie(SharedWeightPublisher::Create(learner->NamedMasters(), device), "publisher");
  const int64_t bytes = publisher->layout().total_bytes();
  std::filesystem::create_directories(dir);
  const std::string layout_path = dir + "/bench-layout.txt";
  OrDie(WriteFileAtomic(layout_path, publisher->layout().Serialize()), layout_path);

  int down[2], up[2];
  // Close-on-exec: the child keeps only the two ends dup2 puts on descriptors 3 and 4.
  if (pipe2(down, O_CLOEXEC) != 0 || pipe2(up, O_CLOEXEC) != 0) Die("pipe failed");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, down[0], 3);
  posix_spawn_file_actions_adddup2(&actions, up[1], 4);
  std::string self = "/proc/self/exe", flag = "--child", cfg = config_path,
              where = device.is_cuda() ? "cuda" : "cpu";
  char* argv[] = {self.data(), flag.data(), cfg.data(), where.data(), nullptr};
  pid_t pid = 0;
  if (posix_spawn(&pid, "/proc/self/exe", &actions, nullptr, argv, environ) != 0) {
    Die("posix_spawn failed");
  }
  close(down[0]);
  close(up[1]);
  FILE* to = fdopen(down[1], "w");
  FILE* from = fdopen(up[0], "r");
  std::fprintf(to, "layout %s\n", layout_path.c_str());
  std::fflush(to);
  if (ReadLine(from).rfind("ready", 0) != 0) Die("the rollout process did not start");
  std::printf("rollout process ready after %.1f s\n", Since(start));

  Series snapshot, transfer, apply, live;
  for (int v = 1; v <= versions; ++v) {
    const double published_at = UnixSeconds();
    const double snap =
        OrDie(publisher->Publish(learner->NamedMasters(), v, published_at), "publish");
    const SharedWeightGrant g = publisher->Acquire(v - 1);
    if (g.version != v) Die("the newest version is not the one published");
    std::fprintf(to, "version %d %s %.9f\n", v, g.handle.c_str(), published_at);
    std::fflush(to);
    long long got = 0;
    double t = 0, a = 0, l = 0;
    if (std::sscanf(ReadLine(from).c_str(), "done %lld %lf %lf %lf", &got, &t, &a, &l) != 4 ||
        got != v) {
      Die("the rollout did not apply version " + std::to_string(v));
    }
    if (!publisher->Release(g.lease)) Die("a lease expired during a copy");
    if (v == 1) continue;  // first touch of the mappings
    snapshot.v.push_back(snap);
    transfer.v.push_back(t);
    apply.v.push_back(a);
    live.v.push_back(l);
  }
  std::fprintf(to, "quit\n");
  std::fflush(to);
  int status = 0;
  waitpid(pid, &status, 0);

  // The file path, in this process.
  Series host_copy, write, read, load;
  const std::string file = dir + "/bench-version.safetensors";
  for (int r = 0; r < std::max(2, std::min(versions, 4)); ++r) {
    Clock::time_point t = Clock::now();
    OrDie(learner->CopyToHost(host.get()), "copy to host");
    host_copy.v.push_back(Since(t));
    std::vector<std::pair<std::string, Tensor>> named;
    for (Parameter& p : host->parameters()) named.emplace_back(p.name, p.value);
    t = Clock::now();
    OrDie(WriteSafetensors(file, named, {}), file);
    write.v.push_back(Since(t));
    t = Clock::now();
    SafetensorsFile f = OrDie(SafetensorsFile::Open(file), file);
    std::map<std::string, Tensor> loaded;
    for (const std::string& name : f.names()) loaded[name] = OrDie(f.Get(name), name).Clone();
    read.v.push_back(Since(t));
    t = Clock::now();
    for (GpuParameter& p : learner->parameters())
      OrDie(p.master.CopyFrom(loaded.at(p.name)), p.name);
    OrDie(learner->RefreshComputeCopies(), "refresh");
    Sync(device);
    load.v.push_back(Since(t));
  }
  std::filesystem::remove(file);
  std::filesystem::remove(layout_path);

  std::printf(
      "\nweight update of %s: %.3f GB a version (f32 masters + balancing biases), %zu "
      "versions timed\n",
      config_path.c_str(), bytes / 1e9, snapshot.v.size());
  std::printf("%-34s %10s %10s %10s\n", "phase", "median ms", "min ms", "GB/s");
  auto row = [&](const char* name, const Series& s, bool rate) {
    const double m = s.Median();
    std::printf("%-34s %10.3f %10.3f %10s\n", name, m * 1e3, s.Min() * 1e3,
                rate && m > 0 ? std::to_string(bytes / m / 1e9).substr(0, 7).c_str() : "");
  };
  row("shared: snapshot (learner)", snapshot, true);
  row("shared: transfer (rollout)", transfer, true);
  row("shared: apply (rollout)", apply, false);
  row("shared: live (snapshot -> applied)", live, false);
  row("file: host_copy", host_copy, true);
  row("file: write", write, true);
  row("file: read", read, true);
  row("file: load", load, true);
  const double file_total = host_copy.Median() + write.Median() + read.Median() + load.Median();
  std::printf("%-34s %10.3f\n", "file: total", file_total * 1e3);
  std::printf("shared live / file total: %.3f\n", file_total > 0 ? live.Median() / file_total : 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}

}  // namespace
}  // namespace orrery::model

int main(int argc, char** argv) {
  using namespace orrery::model;
  if (argc == 4 && std::string(argv[1]) == "--child") {
    return Child(argv[2],
                 std::string(argv[3]) == "cpu" ? orrery::Device::Cpu() : orrery::Device::Cuda(0));
  }
  const bool cpu = argc == 5 && std::string(argv[4]) == "cpu";
  if (argc < 2 || argc > 5 || (argc == 5 && !cpu)) {
    std::fprintf(stderr, "usage: shared_weights_gpu_bench CONFIG [VERSIONS] [DIR] [cpu]\n");
    return 2;
  }
  if (!cpu && orrery::CudaDeviceCount() == 0) {
    std::fprintf(stderr, "shared_weights_gpu_bench: no CUDA device visible\n");
    return 1;
  }
  const int versions = argc >= 3 ? std::max(2, std::atoi(argv[2])) : 8;
  return Parent(argv[1], versions, argc >= 4 ? argv[3] : ".",
                cpu ? orrery::Device::Cpu() : orrery::Device::Cuda(0));
}
