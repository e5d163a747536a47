#include "actors/metrics/run_metrics_files.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>

namespace orrery {

StatusOr<std::vector<std::string>> FindRunMetricsFiles(const std::string& run_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(run_dir, ec)) {
    return NotFoundError(run_dir +
                         ": not a run directory (expected a directory with metrics.jsonl)");
  }
  std::vector<std::string> files;
  const fs::path top = fs::path(run_dir) / "metrics.jsonl";
  if (fs::is_regular_file(top, ec)) files.push_back(top.string());
  for (const fs::directory_entry& e : fs::directory_iterator(run_dir, ec)) {
    if (!e.is_directory(ec)) continue;
    const fs::path f = e.path() / "metrics.jsonl";
    if (fs::is_regular_file(f, ec)) files.push_back(f.string());
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
