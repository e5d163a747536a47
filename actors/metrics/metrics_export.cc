#include "actors/metrics/metrics_export.h"

#include <charconv>

namespace orrery {
namespace {

std::string CsvField(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') out.push_back('"');
    out.push_back(c);
  }
  out.push_back('"');
  return out;
}

// The shortest text that reads back as the same double.
std::string Number(double v) {
  char buf[32];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  return ec == std::errc() ? std::string(buf, end) : "nan";
}

}  // namespace

StatusOr<ExportFormat> ParseExportFormat(const std::string& text) {
  if (text == "csv") return ExportFormat::kCsv;
  if (text == "jsonl") return ExportFormat::kJsonl;
  return InvalidArgumentError("--format: expected csv or jsonl, got '" + text + "'");
}

Status WriteExport(const std::vector<MetricRecord>& records, ExportFormat format,
                   std::ostream& out) {
  if (format == ExportFormat::kJsonl) {
    for (const MetricRecord& r : records) out << r.ToJson() << '\n';
  } else {
    out << "time,source,step,metric,index,value\n";
    for (const MetricRecord& r : records) {
      const std::string prefix =
          Number(r.time) + "," + CsvField(r.source) + "," + std::to_string(r.step) + ",";
      for (const auto& [name, v] : r.scalars) {
        out << prefix << CsvField(name) << ",," << Number(v) << '\n';
      }
      for (const auto& [name, values] : r.vectors) {
        for (size_t i = 0; i < values.size(); ++i) {
          out << prefix << CsvField(name) << ',' << i << ',' << Number(values[i]) << '\n';
        }
      }
    }
  }
  out.flush();
  if (!out) return IoError("export: write failed");
  return Status::OK();
}

}  // namespace orrery
