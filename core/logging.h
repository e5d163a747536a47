// Logging with levels, UTC timestamps and an actor/rank prefix, to stderr.
//
//   ORRERY_LOG(INFO) << "stage " << stage << " done";
//   -> 2026-11-30T01:02:03.456Z I [learner:0] stage 2 done
//
// The prefix is per thread (an actor running as a thread names itself) with a process-wide
// default (an actor running as a process). The level threshold comes from SetMinLogLevel or the
// ORRERY_LOG_LEVEL environment variable (debug, info, warn, error).
#pragma once

#include <sstream>
#include <string>
#include <string_view>

namespace orrery {

enum class LogLevel : int { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3, kFatal = 4 };

void SetMinLogLevel(LogLevel level);
LogLevel MinLogLevel();
// Parses "debug", "info", "warn" or "error".
bool ParseLogLevel(std::string_view text, LogLevel* level);

// Process-wide default prefix ("" for none).
void SetProcessLogPrefix(std::string prefix);
// Prefix of the calling thread for the lifetime of the object; restores the previous one.
class ScopedLogPrefix {
 public:
  explicit ScopedLogPrefix(std::string prefix);
  ~ScopedLogPrefix();
  ScopedLogPrefix(const ScopedLogPrefix&) = delete;
  ScopedLogPrefix& operator=(const ScopedLogPrefix&) = delete;

 private:
  std::string previous_;
  bool had_previous_;
};

// Formats one log line (without newline); exposed for tests.
std::string FormatLogLine(LogLevel level, std::string_view prefix, std::string_view message,
                          long long unix_millis);

namespace internal {
class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line);
  ~LogMessage();  // writes the line; kFatal aborts
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  const char* file_;
  int line_;
  std::ostringstream stream_;
};
struct Voidify {
  void operator&(std::ostream&) {}
};
}  // namespace internal

}  // namespace orrery

#define ORRERY_LOG_LEVEL_DEBUG ::orrery::LogLevel::kDebug
#define ORRERY_LOG_LEVEL_INFO ::orrery::LogLevel::kInfo
#define ORRERY_LOG_LEVEL_WARN ::orrery::LogLevel::kWarn
#define ORRERY_LOG_LEVEL_ERROR ::orrery::LogLevel::kError
#define ORRERY_LOG_LEVEL_FATAL ::orrery::LogLevel::kFatal

#define ORRERY_LOG(level)                              \
  (ORRERY_LOG_LEVEL_##level < ::orrery::MinLogLevel()) \
      ? (void)0                                        \
      : ::orrery::internal::Voidify() &                \
            ::orrery::internal::LogMessage(ORRERY_LOG_LEVEL_##level, __FILE__, __LINE__).stream()
