#include "model/config.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "core/device.h"
#include "model/model.h"

namespace orrery::model {
namespace {

std::string ConfigPath(const std::string& name) {
  const char* root = std::getenv("ORRERY_SOURCE_DIR");
  return std::string(root ? root : ".") + "/configs/model/" + name;
}

TEST(ModelConfigTest, K3MatchesPublishedTotals) {
  StatusOr<ModelConfig> c = LoadModelConfig(ConfigPath("k3.toml"));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->num_layers, 93);
  EXPECT_EQ(c->num_kda_layers(), 69);
  EXPECT_EQ(c->num_mla_layers(), 24);
  const ParamBreakdown b = ComputeParamBreakdown(*c, 8192);
  std::printf("k3: total %.4g, active %.4g\n", static_cast<double>(b.total_params),
              static_cast<double>(b.active_params));
  EXPECT_LT(std::abs(static_cast<double>(b.total_params) / 2.8e12 - 1.0), 0.02);
  EXPECT_LT(std::abs(static_cast<double>(b.active_params) / 104e9 - 1.0), 0.03);
  // 24 MLA layers x 576 latent entries x 2 bytes (spec §3.3: 27.6 KB/token).
  EXPECT_EQ(b.mla_cache_bytes_per_token_bf16, 24 * 576 * 2);
}

TEST(ModelConfigTest, TinyIsAFewMillionParameters) {
  StatusOr<ModelConfig> c = LoadModelConfig(ConfigPath("tiny.toml"));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->LayerPattern(), "KKKM");
  const ParamBreakdown b = ComputeParamBreakdown(*c, 256);
  EXPECT_GE(b.total_params, 1'000'000);
  EXPECT_LE(b.total_params, 3'000'000);
  for (const char* name : {"small.toml", "kimi-linear-48b.toml"}) {
    StatusOr<ModelConfig> other = LoadModelConfig(ConfigPath(name));
    EXPECT_TRUE(other.ok()) << name << ": " << other.status().ToString();
  }
}

// small-1m.toml is small.toml but for max_seq_len: every other setting line (comments and blank
// lines aside) the same, in the same order.
TEST(ModelConfigTest, Small1mIsSmallButForMaxSeqLen) {
  const auto settings = [](const std::string& name) {
    std::ifstream in(ConfigPath(name));
    EXPECT_TRUE(in.good()) << name;
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) {
      line = line.substr(0, line.find('#'));
      while (!line.empty() && line.back() == ' ') line.pop_back();
      if (!line.empty() && line.rfind("max_seq_len", 0) != 0) lines.push_back(line);
    }
    return lines;
  };
  const std::vector<std::string> small = settings("small.toml");
  EXPECT_GT(small.size(), 20u);
  EXPECT_EQ(settings("small-1m.toml"), small);
}

Status Parse(const std::string& text) {
  StatusOr<ConfigDocument> doc = ConfigDocument::ParseString(text, "test.toml");
  if (!doc.ok()) return doc.status();
  ConfigTable root = doc->root();
  StatusOr<ModelConfig> c = ReadModelConfig(root);
  if (!c.ok()) return c.status();
  return doc->Finish();
}

const char* kBase = "[model]\nvocab_size = 64\nhidden_size = 16\nnum_layers = 2\n";

TEST(ModelConfigTest, RejectsInvalidCombinations) {
  EXPECT_TRUE(Parse(std::string(kBase) + "full_attn_layers = [2]\n").ok());
  Status s = Parse(std::string(kBase) + "full_attn_layers = [3]\n");
  EXPECT_NE(s.message().find("beyond num_layers"), std::string::npos) << s.ToString();
  s = Parse(std::string(kBase) + "[model.moe]\nnum_experts = 4\ntop_k = 5\n");
  EXPECT_NE(s.message().find("model.moe.top_k"), std::string::npos) << s.ToString();
  s = Parse(std::string(kBase) + "[model.kda]\nchunk_size = 48\n");
  EXPECT_NE(s.message().find("model.kda.chunk_size"), std::string::npos) << s.ToString();
  s = Parse(std::string(kBase) + "[model.kda]\nheadz = 4\n");
  EXPECT_NE(s.message().find("headz"), std::string::npos) << s.ToString();
  s = Parse("[modle]\nx = 1\n");
  EXPECT_FALSE(s.ok());
}

TEST(ModelConfigTest, MaxSeqLenIsReadPerConfigAndMustBePositive) {
  const std::map<std::string, int64_t> declared = {{"tiny.toml", 4096},
                                                   {"small.toml", 32768},
                                                   {"small-1m.toml", int64_t{1} << 20},
                                                   {"k3.toml", int64_t{1} << 20},
                                                   {"kimi-linear-48b.toml", int64_t{1} << 20}};
  for (const auto& [name, want] : declared) {
    StatusOr<ModelConfig> c = LoadModelConfig(ConfigPath(name));
    ASSERT_TRUE(c.ok()) << name << ": " << c.status().ToString();
    EXPECT_EQ(c->max_seq_len, want) << name;
  }
  StatusOr<ConfigDocument> doc = ConfigDocument::ParseString(
      std::string(kBase) + "full_attn_layers = [2]\nmax_seq_len = 512\n", "test.toml");
  ASSERT_TRUE(doc.ok());
  ConfigTable root = doc->root();
  StatusOr<ModelConfig> c = ReadModelConfig(root);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(doc->Finish().ok());
  EXPECT_EQ(c->max_seq_len, 512);
  EXPECT_EQ(ModelConfig().max_seq_len, int64_t{1} << 20);  // absent: K3's 1M context
  for (const char* bad : {"max_seq_len = 0\n", "max_seq_len = -4\n"}) {
    Status s = Parse(std::string(kBase) + bad);
    EXPECT_NE(s.message().find("model.max_seq_len"), std::string::npos) << bad << s.ToString();
    EXPECT_EQ(s.message().find('\n'), std::string::npos) << s.message();
  }
}

// [model.kda] device: "cpu" (default) or "cuda"; "cuda" only where the CUDA kernels are built.
TEST(ModelConfigTest, KdaDeviceKey) {
  auto read = [](const std::string& kda) -> StatusOr<ModelConfig> {
    ORRERY_ASSIGN_OR_RETURN(
        ConfigDocument doc,
        ConfigDocument::ParseString(std::string(kBase) + "[model.kda]\n" + kda, "test.toml"));
    ConfigTable root = doc.root();
    StatusOr<ModelConfig> c = ReadModelConfig(root);
    ORRERY_RETURN_IF_ERROR(doc.Finish());
    return c;
  };
  auto one_line_naming_device = [](const Status& s) {
    EXPECT_NE(s.message().find("model.kda.device"), std::string::npos) << s.ToString();
    EXPECT_EQ(s.message().find('\n'), std::string::npos) << s.message();
  };
  StatusOr<ModelConfig> c = read("");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->kda.device, KdaDevice::kCpu);
  c = read("device = \"cpu\"\n");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->kda.device, KdaDevice::kCpu);
  for (const char* bad : {"device = \"gpu\"\n", "device = \"cuda:1\"\n", "device = 1\n"}) {
    c = read(bad);
    ASSERT_FALSE(c.ok()) << bad;
    one_line_naming_device(c.status());
  }
  c = read("device = \"cuda\"\n");
#if defined(ORRERY_KERNELS_CUDA)
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->kda.device, KdaDevice::kCuda);
  // What the CUDA kernels cannot do is refused at config time, not at the first forward.
  c = read("device = \"cuda\"\nalgorithm = \"recurrent\"\n");
  ASSERT_FALSE(c.ok());
  one_line_naming_device(c.status());
  EXPECT_NE(c.status().message().find("recurrent"), std::string::npos) << c.status().ToString();
  c = read("device = \"cuda\"\nhead_k_dim = 192\n");
  ASSERT_FALSE(c.ok());
  one_line_naming_device(c.status());
  EXPECT_NE(c.status().message().find("192"), std::string::npos) << c.status().ToString();
#else
  ASSERT_FALSE(c.ok());
  one_line_naming_device(c.status());
  EXPECT_NE(c.status().message().find("ORRERY_CUDA=ON"), std::string::npos)
      << c.status().ToString();
#endif
}

// A model whose KDA core is meant for the GPU: f64 is refused at Create, and where no GPU is
// visible the first forward is one clear error (not a crash), whatever the build.
TEST(ModelConfigTest, KdaOnCudaNeedsF32AndAGpu) {
  ModelConfig config;
  config.vocab_size = 16;
  config.hidden_size = 8;
  config.num_layers = 1;
  config.layers = {LayerKind::kKda};
  config.first_k_dense = 1;
  config.dense_intermediate = 8;
  config.kda.heads = 1;
  config.kda.head_k_dim = 4;
  config.kda.head_v_dim = 4;
  config.kda.decay_rank = 4;
  config.kda.device = KdaDevice::kCuda;
  StatusOr<std::unique_ptr<Model>> f64 = Model::Create(config, 1, DType::kF64);
  ASSERT_FALSE(f64.ok());
  EXPECT_NE(f64.status().message().find("device = \"cuda\" needs an f32 model"), std::string::npos)
      << f64.status().ToString();
  if (CudaDeviceCount() > 0) GTEST_SKIP() << "a GPU is visible (tests/gpu covers that case)";
  StatusOr<std::unique_ptr<Model>> m = Model::Create(config, 1, DType::kF32);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  Batch batch;
  batch.tokens = Tensor::FromVector<int32_t>({1, 3}, {1, 2, 3});
  StatusOr<Tensor> logits = (*m)->Forward(batch, nullptr);
  ASSERT_FALSE(logits.ok());
  EXPECT_EQ(logits.status().code(), StatusCode::kFailedPrecondition) << logits.status().ToString();
  EXPECT_NE(logits.status().message().find("no CUDA device"), std::string::npos)
      << logits.status().ToString();
  EXPECT_EQ(logits.status().message().find('\n'), std::string::npos);
}

}  // namespace
}  // namespace orrery::model
