#include "model/config.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <map>
#include <string>

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

}  // namespace
}  // namespace orrery::model
