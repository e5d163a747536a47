// The two-process check of shared weights (model/shared_weights.h), shared by the GPU test
// (tests/gpu/shared_weights_gpu_test.cc: CUDA IPC between two processes on one GPU) and its CPU
// twin (tests/unit/model/shared_weights_test.cc: a memfd between two processes).
//
// The learner side is this test process: a GpuModel on `device` whose masters are set to version
// v's values (every element of every parameter and balancing bias drawn from Philox, so no tensor
// keeps its initial value by chance), published into the shared buffers. The rollout side is a
// second process, this same test binary run again with only the child test selected
// (--gtest_filter) and the environment variable kChildVariable naming a control file: it builds a
// GpuModel of its own from another seed, maps the handle it is given, copies the version into its
// masters and compares every tensor with the version's values, bit for bit, writing "ok" to the
// result file only when all are equal. The child is started by posix_spawn (an exec, never a bare
// fork: the parent may hold a CUDA context, which a forked child must not use).
//
// Versions 1, 2 and 3 go to buffers 0, 1 and 0 again, each read by a fresh child: both buffers
// and a rewrite after a released lease are exercised.
#pragma once

#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/file_io.h"
#include "core/philox.h"
#include "core/safetensors.h"
#include "model/config.h"
#include "model/gpu/gpu_model.h"
#include "model/model.h"
#include "model/shared_weights.h"
#include "tests/gpu/every_layer_kind.h"

extern char** environ;

namespace orrery::model::shared_check {

inline constexpr const char* kChildVariable = "ORRERY_SHARED_WEIGHTS_CHILD";

// Every layer kind (KDA with 64-wide heads, MLA, a dense MLP, LatentMoE, AttnRes), small.
inline ModelConfig Config() {
  const std::string text = kEveryLayerKindToml;
  ConfigDocument doc = ConfigDocument::ParseString(text, "shared.toml").value();
  ConfigTable root = doc.root();
  ModelConfig c = ReadModelConfig(root).value();
  EXPECT_TRUE(doc.Finish().ok());
  return c;
}

inline GpuModelOptions Options(Device device) {
  GpuModelOptions o;
  o.device = device;
  o.compute_dtype = device.is_cpu() ? DType::kF32 : DType::kBF16;  // the CPU twins run f32 only
  return o;
}

// Version v's values, shaped like `like`, on the host.
inline NamedTensors VersionValues(const NamedTensors& like, uint64_t v) {
  NamedTensors out;
  for (size_t i = 0; i < like.size(); ++i) {
    Tensor t = Tensor::Empty(like[i].second.shape(), DType::kF32);
    for (int64_t j = 0; j < t.numel(); ++j) t.data<float>()[j] = PhiloxNormal(1000 + v, i, j);
    out.emplace_back(like[i].first, std::move(t));
  }
  return out;
}

// The first tensor of `got` (any device) that differs from `want` (host) in any bit: "" if none.
inline std::string FirstDifference(const NamedTensors& got, const NamedTensors& want) {
  std::map<std::string, const Tensor*> by_name;
  for (const auto& [name, t] : want) by_name[name] = &t;
  if (got.size() != want.size()) return "tensor count";
  for (const auto& [name, t] : got) {
    auto it = by_name.find(name);
    if (it == by_name.end()) return name + " (not in the version)";
    Tensor host = t.To(Device::Cpu()).value();
    if (host.nbytes() != it->second->nbytes() ||
        std::memcmp(host.raw_data(), it->second->raw_data(), host.nbytes()) != 0) {
      return name;
    }
  }
  return "";
}

// The child's side (the test body of the child test): reads the control file, copies, compares.
inline void RunChild(const std::string& control_path, Device device) {
  std::map<std::string, std::string> control;
  std::ifstream in(control_path);
  std::string line;
  while (std::getline(in, line)) {
    const size_t eq = line.find('=');
    if (eq != std::string::npos) control[line.substr(0, eq)] = line.substr(eq + 1);
  }
  ASSERT_TRUE(control.count("handle") && control.count("layout") && control.count("version") &&
              control.count("result"))
      << control_path;
  const ModelConfig c = Config();
  std::unique_ptr<Model> host = Model::Create(c, 7).value();
  std::unique_ptr<GpuModel> gpu = GpuModel::FromHost(*host, Options(device)).value();
  const SharedWeightLayout layout =
      SharedWeightLayout::Parse(ReadFileToString(control["layout"]).value()).value();
  SharedWeightReader reader;
  StatusOr<double> copied = reader.CopyInto(control["handle"], layout, gpu->NamedMasters());
  ASSERT_TRUE(copied.ok()) << copied.status().message();
  ASSERT_TRUE(gpu->RefreshComputeCopies().ok());
  const NamedTensors want = VersionValues(gpu->NamedMasters(), std::stoull(control["version"]));
  const std::string diff = FirstDifference(gpu->NamedMasters(), want);
  EXPECT_EQ(diff, "") << "the rollout's tensor differs from the learner's version";
  std::printf("  child: version %s copied in %.3f ms from %s, %s\n", control["version"].c_str(),
              *copied * 1e3, control["handle"].substr(0, 40).c_str(),
              diff.empty() ? "bit-identical" : ("differs at " + diff).c_str());
  if (diff.empty()) {
    ASSERT_TRUE(WriteFileAtomic(control["result"], "ok\n").ok());
  }
}

// Runs the child test `filter` with the control file; true when it wrote "ok".
inline bool SpawnChild(const std::string& filter, const std::string& dir, int64_t version,
                       const std::string& handle) {
  const std::string control = dir + "/control-" + std::to_string(version);
  const std::string result = dir + "/result-" + std::to_string(version);
  EXPECT_TRUE(WriteFileAtomic(control, "handle=" + handle + "\nlayout=" + dir +
                                           "/layout\nversion=" + std::to_string(version) +
                                           "\nresult=" + result + "\n")
                  .ok());
  std::vector<std::string> args = {"/proc/self/exe", "--gtest_filter=" + filter};
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
  env.push_back(std::string(kChildVariable) + "=" + control);
  std::vector<char*> argv, envp;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  pid_t pid = 0;
  if (posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), envp.data()) != 0) {
    ADD_FAILURE() << "posix_spawn failed";
    return false;
  }
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child exit status " << status;
  StatusOr<std::string> text = ReadFileToString(result);
  return text.ok() && *text == "ok\n";
}

// The learner's side: publishes versions 1, 2, 3 and has a child read each.
inline void RunParent(Device device, const std::string& child_filter) {
  const ModelConfig c = Config();
  std::unique_ptr<Model> host = Model::Create(c, 1).value();
  std::unique_ptr<GpuModel> learner = GpuModel::FromHost(*host, Options(device)).value();
  StatusOr<std::unique_ptr<SharedWeightPublisher>> made =
      SharedWeightPublisher::Create(learner->NamedMasters(), device);
  ASSERT_TRUE(made.ok()) << made.status().message();
  SharedWeightPublisher& publisher = **made;
  const std::string dir = std::filesystem::temp_directory_path().string() + "/orrery-shared-" +
                          std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  ASSERT_TRUE(WriteFileAtomic(dir + "/layout", publisher.layout().Serialize()).ok());
  std::vector<std::string> handles;
  for (int64_t v = 1; v <= 3; ++v) {
    SCOPED_TRACE(v);
    const NamedTensors values = VersionValues(learner->NamedMasters(), v);
    std::map<std::string, const Tensor*> by_name;
    for (const auto& [name, t] : values) by_name[name] = &t;
    for (auto& [name, t] : learner->NamedMasters()) ASSERT_TRUE(t.CopyFrom(*by_name[name]).ok());
    StatusOr<double> published = publisher.Publish(learner->NamedMasters(), v, 0.0);
    ASSERT_TRUE(published.ok()) << published.status().message();
    const SharedWeightGrant g = publisher.Acquire(v - 1);
    ASSERT_EQ(g.version, v);
    handles.push_back(g.handle);
    EXPECT_TRUE(SpawnChild(child_filter, dir, v, g.handle)) << "the child's copy of version " << v;
    EXPECT_TRUE(publisher.Release(g.lease));
    EXPECT_EQ(publisher.Acquire(v).version, -1) << "nothing newer than the newest";
  }
  EXPECT_NE(handles[0], handles[1]) << "versions 1 and 2 are in different buffers";
  EXPECT_EQ(handles[0], handles[2]) << "version 3 rewrites the buffer of version 1";
  std::filesystem::remove_all(dir);
}

}  // namespace orrery::model::shared_check
