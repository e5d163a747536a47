#include "core/metrics.h"

#include <chrono>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

namespace orrery {

double UnixSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string MetricRecord::ToJson() const {
  nlohmann::json j;
  j["time"] = time;
  j["source"] = source;
  j["step"] = step;
  nlohmann::json m = nlohmann::json::object();
  for (const auto& [k, v] : scalars) m[k] = v;
  for (const auto& [k, v] : vectors) m[k] = v;
  j["metrics"] = m;
  return j.dump();
}

StatusOr<MetricRecord> MetricRecord::FromJson(const std::string& line) {
  nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return InvalidArgumentError("metric record is not a JSON object");
  MetricRecord r;
  if (!j.contains("metrics") || !j["metrics"].is_object()) {
    return InvalidArgumentError("metric record lacks a 'metrics' object");
  }
  if (j.contains("time") && j["time"].is_number()) r.time = j["time"].get<double>();
  if (j.contains("source") && j["source"].is_string()) r.source = j["source"].get<std::string>();
  if (j.contains("step") && j["step"].is_number_integer()) r.step = j["step"].get<int64_t>();
  for (auto it = j["metrics"].begin(); it != j["metrics"].end(); ++it) {
    if (it.value().is_number()) {
      r.scalars[it.key()] = it.value().get<double>();
    } else if (it.value().is_array()) {
      std::vector<double> v;
      for (const auto& e : it.value()) {
        if (!e.is_number())
          return InvalidArgumentError("metric '" + it.key() + "' has a non-numeric element");
        v.push_back(e.get<double>());
      }
      r.vectors[it.key()] = std::move(v);
    } else {
      return InvalidArgumentError("metric '" + it.key() + "' is neither a number nor an array");
    }
  }
  return r;
}

StatusOr<std::unique_ptr<MetricsFileWriter>> MetricsFileWriter::Open(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "a");
  if (f == nullptr) return ErrnoError("open " + path, errno);
  return std::unique_ptr<MetricsFileWriter>(new MetricsFileWriter(f));
}

MetricsFileWriter::~MetricsFileWriter() { std::fclose(file_); }

Status MetricsFileWriter::Write(const MetricRecord& record) {
  std::string line = record.ToJson() + "\n";
  std::lock_guard<std::mutex> lock(mu_);
  if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fflush(file_) != 0) {
    return ErrnoError("write metrics", errno);
  }
  return Status::OK();
}

StatusOr<std::vector<MetricRecord>> ReadMetricsFile(const std::string& path, int* skipped) {
  std::ifstream in(path);
  if (!in) return NotFoundError(path + ": cannot open metrics file");
  std::vector<MetricRecord> out;
  int bad = 0;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    StatusOr<MetricRecord> r = MetricRecord::FromJson(line);
    if (r.ok())
      out.push_back(std::move(r).value());
    else
      ++bad;
  }
  if (skipped) *skipped = bad;
  return out;
}

}  // namespace orrery
