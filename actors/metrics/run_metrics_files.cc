#include "actors/metrics/run_metrics_files.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>

namespace orrery {

StatusOr<std::vector<std::string>> FindRunMetricsFiles(const std::string& run_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status status = fs::status(run_dir, ec);
  if (status.type() == fs::file_type::not_found) {
    return NotFoundError(run_dir +
                         ": does not exist (expected a run directory with metrics.jsonl)");
  }
  if (ec) return IoError(run_dir + ": " + ec.message());
  if (!fs::is_directory(status)) {
    return NotFoundError(run_dir +
                         ": is not a directory (expected a run directory with metrics.jsonl)");
  }
  std::vector<std::string> files;
  // A missing file is no error: each check has its own error code, apart from the listing's.
  auto add_if_file = [&files](const fs::path& path) {
    std::error_code file_ec;
    if (fs::is_regular_file(path, file_ec)) files.push_back(path.string());
  };
  add_if_file(fs::path(run_dir) / "metrics.jsonl");
  add_if_file(fs::path(run_dir) / "fleet_metrics.jsonl");  // the launcher's (actors' states)
  for (fs::directory_iterator it(run_dir, ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    std::error_code entry_ec;
    if (it->is_directory(entry_ec)) add_if_file(it->path() / "metrics.jsonl");
  }
  if (ec) return IoError(run_dir + ": cannot list directory: " + ec.message());
  std::sort(files.begin(), files.end());
  return files;
}

Status RunMetricsTailer::Poll(std::vector<MetricRecord>* records) {
  ORRERY_ASSIGN_OR_RETURN(std::vector<std::string> files, FindRunMetricsFiles(run_dir_));
  for (const std::string& path : files) {
    uint64_t& offset = offsets_[path];
    std::error_code ec;
    const uintmax_t size = std::filesystem::file_size(path, ec);
    if (!ec && size < offset) offset = 0;  // the file was replaced: read it again from the start
    std::FILE* f = std::fopen(path.c_str(), "rb");
    if (f == nullptr) return ErrnoError("open " + path, errno);
    if (std::fseek(f, static_cast<long>(offset), SEEK_SET) != 0) {
      std::fclose(f);
      return ErrnoError("seek " + path, errno);
    }
    std::string data;
    char buf[1 << 16];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) data.append(buf, n);
    const bool failed = std::ferror(f) != 0;
    std::fclose(f);
    if (failed) return IoError("read " + path);
    const size_t end = data.rfind('\n');
    if (end == std::string::npos) continue;  // no complete line yet
    size_t start = 0;
    while (start <= end) {
      const size_t nl = data.find('\n', start);
      if (nl > start) {
        StatusOr<MetricRecord> r = MetricRecord::FromJson(data.substr(start, nl - start));
        if (r.ok()) {
          records->push_back(std::move(r).value());
        } else {
          ++malformed_;
        }
      }
      start = nl + 1;
    }
    offset += end + 1;
  }
  return Status::OK();
}

StatusOr<std::vector<MetricRecord>> ReadRunMetrics(const std::string& run_dir, int64_t* malformed) {
  ORRERY_ASSIGN_OR_RETURN(std::vector<std::string> files, FindRunMetricsFiles(run_dir));
  if (files.empty()) {
    return NotFoundError(run_dir +
                         ": no metrics.jsonl in the run directory or its sub-directories");
  }
  RunMetricsTailer tailer(run_dir);
  std::vector<MetricRecord> records;
  ORRERY_RETURN_IF_ERROR(tailer.Poll(&records));
  std::stable_sort(records.begin(), records.end(),
                   [](const MetricRecord& a, const MetricRecord& b) { return a.time < b.time; });
  if (malformed) *malformed = tailer.malformed_lines();
  return records;
}

}  // namespace orrery
