// Durable time series of metric records, kept in RocksDB.
//
// The metrics hub appends every MetricRecord it receives; the dashboard and the Prometheus
// exporter read series back. Each scalar or array metric of a record becomes one point of the
// series (name, source). Points carry a store-wide sequence number, so a client that polls with
// "after = last sequence seen" gets exactly the points it has not drawn yet.
//
// On disk (one RocksDB database, the default column family):
//   r <seq:be64>                              -> the record as JSON (replay, export)
//   p <name> \0 <source> \0 <seq:be64>        -> point: time, step, values (f64, host order)
//   s <name> \0 <source>                      -> series summary (kind, count, last point)
//   a <source>                                -> source summary (first/last time, records, step)
// The summaries are small and loaded at Open, so listing series never scans the points. Writes go
// through RocksDB's write-ahead log: a record is durable once Append returns, and a crash of the
// hub loses nothing it had stored. The store survives restarts; sequence numbers continue.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/metrics.h"
#include "core/status.h"

namespace rocksdb {
class DB;
class Env;
}  // namespace rocksdb

namespace orrery {

struct MetricsStoreOptions {
  // Keep the database in memory (RocksDB's MemEnv): used to serve a finished run's metrics.jsonl
  // without writing next to it. Nothing survives Close.
  bool in_memory = false;
};

struct MetricPoint {
  uint64_t seq = 0;
  double time = 0;  // Unix seconds, from the record
  int64_t step = 0;
  std::vector<double> values;  // one value for a scalar metric
};

struct SeriesInfo {
  std::string name;
  std::string source;
  bool is_array = false;
  uint64_t points = 0;
  MetricPoint last;
};

struct SourceInfo {
  std::string source;
  double first_time = 0;
  double last_time = 0;  // the source's last heartbeat: every record counts as one
  uint64_t records = 0;
  int64_t last_step = 0;
};

// The points of one series, from one source.
struct SourceSeries {
  std::string source;
  std::vector<MetricPoint> points;
};

class MetricsStore {
 public:
  // Opens (creating when missing) the database in directory `path`.
  static StatusOr<std::unique_ptr<MetricsStore>> Open(const std::string& path,
                                                      const MetricsStoreOptions& options = {});
  ~MetricsStore();
  MetricsStore(const MetricsStore&) = delete;
  MetricsStore& operator=(const MetricsStore&) = delete;

  // Stores one record; thread-safe. A record without a source or without metrics is rejected.
  Status Append(const MetricRecord& record);

  // Every series and source known, sorted by name (then source).
  std::vector<SeriesInfo> ListSeries() const;
  std::vector<SourceInfo> ListSources() const;
  // The sequence number of the last point stored (0 when empty).
  uint64_t last_seq() const;
  uint64_t records() const;

  // The points of series `name` with seq > after_seq, per source, in sequence order. When a source
  // has more than max_points such points, evenly spaced ones are kept (always the last one).
  StatusOr<std::vector<SourceSeries>> Query(const std::string& name, uint64_t after_seq = 0,
                                            size_t max_points = SIZE_MAX) const;

  // Calls `fn` for every stored record in sequence order; stops at the first error it returns.
  Status ForEachRecord(const std::function<Status(uint64_t seq, const MetricRecord&)>& fn) const;

 private:
  MetricsStore() = default;
  Status Load();

  std::unique_ptr<rocksdb::Env> mem_env_;
  std::unique_ptr<rocksdb::DB> db_;
  mutable std::mutex mu_;
  uint64_t seq_ = 0;
  uint64_t records_ = 0;
  std::map<std::pair<std::string, std::string>, SeriesInfo> series_;
  std::map<std::string, SourceInfo> sources_;
};

}  // namespace orrery
