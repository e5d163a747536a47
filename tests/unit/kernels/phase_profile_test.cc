// PhaseProfile on the CPU: scopes are counted per name (nested ones inclusive), nothing is
// recorded while stopped, and Stop returns names in first-seen order.
#include "kernels/phase_profile.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace orrery::kernels {
namespace {

TEST(PhaseProfileTest, CountsScopesPerNameAndNestsInclusively) {
  {
    PhaseScope ignored("before");  // not started: not recorded
  }
  ASSERT_TRUE(PhaseProfile::Start(Device::Cpu()).ok());
  for (int i = 0; i < 3; ++i) {
    PhaseScope outer("outer");
    PhaseScope inner("outer.inner");
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  {
    PhaseScope early("early");
    early.Stop();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // after Stop: not counted
  }
  auto times = PhaseProfile::Stop();
  ASSERT_TRUE(times.ok()) << times.status().ToString();
  ASSERT_EQ(times->size(), 3u);
  EXPECT_EQ((*times)[0].name, "outer");
  EXPECT_EQ((*times)[1].name, "outer.inner");
  EXPECT_EQ((*times)[2].name, "early");
  EXPECT_EQ((*times)[0].calls, 3);
  EXPECT_EQ((*times)[1].calls, 3);
  EXPECT_GE((*times)[0].host_ms, 6.0);
  EXPECT_GE((*times)[0].host_ms, (*times)[1].host_ms);  // inclusive
  EXPECT_LT((*times)[2].host_ms, 15.0);
  EXPECT_FALSE(PhaseProfile::active());
  const std::string table = PhaseProfile::Format(*times, 10.0);
  EXPECT_NE(table.find("outer.inner"), std::string::npos);
}

TEST(PhaseProfileTest, StartClearsAnEarlierRecording) {
  ASSERT_TRUE(PhaseProfile::Start(Device::Cpu()).ok());
  { PhaseScope a("a"); }
  ASSERT_TRUE(PhaseProfile::Start(Device::Cpu()).ok());
  { PhaseScope b("b"); }
  auto times = PhaseProfile::Stop();
  ASSERT_TRUE(times.ok());
  ASSERT_EQ(times->size(), 1u);
  EXPECT_EQ((*times)[0].name, "b");
}

}  // namespace
}  // namespace orrery::kernels
