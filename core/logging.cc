#include "core/logging.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <mutex>
#include <optional>

namespace orrery {
namespace {

LogLevel LevelFromEnv() {
  LogLevel level = LogLevel::kInfo;
  if (const char* env = std::getenv("ORRERY_LOG_LEVEL")) ParseLogLevel(env, &level);
  return level;
}

std::atomic<int>& MinLevel() {
  static std::atomic<int> level{static_cast<int>(LevelFromEnv())};
  return level;
}

std::mutex& PrefixMutex() {
  static std::mutex mu;
  return mu;
}
std::string& ProcessPrefix() {
  static std::string prefix;
  return prefix;
}
thread_local std::optional<std::string> t_prefix;

char LevelLetter(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return 'D';
    case LogLevel::kInfo:
      return 'I';
    case LogLevel::kWarn:
      return 'W';
    case LogLevel::kError:
      return 'E';
    case LogLevel::kFatal:
      return 'F';
  }
  return '?';
}

}  // namespace

void SetMinLogLevel(LogLevel level) { MinLevel().store(static_cast<int>(level)); }
LogLevel MinLogLevel() { return static_cast<LogLevel>(MinLevel().load(std::memory_order_relaxed)); }

bool ParseLogLevel(std::string_view text, LogLevel* level) {
  if (text == "debug")
    *level = LogLevel::kDebug;
  else if (text == "info")
    *level = LogLevel::kInfo;
  else if (text == "warn")
    *level = LogLevel::kWarn;
  else if (text == "error")
    *level = LogLevel::kError;
  else
    return false;
  return true;
}

void SetProcessLogPrefix(std::string prefix) {
  std::lock_guard<std::mutex> lock(PrefixMutex());
  ProcessPrefix() = std::move(prefix);
}

ScopedLogPrefix::ScopedLogPrefix(std::string prefix)
    : previous_(t_prefix.value_or("")), had_previous_(t_prefix.has_value()) {
  t_prefix = std::move(prefix);
}

ScopedLogPrefix::~ScopedLogPrefix() {
  if (had_previous_)
    t_prefix = previous_;
  else
    t_prefix.reset();
}

std::string FormatLogLine(LogLevel level, std::string_view prefix, std::string_view message,
                          long long unix_millis) {
  const std::time_t secs = static_cast<std::time_t>(unix_millis / 1000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char stamp[96];
  std::snprintf(stamp, sizeof(stamp), "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<int>(unix_millis % 1000));
  std::string line = stamp;
  line += ' ';
  line += LevelLetter(level);
  if (!prefix.empty()) {
    line += " [";
    line += prefix;
    line += ']';
  }
  line += ' ';
  line += message;
  return line;
}

namespace internal {

LogMessage::LogMessage(LogLevel level, const char* file, int line)
    : level_(level), file_(file), line_(line) {}

LogMessage::~LogMessage() {
  std::string prefix;
  if (t_prefix.has_value()) {
    prefix = *t_prefix;
  } else {
    std::lock_guard<std::mutex> lock(PrefixMutex());
    prefix = ProcessPrefix();
  }
  std::string message = stream_.str();
  if (level_ >= LogLevel::kError) {
    const char* base = file_;
    for (const char* p = file_; *p; ++p) {
      if (*p == '/') base = p + 1;
    }
    message += " (" + std::string(base) + ":" + std::to_string(line_) + ")";
  }
  const long long millis = std::chrono::duration_cast<std::chrono::milliseconds>(
                               std::chrono::system_clock::now().time_since_epoch())
                               .count();
  std::string out = FormatLogLine(level_, prefix, message, millis);
  out += '\n';
  std::fwrite(out.data(), 1, out.size(), stderr);  // one write per line: lines do not interleave
  if (level_ == LogLevel::kFatal) {
    std::fflush(stderr);
    std::abort();
  }
}

}  // namespace internal
}  // namespace orrery
