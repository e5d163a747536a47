#include "actors/metrics/metrics_store.h"

#include <rocksdb/db.h>
#include <rocksdb/env.h>
#include <rocksdb/options.h>
#include <rocksdb/write_batch.h>

#include <cstring>

namespace orrery {
namespace {

constexpr char kRecordPrefix = 'r';
constexpr char kPointPrefix = 'p';
constexpr char kSeriesPrefix = 's';
constexpr char kSourcePrefix = 'a';

void PutBigEndian64(std::string* out, uint64_t v) {
  for (int shift = 56; shift >= 0; shift -= 8) out->push_back(static_cast<char>(v >> shift));
}

uint64_t GetBigEndian64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

template <typename T>
void PutRaw(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(T));
}

template <typename T>
bool GetRaw(const std::string& in, size_t* pos, T* v) {
  if (*pos + sizeof(T) > in.size()) return false;
  std::memcpy(v, in.data() + *pos, sizeof(T));
  *pos += sizeof(T);
  return true;
}

std::string RecordKey(uint64_t seq) {
  std::string k(1, kRecordPrefix);
  PutBigEndian64(&k, seq);
  return k;
}

std::string SeriesKey(char prefix, const std::string& name, const std::string& source) {
  std::string k(1, prefix);
  k += name;
  k.push_back('\0');
  k += source;
  return k;
}

std::string EncodePoint(const MetricPoint& p) {
  std::string v;
  PutRaw(&v, p.seq);
  PutRaw(&v, p.time);
  PutRaw(&v, p.step);
  PutRaw(&v, static_cast<uint64_t>(p.values.size()));
  for (double x : p.values) PutRaw(&v, x);
  return v;
}

bool DecodePoint(const std::string& in, size_t* pos, MetricPoint* p) {
  uint64_t n = 0;
  if (!GetRaw(in, pos, &p->seq) || !GetRaw(in, pos, &p->time) || !GetRaw(in, pos, &p->step) ||
      !GetRaw(in, pos, &n) || n > (in.size() - *pos) / sizeof(double)) {
    return false;
  }
  p->values.resize(n);
  for (uint64_t i = 0; i < n; ++i) GetRaw(in, pos, &p->values[i]);
  return true;
}

std::string EncodeSeries(const SeriesInfo& s) {
  std::string v;
  PutRaw(&v, static_cast<uint8_t>(s.is_array));
  PutRaw(&v, s.points);
  v += EncodePoint(s.last);
  return v;
}

std::string EncodeSource(const SourceInfo& s) {
  std::string v;
  PutRaw(&v, s.first_time);
  PutRaw(&v, s.last_time);
  PutRaw(&v, s.records);
  PutRaw(&v, s.last_step);
  return v;
}

Status FromRocks(const rocksdb::Status& s, const std::string& what) {
  if (s.ok()) return Status::OK();
  return IoError("metrics store: " + what + ": " + s.ToString());
}

}  // namespace

StatusOr<std::unique_ptr<MetricsStore>> MetricsStore::Open(const std::string& path,
                                                           const MetricsStoreOptions& options) {
  std::unique_ptr<MetricsStore> store(new MetricsStore());
  rocksdb::Options db_options;
  db_options.create_if_missing = true;
  db_options.keep_log_file_num = 2;
  db_options.max_log_file_size = 1 << 20;
  if (options.in_memory) {
    store->mem_env_.reset(rocksdb::NewMemEnv(rocksdb::Env::Default()));
    db_options.env = store->mem_env_.get();
  }
  rocksdb::DB* db = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(db_options, path, &db);
  if (!s.ok()) {
    return IoError("metrics store " + path + ": cannot open RocksDB database: " + s.ToString());
  }
  store->db_.reset(db);
  ORRERY_RETURN_IF_ERROR(store->Load());
  return store;
}

MetricsStore::~MetricsStore() {
  if (db_) {
    db_->Close().PermitUncheckedError();
    db_.reset();
  }
}

Status MetricsStore::Load() {
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  for (it->Seek(std::string(1, kSeriesPrefix)); it->Valid() && it->key()[0] == kSeriesPrefix;
       it->Next()) {
    const std::string key = it->key().ToString();
    const size_t zero = key.find('\0');
    const std::string value = it->value().ToString();
    SeriesInfo info;
    uint8_t is_array = 0;
    size_t pos = 0;
    if (zero == std::string::npos || !GetRaw(value, &pos, &is_array) ||
        !GetRaw(value, &pos, &info.points) || !DecodePoint(value, &pos, &info.last)) {
      return DataLossError("metrics store: corrupt series summary");
    }
    info.name = key.substr(1, zero - 1);
    info.source = key.substr(zero + 1);
    info.is_array = is_array != 0;
    series_[{info.name, info.source}] = std::move(info);
  }
  for (it->Seek(std::string(1, kSourcePrefix)); it->Valid() && it->key()[0] == kSourcePrefix;
       it->Next()) {
    SourceInfo info;
    info.source = it->key().ToString().substr(1);
    const std::string value = it->value().ToString();
    size_t pos = 0;
    if (!GetRaw(value, &pos, &info.first_time) || !GetRaw(value, &pos, &info.last_time) ||
        !GetRaw(value, &pos, &info.records) || !GetRaw(value, &pos, &info.last_step)) {
      return DataLossError("metrics store: corrupt source summary");
    }
    records_ += info.records;
    sources_[info.source] = std::move(info);
  }
  // The last record key holds the highest sequence number.
  it->SeekForPrev(std::string(1, kRecordPrefix) + std::string(8, '\xff'));
  if (it->Valid() && it->key()[0] == kRecordPrefix && it->key().size() == 9) {
    seq_ = GetBigEndian64(it->key().data() + 1);
  }
  return FromRocks(it->status(), "load");
}

Status MetricsStore::Append(const MetricRecord& record) {
  if (record.source.empty()) return InvalidArgumentError("metric record has no source");
  if (record.scalars.empty() && record.vectors.empty()) {
    return InvalidArgumentError("metric record from '" + record.source + "' has no metrics");
  }
  for (const auto& [name, v] : record.scalars) {
    if (name.empty() || name.find('\0') != std::string::npos) {
      return InvalidArgumentError("metric record has an invalid metric name");
    }
  }
  for (const auto& [name, v] : record.vectors) {
    if (name.empty() || name.find('\0') != std::string::npos) {
      return InvalidArgumentError("metric record has an invalid metric name");
    }
  }
  if (record.source.find('\0') != std::string::npos) {
    return InvalidArgumentError("metric record has an invalid source");
  }

  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t seq = seq_ + 1;
  rocksdb::WriteBatch batch;
  batch.Put(RecordKey(seq), record.ToJson());
  std::vector<SeriesInfo> updated;
  auto add_point = [&](const std::string& name, std::vector<double> values, bool is_array) {
    MetricPoint p{seq, record.time, record.step, std::move(values)};
    std::string key = SeriesKey(kPointPrefix, name, record.source);
    key.push_back('\0');
    PutBigEndian64(&key, seq);
    batch.Put(key, EncodePoint(p));
    auto it = series_.find({name, record.source});
    SeriesInfo info;
    if (it != series_.end()) {
      info = it->second;
    } else {
      info.name = name;
      info.source = record.source;
    }
    info.is_array = is_array;
    info.points += 1;
    info.last = std::move(p);
    batch.Put(SeriesKey(kSeriesPrefix, name, record.source), EncodeSeries(info));
    updated.push_back(std::move(info));
  };
  for (const auto& [name, v] : record.scalars) add_point(name, {v}, false);
  for (const auto& [name, v] : record.vectors) add_point(name, v, true);

  auto src_it = sources_.find(record.source);
  SourceInfo source;
  if (src_it != sources_.end()) {
    source = src_it->second;
  } else {
    source.source = record.source;
    source.first_time = source.last_time = record.time;
    source.last_step = record.step;
  }
  source.records += 1;
  if (record.time >= source.last_time) {
    source.last_time = record.time;
    source.last_step = record.step;
  }
  source.first_time = std::min(source.first_time, record.time);
  batch.Put(std::string(1, kSourcePrefix) + record.source, EncodeSource(source));

  ORRERY_RETURN_IF_ERROR(FromRocks(db_->Write(rocksdb::WriteOptions(), &batch), "append"));
  seq_ = seq;
  records_ += 1;
  for (SeriesInfo& info : updated) {
    series_[{info.name, info.source}] = std::move(info);
  }
  sources_[record.source] = std::move(source);
  return Status::OK();
}

std::vector<SeriesInfo> MetricsStore::ListSeries() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<SeriesInfo> out;
  out.reserve(series_.size());
  for (const auto& [key, info] : series_) out.push_back(info);
  return out;
}

std::vector<SourceInfo> MetricsStore::ListSources() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<SourceInfo> out;
  for (const auto& [key, info] : sources_) out.push_back(info);
  return out;
}

uint64_t MetricsStore::last_seq() const {
  std::lock_guard<std::mutex> lock(mu_);
  return seq_;
}

uint64_t MetricsStore::records() const {
  std::lock_guard<std::mutex> lock(mu_);
  return records_;
}

StatusOr<std::vector<SourceSeries>> MetricsStore::Query(const std::string& name, uint64_t after_seq,
                                                        size_t max_points) const {
  std::vector<SourceSeries> out;
  std::string prefix(1, kPointPrefix);
  prefix += name;
  prefix.push_back('\0');
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  it->Seek(prefix);
  while (it->Valid() && it->key().starts_with(prefix)) {
    const std::string key = it->key().ToString();
    const size_t zero = key.find('\0', prefix.size());
    if (zero == std::string::npos || key.size() != zero + 9) {
      return DataLossError("metrics store: corrupt point key for '" + name + "'");
    }
    const std::string source = key.substr(prefix.size(), zero - prefix.size());
    if (out.empty() || out.back().source != source) {
      out.push_back(SourceSeries{source, {}});
      // Jump to the first point after after_seq of this source.
      std::string start = key.substr(0, zero + 1);
      PutBigEndian64(&start, after_seq + 1);
      if (GetBigEndian64(key.data() + zero + 1) <= after_seq) {
        it->Seek(start);
        continue;
      }
    }
    MetricPoint p;
    const std::string value = it->value().ToString();
    size_t pos = 0;
    if (!DecodePoint(value, &pos, &p)) {
      return DataLossError("metrics store: corrupt point of '" + name + "'");
    }
    out.back().points.push_back(std::move(p));
    it->Next();
  }
  ORRERY_RETURN_IF_ERROR(FromRocks(it->status(), "query " + name));
  // Drop sources that had nothing new, and thin long series evenly (keeping the last point).
  std::vector<SourceSeries> kept;
  for (SourceSeries& s : out) {
    if (s.points.empty()) continue;
    if (max_points > 0 && s.points.size() > max_points) {
      std::vector<MetricPoint> thin;
      const size_t n = s.points.size();
      for (size_t i = 0; i < max_points; ++i) {
        const size_t idx = max_points == 1 ? n - 1 : i * (n - 1) / (max_points - 1);
        thin.push_back(std::move(s.points[idx]));
      }
      s.points = std::move(thin);
    }
    kept.push_back(std::move(s));
  }
  return kept;
}

Status MetricsStore::ForEachRecord(
    const std::function<Status(uint64_t seq, const MetricRecord&)>& fn) const {
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  for (it->Seek(std::string(1, kRecordPrefix)); it->Valid() && it->key()[0] == kRecordPrefix;
       it->Next()) {
    if (it->key().size() != 9) return DataLossError("metrics store: corrupt record key");
    ORRERY_ASSIGN_OR_RETURN(MetricRecord r, MetricRecord::FromJson(it->value().ToString()));
    ORRERY_RETURN_IF_ERROR(fn(GetBigEndian64(it->key().data() + 1), r));
  }
  return FromRocks(it->status(), "scan records");
}

}  // namespace orrery
