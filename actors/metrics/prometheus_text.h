// Prometheus exposition of a metrics store (the hub's and the dashboard's GET /metrics).
//
// Each series' latest value becomes one sample, named by Prometheus conventions (rules in
// docs/dashboard.md):
//   - `orrery_` prefix; the '/'-separated Orrery name joined with '_', other characters -> '_';
//   - a segment `layer<N>` becomes the label layer="N"; the segment pairs `env/<X>`,
//     `table/<X>` and `phase/<X>` become the labels env, table and phase, their key staying in
//     the name (reward/env/calc/mean -> orrery_reward_env_mean{env="calc"}, a family apart from
//     reward/mean's orrery_reward_mean);
//   - the record's source becomes the label actor; array metrics get one sample per element with
//     the label index;
//   - names ending in `_total` are counters, every other one a gauge (Orrery names carry base
//     units: `_seconds`, `_bytes`, `_ratio`).
// The text itself is written by prometheus-cpp's TextSerializer.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "actors/metrics/metrics_store.h"

namespace orrery {

struct PrometheusSeriesName {
  std::string name;                                         // orrery_reward_mean
  std::vector<std::pair<std::string, std::string>> labels;  // {"env", "math"}
  bool counter = false;
};

// Maps one Orrery metric name; fails (InvalidArgument) when nothing of a name is left.
StatusOr<PrometheusSeriesName> ToPrometheusName(const std::string& metric);

// What the hub counts about itself; exported as orrery_metrics_hub_* series.
struct IngestCounters {
  std::atomic<uint64_t> received{0};  // records stored
  std::atomic<uint64_t> rejected{0};  // messages that were not valid records
};

// The text exposition (format 0.0.4) of every series in `store`, plus per-actor heartbeat series
// and, when given, the hub's own counters.
std::string RenderPrometheusText(const MetricsStore& store, const IngestCounters* counters);

}  // namespace orrery
