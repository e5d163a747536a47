#include "actors/rl/weight_fetcher.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <filesystem>
#include <vector>

#include "actors/schema/weights.capnp.h"
#include "core/crc32c.h"
#include "core/logging.h"
#include "core/unique_fd.h"
#include "learner/rl/weight_store.h"

namespace orrery::rl_actors {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

Status WriteAll(int fd, const uint8_t* p, size_t n, const std::string& what) {
  while (n > 0) {
    const ssize_t put = ::write(fd, p, n);
    if (put < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(what + ": write failed", errno);
    }
    p += put;
    n -= static_cast<size_t>(put);
  }
  return Status::OK();
}

// A call's error: the transport's errors already name the method and endpoint; the server's own
// (its handler's status) do not.
Status FromServer(const Status& s, const std::string& method, const std::string& endpoint) {
  if (s.code() == StatusCode::kDeadlineExceeded || s.code() == StatusCode::kUnavailable ||
      s.code() == StatusCode::kCancelled) {
    return s;
  }
  return s.WithContext(method + " from " + endpoint);
}

Status SyncDirectory(const std::string& dir) {
  UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0) return ErrnoError("weights: cannot open " + dir, errno);
  if (::fsync(fd.get()) != 0) return ErrnoError("weights: cannot sync " + dir, errno);
  return Status::OK();
}

}  // namespace

WeightFetcher::WeightFetcher(zmq::context_t& zmq, std::string self_name, WeightFetchOptions options)
    : client_(zmq, std::move(self_name)), options_(std::move(options)) {}

Status WeightFetcher::Connect(const std::string& endpoint) { return client_.Connect(endpoint); }

StatusOr<FetchStats> WeightFetcher::FetchNewest(int64_t newer_than, const Cancellation* cancel) {
  // A version pruned mid-fetch: the newest one has moved on; a whole-file mismatch: once more.
  bool restarted = false;
  for (int attempt = 0; attempt < 8; ++attempt) {
    Retry retry = Retry::kNo;
    StatusOr<FetchStats> got = FetchOnce(newer_than, cancel, &retry);
    if (retry == Retry::kPruned) continue;
    if (retry == Retry::kDamaged && !restarted) {
      ORRERY_LOG(WARN) << got.status().message() << ": fetching it again";
      restarted = true;
      continue;
    }
    if (got.ok()) got->restarted = restarted;
    return got;
  }
  return UnavailableError(
      "weights: every version the learner offered was pruned before it arrived");
}

StatusOr<FetchStats> WeightFetcher::FetchOnce(int64_t newer_than, const Cancellation* cancel,
                                              Retry* retry) {
  const double start = Now();
  const CallOptions call{options_.call_timeout, cancel};
  FetchStats stats;
  auto info = client_.Call<schema::WeightsInfoRequest, schema::WeightsInfoReply>(
      "weights.Info", [](schema::WeightsInfoRequest::Builder) {}, call);
  if (!info.ok()) {
    if (info.status().code() == StatusCode::kNotFound) return stats;  // nothing published yet
    return FromServer(info.status(), "weights.Info", client_.endpoint());
  }
  const int64_t version = info->get().getVersion(), size = info->get().getBytes();
  const uint32_t want_crc = info->get().getCrc32();
  const int64_t chunk = std::min(options_.chunk_bytes, info->get().getMaxChunkBytes());
  if (version <= newer_than) return stats;
  if (size < 0 || chunk < 1) {
    return DataLossError("weights.Info from " + client_.endpoint() + ": version " +
                         std::to_string(version) + " of " + std::to_string(size) +
                         " bytes in chunks of " + std::to_string(chunk));
  }
  rl::WeightStore store(options_.dir, options_.keep);
  const std::string final_path = store.PathOf(version);
  const std::string part = final_path + ".part";
  std::error_code ec;
  std::filesystem::create_directories(options_.dir, ec);
  if (ec) return IoError("weights: cannot create " + options_.dir + ": " + ec.message());
  // Parts of other versions will never be finished.
  for (const auto& entry : std::filesystem::directory_iterator(options_.dir, ec)) {
    const std::string p = entry.path().string();
    if (p != part && p.size() > 5 && p.compare(p.size() - 5, 5, ".part") == 0) {
      std::filesystem::remove(p, ec);
    }
  }
  UniqueFd fd(::open(part.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (fd.get() < 0) return ErrnoError("weights: cannot open " + part, errno);
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoError("weights: cannot stat " + part, errno);
  int64_t have = static_cast<int64_t>(st.st_size);
  if (have > size) {  // not a prefix of this version's file
    if (::ftruncate(fd.get(), 0) != 0) return ErrnoError("weights: cannot truncate " + part, errno);
    have = 0;
  }
  ORRERY_ASSIGN_OR_RETURN(uint32_t crc, Crc32cOfFile(fd.get(), have, part));
  stats.resumed_at = have;
  if (::lseek(fd.get(), have, SEEK_SET) < 0)
    return ErrnoError("weights: cannot seek " + part, errno);
  while (have < size) {
    if (cancel != nullptr && cancel->cancelled()) return CancelledError("weights: fetch cancelled");
    const int64_t want = std::min(chunk, size - have);
    bool stored = false;
    for (int attempt = 0; attempt < options_.chunk_attempts && !stored; ++attempt) {
      auto read = client_.Call<schema::WeightsReadRequest, schema::WeightsReadReply>(
          "weights.Read",
          [&](schema::WeightsReadRequest::Builder req) {
            req.setVersion(version);
            req.setOffset(have);
            req.setLength(want);
          },
          call);
      if (!read.ok()) {
        if (read.status().code() == StatusCode::kNotFound) {
          std::filesystem::remove(part, ec);
          *retry = Retry::kPruned;
          return read.status();
        }
        return FromServer(read.status(), "weights.Read", client_.endpoint());
      }
      const capnp::Data::Reader data = read->get().getData();
      if (data.size() != static_cast<size_t>(want) ||
          Crc32c(0, data.begin(), data.size()) != read->get().getCrc32()) {
        ++stats.chunk_retries;
        continue;
      }
      ORRERY_RETURN_IF_ERROR(WriteAll(fd.get(), data.begin(), data.size(), part));
      crc = Crc32c(crc, data.begin(), data.size());
      have += want;
      stats.bytes_fetched += want;
      stored = true;
    }
    if (!stored) {
      return DataLossError("weights: chunk at " + std::to_string(have) + " of version " +
                           std::to_string(version) + " from " + client_.endpoint() + " failed " +
                           std::to_string(options_.chunk_attempts) + " CRC-32C checks");
    }
  }
  if (crc != want_crc) {
    std::filesystem::remove(part, ec);
    *retry = Retry::kDamaged;
    return DataLossError("weights: version " + std::to_string(version) + " from " +
                         client_.endpoint() + ": the whole file's CRC-32C does not match");
  }
  if (::fsync(fd.get()) != 0) return ErrnoError("weights: cannot sync " + part, errno);
  if (::rename(part.c_str(), final_path.c_str()) != 0) {
    return ErrnoError("weights: cannot rename " + part, errno);
  }
  ORRERY_RETURN_IF_ERROR(SyncDirectory(options_.dir));
  rl::WeightStore(options_.dir, options_.keep).Prune();
  stats.version = version;
  stats.bytes = size;
  stats.seconds = Now() - start;
  return stats;
}

}  // namespace orrery::rl_actors
