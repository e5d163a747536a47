#include "actors/replay/wire.h"

#include <memory>
#include <string>

namespace orrery::replay {
namespace {

kj::ArrayPtr<const kj::byte> Bytes(const std::string& s) {
  return kj::ArrayPtr<const kj::byte>(reinterpret_cast<const kj::byte*>(s.data()), s.size());
}

}  // namespace

std::string_view CountUnitName(CountUnit unit) {
  return unit == CountUnit::kTokens ? "tokens" : "items";
}

void FillTableInfo(const TableInfo& info, schema::TableInfo::Builder out) {
  const TableOptions& o = info.options;
  out.setName(o.name);
  out.setSampler(MakeSelector(o.sampler)->Describe());
  out.setRemover(MakeSelector(o.remover)->Describe());
  out.setMaxSize(o.max_size);
  out.setMaxTimesSampled(o.max_times_sampled);
  out.setCountUnit(std::string(CountUnitName(o.count_unit)));
  out.setSamplesPerInsert(o.limiter.samples_per_insert);
  out.setMinSizeToSample(o.limiter.min_size_to_sample);
  out.setMinDiff(o.limiter.min_diff);
  out.setMaxDiff(o.limiter.max_diff);
  out.setMaxStaleness(o.max_staleness);
  out.setSize(info.size);
  out.setInserts(info.counters.inserts);
  out.setSamples(info.counters.samples);
  out.setDeletes(info.counters.deletes);
  out.setStaleEvicted(info.stale_evicted);
  out.setLearnerVersion(info.learner_version);
  out.setBytes(info.bytes);
  out.setBatchesLogged(info.batches_logged);
  out.setInsertBlockedCalls(info.insert_blocked.blocked_calls);
  out.setInsertBlockedMsP50(info.insert_blocked.p50_ms);
  out.setInsertBlockedMsP99(info.insert_blocked.p99_ms);
  out.setSampleBlockedCalls(info.sample_blocked.blocked_calls);
  out.setSampleBlockedMsP50(info.sample_blocked.p50_ms);
  out.setSampleBlockedMsP99(info.sample_blocked.p99_ms);
  out.setInsertBlockedSecondsTotal(info.insert_blocked.blocked_seconds_total);
  out.setSampleBlockedSecondsTotal(info.sample_blocked.blocked_seconds_total);
  out.setClaimed(info.claimed);
}

TableInfo ReadTableInfo(schema::TableInfo::Reader in) {
  TableInfo info;
  TableOptions& o = info.options;
  o.name = in.getName();
  // Describe() gives "prioritized(0.6)": the kind is the part before '('.
  auto kind = [](capnp::Text::Reader text, SelectorKind def) {
    const std::string s(text.cStr());
    StatusOr<SelectorKind> k = ParseSelectorKind(s.substr(0, s.find('(')));
    return k.ok() ? *k : def;
  };
  o.sampler.kind = kind(in.getSampler(), SelectorKind::kUniform);
  o.remover.kind = kind(in.getRemover(), SelectorKind::kFifo);
  o.max_size = in.getMaxSize();
  o.max_times_sampled = in.getMaxTimesSampled();
  o.count_unit =
      std::string(in.getCountUnit()) == "tokens" ? CountUnit::kTokens : CountUnit::kItems;
  o.limiter.samples_per_insert = in.getSamplesPerInsert();
  o.limiter.min_size_to_sample = in.getMinSizeToSample();
  o.limiter.min_diff = in.getMinDiff();
  o.limiter.max_diff = in.getMaxDiff();
  o.max_staleness = in.getMaxStaleness();
  info.size = in.getSize();
  info.counters.inserts = in.getInserts();
  info.counters.samples = in.getSamples();
  info.counters.deletes = in.getDeletes();
  info.stale_evicted = in.getStaleEvicted();
  info.learner_version = in.getLearnerVersion();
  info.bytes = in.getBytes();
  info.batches_logged = in.getBatchesLogged();
  info.insert_blocked.blocked_calls = in.getInsertBlockedCalls();
  info.insert_blocked.p50_ms = in.getInsertBlockedMsP50();
  info.insert_blocked.p99_ms = in.getInsertBlockedMsP99();
  info.sample_blocked.blocked_calls = in.getSampleBlockedCalls();
  info.sample_blocked.p50_ms = in.getSampleBlockedMsP50();
  info.sample_blocked.p99_ms = in.getSampleBlockedMsP99();
  info.insert_blocked.blocked_seconds_total = in.getInsertBlockedSecondsTotal();
  info.sample_blocked.blocked_seconds_total = in.getSampleBlockedSecondsTotal();
  info.claimed = in.getClaimed();
  return info;
}

void FillSampledItem(const SampledItem& item, schema::SampledItem::Builder out) {
  out.setKey(item.key);
  out.setGroupId(item.state.group_id);
  out.setPriority(item.state.priority);
  out.setProbability(item.probability);
  out.setTimesSampled(item.state.times_sampled);
  out.setTableSize(static_cast<uint64_t>(item.table_size));
  out.setTokens(item.state.tokens);
  out.setMinPolicyVersion(item.state.min_policy_version);
  out.setRedelivered(item.redelivered);
  const auto& t = *item.trajectories;
  auto list = out.initTrajectories(static_cast<unsigned>(t.size()));
  for (size_t i = 0; i < t.size(); ++i) list.set(static_cast<unsigned>(i), Bytes(t[i]));
}

SampledItem ReadSampledItem(schema::SampledItem::Reader in) {
  SampledItem item;
  item.key = in.getKey();
  item.state.group_id = in.getGroupId();
  item.state.priority = in.getPriority();
  item.probability = in.getProbability();
  item.state.times_sampled = in.getTimesSampled();
  item.table_size = static_cast<int64_t>(in.getTableSize());
  item.state.tokens = in.getTokens();
  item.state.min_policy_version = in.getMinPolicyVersion();
  item.redelivered = in.getRedelivered();
  auto t = std::make_shared<std::vector<std::string>>();
  for (auto d : in.getTrajectories()) {
    t->emplace_back(reinterpret_cast<const char*>(d.begin()), d.size());
  }
  item.trajectories = std::move(t);
  return item;
}

void FillError(const Status& status, schema::Error::Builder out) {
  out.setCode(static_cast<uint16_t>(status.code()));
  out.setMessage(status.message());
}

Status ReadError(schema::Error::Reader in) {
  const uint16_t code = in.getCode();
  const StatusCode c = code >= 1 && code <= static_cast<uint16_t>(StatusCode::kInternal)
                           ? static_cast<StatusCode>(code)
                           : StatusCode::kInternal;
  return Status(c, std::string(in.getMessage()));
}

}  // namespace orrery::replay
