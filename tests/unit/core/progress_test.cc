#include "core/progress.h"

#include <gtest/gtest.h>

#include <cstdio>

namespace orrery {
namespace {

TEST(ProgressTest, FormatsRateAndEta) {
  std::string line = Progress::FormatLine("stage 1", 50, 200, "steps", 10.0, "loss 2.5");
  EXPECT_EQ(line, "stage 1 50/200 steps (25%) | 5.0 steps/s | ETA 30s | 10s | loss 2.5");
  EXPECT_EQ(Progress::FormatLine("x", 7, 0, "tok", 2.0, ""), "x 7 tok | 3.5 tok/s | 2s");
  EXPECT_EQ(FormatDuration(3725), "1h02m");
  EXPECT_EQ(FormatDuration(185), "3m05s");
}

TEST(ProgressTest, PlainLinesWhenNotATerminal) {
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  Progress p("run", 10, "steps", f, /*plain_interval_s=*/3600);
  for (int i = 1; i <= 10; ++i) p.Update(i);
  p.Finish("done");
  std::rewind(f);
  char buf[512];
  int lines = 0;
  std::string last;
  while (std::fgets(buf, sizeof(buf), f)) {
    ++lines;
    last = buf;
  }
  std::fclose(f);
  EXPECT_EQ(lines, 1);  // nothing before the interval, then the final line
  EXPECT_NE(last.find("10/10 steps"), std::string::npos);
  EXPECT_EQ(last.find('\r'), std::string::npos);
}

}  // namespace
}  // namespace orrery
