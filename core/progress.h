// A progress display for long work: count, rate and ETA.
//
// On a terminal it redraws one line with '\r'; otherwise (a log file, CI) it prints a plain line
// at most every `plain_interval_s` seconds, so logs stay readable.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace orrery {

class Progress {
 public:
  // total <= 0 means unknown (no ETA). `unit` names what is counted ("steps", "tokens").
  Progress(std::string label, int64_t total, std::string unit, std::FILE* out = stdout,
           double plain_interval_s = 10.0);
  // Sets the count done so far; `extra` is appended ("loss 2.31").
  void Update(int64_t done, const std::string& extra = "");
  // Prints the final line (always).
  void Finish(const std::string& extra = "");

  // The text of one progress line; exposed for tests.
  static std::string FormatLine(const std::string& label, int64_t done, int64_t total,
                                const std::string& unit, double elapsed_s,
                                const std::string& extra);

 private:
  void Print(bool final_line, const std::string& extra);

  std::string label_;
  int64_t total_;
  std::string unit_;
  std::FILE* out_;
  bool tty_;
  double plain_interval_s_;
  int64_t done_ = 0;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_print_;
};

// "1h02m", "3m05s", "12s".
std::string FormatDuration(double seconds);

}  // namespace orrery
