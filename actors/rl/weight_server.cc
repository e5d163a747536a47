#include "actors/rl/weight_server.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "actors/schema/weights.capnp.h"
#include "core/crc32c.h"
#include "core/unique_fd.h"
#include "learner/rl/weight_store.h"

namespace orrery::rl_actors {
namespace {

constexpr int kSumsKept = 4;

// Opens `version`'s file: NotFound when it is not (or no longer) published.
StatusOr<int> OpenVersion(const rl::WeightStore& store, int64_t version) {
  if (version < 0) return InvalidArgumentError("weights: version " + std::to_string(version));
  const std::string path = store.PathOf(version);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) {
      return NotFoundError("weights: version " + std::to_string(version) +
                           " is not published (pruned or not yet written)");
    }
    return ErrnoError("weights: cannot open " + path, errno);
  }
  return fd;
}

// Reads exactly n bytes at offset (the file is immutable: a short read is an error).
Status ReadAt(int fd, int64_t offset, size_t n, uint8_t* out, const std::string& what) {
  size_t done = 0;
  while (done < n) {
    const ssize_t got = ::pread(fd, out + done, n - done, static_cast<off_t>(offset + done));
    if (got < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(what + ": read failed", errno);
    }
    if (got == 0) return DataLossError(what + ": the file ended early");
    done += static_cast<size_t>(got);
  }
  return Status::OK();
}

StatusOr<int64_t> SizeOf(int fd, const std::string& what) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoError(what + ": stat failed", errno);
  return static_cast<int64_t>(st.st_size);
}

}  // namespace

WeightServer::WeightServer(std::string dir, int64_t max_chunk_bytes)
    : dir_(std::move(dir)), max_chunk_bytes_(max_chunk_bytes) {}

StatusOr<WeightServer::FileSum> WeightServer::Sum(int64_t version) {
  if (auto it = sums_.find(version); it != sums_.end()) return it->second;
  rl::WeightStore store(dir_);
  ORRERY_ASSIGN_OR_RETURN(int raw, OpenVersion(store, version));
  UniqueFd fd(raw);
  const std::string what = store.PathOf(version);
  FileSum sum;
  ORRERY_ASSIGN_OR_RETURN(sum.bytes, SizeOf(fd.get(), what));
  ORRERY_ASSIGN_OR_RETURN(sum.crc32, Crc32cOfFile(fd.get(), sum.bytes, what));
  sums_[version] = sum;
  while (static_cast<int>(sums_.size()) > kSumsKept) sums_.erase(sums_.begin());
  return sum;
}

void WeightServer::Register(Actor& actor) {
  actor.Handle<schema::WeightsInfoRequest, schema::WeightsInfoReply>(
      "weights.Info",
      [this](schema::WeightsInfoRequest::Reader, schema::WeightsInfoReply::Builder rep) {
        ORRERY_ASSIGN_OR_RETURN(const int64_t latest, rl::WeightStore(dir_).Latest());
        ORRERY_ASSIGN_OR_RETURN(const FileSum sum, Sum(latest));
        rep.setVersion(latest);
        rep.setBytes(sum.bytes);
        rep.setCrc32(sum.crc32);
        rep.setMaxChunkBytes(max_chunk_bytes_);
        return Status::OK();
      });
  actor.Handle<schema::WeightsReadRequest, schema::WeightsReadReply>(
      "weights.Read",
      [this](schema::WeightsReadRequest::Reader req, schema::WeightsReadReply::Builder rep) {
        const int64_t version = req.getVersion(), offset = req.getOffset(),
                      length = req.getLength();
        rl::WeightStore store(dir_);
        ORRERY_ASSIGN_OR_RETURN(int raw, OpenVersion(store, version));
        UniqueFd fd(raw);
        const std::string what = store.PathOf(version);
        ORRERY_ASSIGN_OR_RETURN(const int64_t size, SizeOf(fd.get(), what));
        if (length < 1 || length > max_chunk_bytes_ || offset < 0 || offset >= size) {
          return InvalidArgumentError(
              "weights.Read: range " + std::to_string(offset) + "+" + std::to_string(length) +
              " of version " + std::to_string(version) + " (" + std::to_string(size) +
              " bytes, chunks of at most " + std::to_string(max_chunk_bytes_) + ")");
        }
        const size_t n = static_cast<size_t>(std::min(length, size - offset));
        capnp::Data::Builder data = rep.initData(static_cast<unsigned>(n));
        ORRERY_RETURN_IF_ERROR(ReadAt(fd.get(), offset, n, data.begin(), what));
        rep.setCrc32(Crc32c(0, data.begin(), n));
        return Status::OK();
      });
}

}  // namespace orrery::rl_actors
