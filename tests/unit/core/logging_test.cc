#include "core/logging.h"

#include <gtest/gtest.h>

namespace orrery {
namespace {

TEST(LoggingTest, LineFormat) {
  // 2026-11-30T01:02:03.456Z
  const long long ms = 1796000523456LL;
  std::string line = FormatLogLine(LogLevel::kWarn, "replay:0", "table full", ms);
  EXPECT_EQ(line.substr(24), " W [replay:0] table full");
  EXPECT_EQ(line[10], 'T');
  EXPECT_EQ(line.substr(19, 5), ".456Z");
  EXPECT_EQ(FormatLogLine(LogLevel::kInfo, "", "x", 0), "1970-01-01T00:00:00.000Z I x");
}

TEST(LoggingTest, LevelsAndPrefixes) {
  LogLevel l;
  EXPECT_TRUE(ParseLogLevel("debug", &l));
  EXPECT_EQ(l, LogLevel::kDebug);
  EXPECT_FALSE(ParseLogLevel("loud", &l));
  SetMinLogLevel(LogLevel::kError);
  testing::internal::CaptureStderr();
  ORRERY_LOG(INFO) << "hidden";
  {
    ScopedLogPrefix p("learner:1");
    ORRERY_LOG(ERROR) << "shown";
  }
  std::string err = testing::internal::GetCapturedStderr();
  SetMinLogLevel(LogLevel::kInfo);
  EXPECT_EQ(err.find("hidden"), std::string::npos);
  EXPECT_NE(err.find("E [learner:1] shown"), std::string::npos);
}

}  // namespace
}  // namespace orrery
