#include "actors/metrics/prometheus_text.h"

#include <prometheus/metric_family.h>
#include <prometheus/text_serializer.h>

#include <cctype>
#include <map>
#include <sstream>

namespace orrery {
namespace {

bool IsLayerSegment(const std::string& s) {
  if (s.size() <= 5 || s.compare(0, 5, "layer") != 0) return false;
  for (size_t i = 5; i < s.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(s[i]))) return false;
  }
  return true;
}

bool IsKeyedSegment(const std::string& s) { return s == "env" || s == "table" || s == "phase"; }

std::string Sanitize(const std::string& s) {
  std::string out;
  for (char c : s) {
    const unsigned char u = static_cast<unsigned char>(c);
    out.push_back(std::isalnum(u) ? static_cast<char>(std::tolower(u)) : '_');
  }
  return out;
}

prometheus::ClientMetric Sample(const std::vector<std::pair<std::string, std::string>>& labels,
                                bool counter, double value) {
  prometheus::ClientMetric m;
  for (const auto& [k, v] : labels) m.label.push_back({k, v});
  if (counter) {
    m.counter.value = value;
  } else {
    m.gauge.value = value;
  }
  return m;
}

}  // namespace

StatusOr<PrometheusSeriesName> ToPrometheusName(const std::string& metric) {
  std::vector<std::string> parts;
  std::stringstream ss(metric);
  std::string part;
  while (std::getline(ss, part, '/')) parts.push_back(part);
  PrometheusSeriesName out;
  std::string body;
  auto has_label = [&](const std::string& key) {
    for (const auto& [k, v] : out.labels) {
      if (k == key) return true;
    }
    return false;
  };
  for (size_t i = 0; i < parts.size(); ++i) {
    if (IsLayerSegment(parts[i]) && !has_label("layer")) {
      out.labels.push_back({"layer", parts[i].substr(5)});
    } else if (IsKeyedSegment(parts[i]) && i + 1 < parts.size() && !has_label(parts[i])) {
      // The key stays in the name, so that reward/env/calc/mean and reward/mean are two
      // families (one family with and without the label would be counted twice by a sum()).
      out.labels.push_back({parts[i], parts[i + 1]});
      if (!body.empty()) body.push_back('_');
      body += parts[i];
      ++i;
    } else if (!parts[i].empty()) {
      if (!body.empty()) body.push_back('_');
      body += Sanitize(parts[i]);
    }
  }
  if (body.empty()) {
    return InvalidArgumentError("metric '" + metric + "' has no name left for Prometheus");
  }
  out.name = "orrery_" + body;
  out.counter = out.name.size() > 6 && out.name.compare(out.name.size() - 6, 6, "_total") == 0;
  return out;
}

std::string RenderPrometheusText(const MetricsStore& store, const IngestCounters* counters) {
  // Family name -> family; one sample per label set (the latest series wins a clash).
  std::map<std::string, prometheus::MetricFamily> families;
  std::map<std::string, std::map<std::vector<std::pair<std::string, std::string>>, uint64_t>> seen;
  auto add = [&](const std::string& name, const std::string& help, bool counter,
                 std::vector<std::pair<std::string, std::string>> labels, double value,
                 uint64_t seq) {
    prometheus::MetricFamily& fam = families[name];
    if (fam.name.empty()) {
      fam.name = name;
      fam.help = help;
      fam.type = counter ? prometheus::MetricType::Counter : prometheus::MetricType::Gauge;
    }
    auto& by_labels = seen[name];
    auto it = by_labels.find(labels);
    if (it != by_labels.end()) {
      if (it->second > seq) return;
      const prometheus::ClientMetric candidate = Sample(labels, counter, value);
      for (prometheus::ClientMetric& m : fam.metric) {
        if (m.label == candidate.label) m = candidate;
      }
      it->second = seq;
      return;
    }
    by_labels[labels] = seq;
    fam.metric.push_back(Sample(labels, counter, value));
  };

  for (const SeriesInfo& s : store.ListSeries()) {
    StatusOr<PrometheusSeriesName> pn = ToPrometheusName(s.name);
    if (!pn.ok()) continue;  // nothing to name it by; the dashboard still shows it
    const std::string help = "Latest value of Orrery metric " + s.name + " per actor";
    std::vector<std::pair<std::string, std::string>> labels = pn->labels;
    labels.push_back({"actor", s.source});
    if (!s.is_array) {
      if (!s.last.values.empty()) {
        add(pn->name, help, pn->counter, labels, s.last.values[0], s.last.seq);
      }
      continue;
    }
    for (size_t i = 0; i < s.last.values.size(); ++i) {
      std::vector<std::pair<std::string, std::string>> element = labels;
      element.push_back({"index", std::to_string(i)});
      add(pn->name, help, pn->counter, element, s.last.values[i], s.last.seq);
    }
  }
  for (const SourceInfo& src : store.ListSources()) {
    add("orrery_actor_last_heartbeat_timestamp_seconds",
        "Unix time of the last metric record received from the actor", false,
        {{"actor", src.source}}, src.last_time, 0);
    add("orrery_actor_metric_records_total", "Metric records received from the actor", true,
        {{"actor", src.source}}, static_cast<double>(src.records), 0);
  }
  if (counters != nullptr) {
    add("orrery_metrics_hub_records_received_total", "Metric records the hub stored", true, {},
        static_cast<double>(counters->received.load()), 0);
    add("orrery_metrics_hub_records_rejected_total",
        "Messages the hub rejected as invalid metric records", true, {},
        static_cast<double>(counters->rejected.load()), 0);
  }
  std::vector<prometheus::MetricFamily> out;
  for (auto& [name, fam] : families) out.push_back(std::move(fam));
  std::ostringstream text;
  prometheus::TextSerializer().Serialize(text, out);
  return text.str();
}

}  // namespace orrery
