// `orrery export`: a run's metric records in formats other tools read.
//
//   jsonl  the MetricRecord lines of every metric file of the run, merged in time order
//   csv    long ("tidy") form, one row per value: time,source,step,metric,index,value
//          (index is empty for a scalar and the element index for an array metric)
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "core/metrics.h"
#include "core/status.h"

namespace orrery {

enum class ExportFormat { kCsv, kJsonl };

// "csv" or "jsonl"; anything else is an InvalidArgument naming the choices.
StatusOr<ExportFormat> ParseExportFormat(const std::string& text);

Status WriteExport(const std::vector<MetricRecord>& records, ExportFormat format,
                   std::ostream& out);

}  // namespace orrery
