// Weight publication: atomic versioned files, the newest `keep` kept, exact round trip.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "learner/rl/weight_store.h"

namespace orrery::rl {
namespace {

TEST(RlWeightStore, PublishLatestLoadAndPrune) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("orrery-rl-weights-" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  WeightStore store(dir.string(), 3);
  EXPECT_FALSE(store.Latest().ok());
  for (int64_t v = 1; v <= 4; ++v) {
    std::vector<std::pair<std::string, Tensor>> named = {
        {"a.weight", Tensor::FromVector<float>({2, 2}, {1.0f * v, 2, 3, 4})},
        {"layers.1.moe.balancing_bias", Tensor::FromVector<float>({3}, {0.5f, -0.5f, 0.25f * v})}};
    auto t = store.Publish(named, v);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    EXPECT_EQ(t->bytes, 28);
  }
  auto latest = store.Latest();
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(*latest, 4);
  EXPECT_FALSE(std::filesystem::exists(store.PathOf(1)));
  EXPECT_TRUE(std::filesystem::exists(store.PathOf(2)));
  LoadTimings lt;
  auto loaded = store.Load(4, &lt);
  ASSERT_TRUE(loaded.ok());
  ASSERT_EQ(loaded->size(), 2u);
  EXPECT_EQ(lt.bytes, 28);
  for (const auto& [name, tensor] : *loaded) {
    if (name == "a.weight") {
      EXPECT_EQ(tensor.data<float>()[0], 4.0f);
    } else {
      EXPECT_EQ(tensor.data<float>()[2], 1.0f);
    }
  }
  EXPECT_FALSE(store.Load(1).ok());
  EXPECT_FALSE(store.Publish({}, -1).ok());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace orrery::rl
