#include "actors/rl/shared_weights_service.h"

#include <chrono>

#include "actors/schema/weights.capnp.h"
#include "core/crc32c.h"
#include "core/file_io.h"

namespace orrery::rl_actors {
namespace {

constexpr std::chrono::milliseconds kCallTimeout{2000};

uint32_t LayoutCrc(const std::string& text) { return Crc32c(0, text.data(), text.size()); }

}  // namespace

std::string HostBootId() {
  StatusOr<std::string> id = ReadFileToString("/proc/sys/kernel/random/boot_id");
  if (!id.ok()) return "";
  std::string s = *id;
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

void RegisterSharedWeights(Actor& actor, model::SharedWeightPublisher* publisher) {
  const std::string host = HostBootId();
  const std::string layout = publisher != nullptr ? publisher->layout().Serialize() : "";
  const uint32_t crc = LayoutCrc(layout);
  actor.Handle<schema::WeightsSharedRequest, schema::WeightsSharedReply>(
      "weights.Shared", [publisher, host, layout, crc](schema::WeightsSharedRequest::Reader req,
                                                       schema::WeightsSharedReply::Builder rep) {
        rep.setVersion(-1);
        if (publisher == nullptr) {
          rep.setReason("this learner shares no weights (rl.rollout.weights is not \"shared\")");
          return Status::OK();
        }
        if (host.empty() || std::string(req.getHost().cStr()) != host) {
          rep.setReason("the reader runs on another host (boot id " +
                        std::string(req.getHost().cStr()) + ", the learner's " + host + ")");
          return Status::OK();
        }
        rep.setLayoutCrc(crc);
        if (req.getWithLayout()) rep.setLayout(layout);
        const model::SharedWeightGrant g = publisher->Acquire(req.getNewerThan());
        rep.setVersion(g.version);
        rep.setLease(g.lease);
        rep.setHandle(g.handle);
        rep.setPublishedAt(g.published_at);
        return Status::OK();
      });
  actor.Handle<schema::WeightsReleaseRequest, schema::WeightsReleaseReply>(
      "weights.Release", [publisher](schema::WeightsReleaseRequest::Reader req,
                                     schema::WeightsReleaseReply::Builder rep) {
        rep.setIntact(publisher != nullptr && publisher->Release(req.getLease()));
        return Status::OK();
      });
}

SharedWeightClient::SharedWeightClient(zmq::context_t& zmq, std::string self_name)
    : client_(zmq, std::move(self_name)), host_(HostBootId()) {}

Status SharedWeightClient::Connect(const std::string& endpoint) {
  return client_.Connect(endpoint);
}

StatusOr<SharedUpdate> SharedWeightClient::Fetch(int64_t newer_than,
                                                 const model::NamedTensors& targets) {
  SharedUpdate u;
  const CallOptions call{kCallTimeout, nullptr};
  for (int attempt = 0; attempt < 2; ++attempt) {
    const bool with_layout = !have_layout_;
    auto rep = client_.Call<schema::WeightsSharedRequest, schema::WeightsSharedReply>(
        "weights.Shared",
        [&](schema::WeightsSharedRequest::Builder req) {
          req.setNewerThan(newer_than);
          req.setHost(host_);
          req.setWithLayout(with_layout);
        },
        call);
    if (!rep.ok()) return rep.status();
    const auto r = rep->get();
    if (r.getVersion() < 0 && r.hasReason() && r.getReason().size() > 0) {
      return FailedPreconditionError("shared weights: " + std::string(r.getReason().cStr()));
    }
    if (with_layout) {
      ORRERY_ASSIGN_OR_RETURN(layout_, model::SharedWeightLayout::Parse(r.getLayout().cStr()));
      layout_crc_ = r.getLayoutCrc();
      have_layout_ = true;
    } else if (r.getLayoutCrc() != layout_crc_) {  // the learner restarted with another layout
      have_layout_ = false;
      if (r.getVersion() >= 0) {
        (void)client_.Call<schema::WeightsReleaseRequest, schema::WeightsReleaseReply>(
            "weights.Release",
            [&](schema::WeightsReleaseRequest::Builder req) { req.setLease(r.getLease()); }, call);
      }
      continue;
    }
    if (r.getVersion() < 0) return u;  // nothing newer
    const uint64_t lease = r.getLease();
    const std::string handle = r.getHandle().cStr();
    auto release = [&] {
      return client_.Call<schema::WeightsReleaseRequest, schema::WeightsReleaseReply>(
          "weights.Release",
          [&](schema::WeightsReleaseRequest::Builder req) { req.setLease(lease); }, call);
    };
    // Checked before a byte is written: the layout, and that this process can map the buffer.
    Status ready = layout_.Matches(targets);
    if (ready.ok()) {
      ready = reader_.Map(handle);
      if (!ready.ok()) {
        ready = FailedPreconditionError("shared weights: cannot map the learner's buffer: " +
                                        ready.message());
      }
    }
    if (!ready.ok()) {
      (void)release();
      return ready;
    }
    StatusOr<double> seconds = reader_.CopyInto(handle, layout_, targets);
    auto released = release();
    if (!seconds.ok()) {
      return DataLossError("shared weights: version " + std::to_string(r.getVersion()) +
                           " was not copied whole: " + seconds.status().message());
    }
    if (!released.ok() || !released->get().getIntact()) {
      return DataLossError(
          "shared weights: version " + std::to_string(r.getVersion()) +
          (released.ok() ? " was being rewritten when its lease ended (the copy outlived the lease)"
                         : " may have been rewritten: " + released.status().message()));
    }
    u.version = r.getVersion();
    u.transfer_seconds = *seconds;
    u.published_at = r.getPublishedAt();
    u.bytes = layout_.total_bytes();
    return u;
  }
  return UnavailableError("shared weights: the learner's layout changed twice in a row");
}

}  // namespace orrery::rl_actors
