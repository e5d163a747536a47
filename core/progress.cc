#include "core/progress.h"

#include <unistd.h>

#include <cmath>

namespace orrery {

std::string FormatDuration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  long s = std::lround(seconds);
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof(buf), "%ldh%02ldm", s / 3600, (s % 3600) / 60);
  else if (s >= 60)
    std::snprintf(buf, sizeof(buf), "%ldm%02lds", s / 60, s % 60);
  else
    std::snprintf(buf, sizeof(buf), "%lds", s);
  return buf;
}

Progress::Progress(std::string label, int64_t total, std::string unit, std::FILE* out,
                   double plain_interval_s)
    : label_(std::move(label)),
      total_(total),
      unit_(std::move(unit)),
      out_(out),
      tty_(::isatty(::fileno(out)) != 0),
      plain_interval_s_(plain_interval_s),
      start_(std::chrono::steady_clock::now()),
      last_print_(start_) {}

std::string Progress::FormatLine(const std::string& label, int64_t done, int64_t total,
                                 const std::string& unit, double elapsed_s,
                                 const std::string& extra) {
  const double rate = elapsed_s > 0 ? static_cast<double>(done) / elapsed_s : 0.0;
  char buf[256];
  std::string line = label + " ";
  if (total > 0) {
    std::snprintf(buf, sizeof(buf), "%lld/%lld %s (%.0f%%)", static_cast<long long>(done),
                  static_cast<long long>(total), unit.c_str(), 100.0 * done / total);
  } else {
    std::snprintf(buf, sizeof(buf), "%lld %s", static_cast<long long>(done), unit.c_str());
  }
  line += buf;
  std::snprintf(buf, sizeof(buf), " | %.1f %s/s", rate, unit.c_str());
  line += buf;
  if (total > 0) {
    const double eta = rate > 0 ? static_cast<double>(total - done) / rate : NAN;
    line += " | ETA " + FormatDuration(eta);
  }
  line += " | " + FormatDuration(elapsed_s);
  if (!extra.empty()) line += " | " + extra;
  return line;
}

void Progress::Update(int64_t done, const std::string& extra) {
  done_ = done;
  const auto now = std::chrono::steady_clock::now();
  const double since = std::chrono::duration<double>(now - last_print_).count();
  if (tty_ ? since >= 0.1 : since >= plain_interval_s_) {
    last_print_ = now;
    Print(false, extra);
  }
}

void Progress::Finish(const std::string& extra) { Print(true, extra); }

void Progress::Print(bool final_line, const std::string& extra) {
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  std::string line = FormatLine(label_, done_, total_, unit_, elapsed, extra);
  if (tty_) {
    std::fprintf(out_, "\r\033[K%s%s", line.c_str(), final_line ? "\n" : "");
  } else {
    std::fprintf(out_, "%s\n", line.c_str());
  }
  std::fflush(out_);
}

}  // namespace orrery
