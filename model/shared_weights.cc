#include "model/shared_weights.h"

#include <set>
#include <sstream>

#include "core/cuda_ipc.h"

namespace orrery::model {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string ShapeText(const Shape& shape) {
  std::string out;
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? "," : "") + std::to_string(shape[i]);
  return out.empty() ? "-" : out;  // "-": a scalar
}

// Waits for the copies queued on every CUDA device among `devices`.
Status SyncDevices(const std::set<int>& cuda_devices) {
  for (int d : cuda_devices) ORRERY_RETURN_IF_ERROR(CudaDeviceSynchronize(d));
  return Status::OK();
}

}  // namespace

StatusOr<SharedWeightLayout> SharedWeightLayout::Of(const NamedTensors& named) {
  SharedWeightLayout l;
  std::set<std::string> seen;
  for (const auto& [name, t] : named) {
    if (name.empty() || name.find_first_of(" \t\n") != std::string::npos) {
      return InvalidArgumentError("shared weights: tensor name '" + name +
                                  "' is empty or has whitespace");
    }
    if (!seen.insert(name).second) {
      return InvalidArgumentError("shared weights: tensor '" + name + "' appears twice");
    }
    if (!t.defined())
      return InvalidArgumentError("shared weights: tensor '" + name + "' is undefined");
    SharedWeightEntry e{name, t.dtype(), t.shape(), l.total_bytes_,
                        static_cast<int64_t>(t.nbytes())};
    l.total_bytes_ +=
        (e.bytes + kSharedWeightAlignment - 1) / kSharedWeightAlignment * kSharedWeightAlignment;
    l.entries_.push_back(std::move(e));
  }
  if (l.entries_.empty()) return InvalidArgumentError("shared weights: no tensors");
  return l;
}

std::string SharedWeightLayout::Serialize() const {
  std::string out;
  for (const SharedWeightEntry& e : entries_) {
    out += e.name + " " + std::string(DTypeName(e.dtype)) + " " + ShapeText(e.shape) + " " +
           std::to_string(e.offset) + "\n";
  }
  return out;
}

StatusOr<SharedWeightLayout> SharedWeightLayout::Parse(const std::string& text) {
  SharedWeightLayout l;
  std::set<std::string> seen;
  std::istringstream in(text);
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    std::istringstream fields(line);
    std::string name, dtype, shape_text;
    long long offset = -1;
    if (!(fields >> name >> dtype >> shape_text >> offset) || offset < 0) {
      return InvalidArgumentError("shared weights layout, line " + std::to_string(line_no) +
                                  ": expected NAME DTYPE DIMS OFFSET, got '" + line.substr(0, 120) +
                                  "'");
    }
    if (!seen.insert(name).second) {
      return InvalidArgumentError("shared weights layout: tensor '" + name + "' appears twice");
    }
    ORRERY_ASSIGN_OR_RETURN(DType dt, ParseDType(dtype));
    Shape shape;
    if (shape_text != "-") {
      std::istringstream dims(shape_text);
      std::string d;
      while (std::getline(dims, d, ',')) {
        if (d.empty() || d.size() > 12 || d.find_first_not_of("0123456789") != std::string::npos) {
          return InvalidArgumentError("shared weights layout, line " + std::to_string(line_no) +
                                      ": bad shape '" + shape_text + "'");
        }
        shape.push_back(std::stoll(d));
      }
    }
    SharedWeightEntry e{name, dt, shape, offset,
                        ShapeNumel(shape) * static_cast<int64_t>(DTypeSize(dt))};
    if (e.offset != l.total_bytes_) {
      return InvalidArgumentError("shared weights layout, line " + std::to_string(line_no) +
                                  ": offset " + std::to_string(offset) + ", expected " +
                                  std::to_string(l.total_bytes_));
    }
    l.total_bytes_ +=
        (e.bytes + kSharedWeightAlignment - 1) / kSharedWeightAlignment * kSharedWeightAlignment;
    l.entries_.push_back(std::move(e));
  }
  if (l.entries_.empty()) return InvalidArgumentError("shared weights layout: no entries");
  return l;
}

Status SharedWeightLayout::Matches(const NamedTensors& tensors) const {
  std::map<std::string, const Tensor*> by_name;
  for (const auto& [name, t] : tensors) {
    if (!by_name.emplace(name, &t).second) {
      return InvalidArgumentError("shared weights: tensor '" + name + "' is given twice");
    }
  }
  for (const SharedWeightEntry& e : entries_) {
    auto it = by_name.find(e.name);
    if (it == by_name.end()) {
      return NotFoundError("shared weights: the model has no tensor '" + e.name + "'");
    }
    const Tensor& t = *it->second;
    if (t.dtype() != e.dtype || t.shape() != e.shape) {
      return InvalidArgumentError("shared weights: tensor '" + e.name + "' is " +
                                  std::string(DTypeName(e.dtype)) + ShapeToString(e.shape) +
                                  " in the layout, the model's is " + t.ToString());
    }
  }
  if (by_name.size() != entries_.size()) {
    std::set<std::string> in_layout;
    for (const SharedWeightEntry& e : entries_) in_layout.insert(e.name);
    for (const auto& [name, t] : by_name) {
      if (!in_layout.count(name)) {
        return NotFoundError("shared weights: tensor '" + name + "' is missing from the layout");
      }
    }
  }
  return Status::OK();
}

StatusOr<std::unique_ptr<SharedWeightPublisher>> SharedWeightPublisher::Create(
    const NamedTensors& like, Device device, Options options) {
  std::unique_ptr<SharedWeightPublisher> p(new SharedWeightPublisher());
  ORRERY_ASSIGN_OR_RETURN(p->layout_, SharedWeightLayout::Of(like));
  p->device_ = device;
  p->options_ = options;
  for (Slot& s : p->slots_) {
    ORRERY_ASSIGN_OR_RETURN(s.buffer, SharedBuffer::Create(device, p->layout_.total_bytes()));
  }
  return p;
}

void SharedWeightPublisher::DropExpiredLocked(Clock::time_point now) {
  for (auto it = leases_.begin(); it != leases_.end();) {
    it = it->second.expires <= now ? leases_.erase(it) : std::next(it);
  }
}

StatusOr<double> SharedWeightPublisher::Publish(const NamedTensors& named, int64_t version,
                                                double published_at) {
  ORRERY_RETURN_IF_ERROR(layout_.Matches(named));
  int target = 0;
  {
    std::unique_lock<std::mutex> lock(mu_);
    target = newest_ < 0 ? 0 : 1 - newest_;
    for (;;) {
      const Clock::time_point now = Clock::now();
      DropExpiredLocked(now);
      Clock::time_point until = Clock::time_point::max();
      for (const auto& [id, lease] : leases_) {
        if (lease.slot == target) until = std::min(until, lease.expires);
      }
      if (until == Clock::time_point::max()) break;
      released_.wait_until(lock, until);
    }
    slots_[target].version = -1;  // not granted while it is written (it is not the newest anyway)
  }
  std::map<std::string, const Tensor*> by_name;
  for (const auto& [name, t] : named) by_name[name] = &t;
  const Clock::time_point start = Clock::now();
  char* base = static_cast<char*>(slots_[target].buffer->data());
  std::set<int> cuda;
  if (device_.is_cuda()) cuda.insert(device_.index);
  for (const SharedWeightEntry& e : layout_.entries()) {
    const Tensor& src = *by_name.at(e.name);
    if (src.device().is_cuda()) cuda.insert(src.device().index);
    ORRERY_RETURN_IF_ERROR(DeviceCopy(base + e.offset, device_, src.raw_data(), src.device(),
                                      static_cast<size_t>(e.bytes)));
  }
  ORRERY_RETURN_IF_ERROR(SyncDevices(cuda));
  const double seconds = SecondsSince(start);
  std::lock_guard<std::mutex> lock(mu_);
  slots_[target].version = version;
  slots_[target].published_at = published_at;
  newest_ = target;
  return seconds;
}

SharedWeightGrant SharedWeightPublisher::Acquire(int64_t newer_than) {
  std::lock_guard<std::mutex> lock(mu_);
  const Clock::time_point now = Clock::now();
  DropExpiredLocked(now);
  SharedWeightGrant g;
  if (newest_ < 0 || slots_[newest_].version <= newer_than) return g;
  g.version = slots_[newest_].version;
  g.lease = next_lease_++;
  g.handle = slots_[newest_].buffer->handle();
  g.published_at = slots_[newest_].published_at;
  leases_[g.lease] = Lease{newest_, now + options_.lease_ttl};
  return g;
}

bool SharedWeightPublisher::Release(uint64_t lease) {
  std::lock_guard<std::mutex> lock(mu_);
  DropExpiredLocked(Clock::now());
  const bool live = leases_.erase(lease) == 1;
  released_.notify_all();
  return live;
}

int64_t SharedWeightPublisher::newest_version() const {
  std::lock_guard<std::mutex> lock(mu_);
  return newest_ < 0 ? -1 : slots_[newest_].version;
}

int SharedWeightPublisher::live_leases() const {
  std::lock_guard<std::mutex> lock(mu_);
  int n = 0;
  const Clock::time_point now = Clock::now();
  for (const auto& [id, lease] : leases_) n += lease.expires > now ? 1 : 0;
  return n;
}

Status SharedWeightReader::Map(const std::string& handle) { return Mapping(handle).status(); }

StatusOr<const SharedBufferMapping*> SharedWeightReader::Mapping(const std::string& handle) {
  for (const auto& m : mappings_) {
    if (m->handle() == handle) return m.get();
  }
  ORRERY_ASSIGN_OR_RETURN(std::unique_ptr<SharedBufferMapping> m,
                          SharedBufferMapping::Open(handle));
  mappings_.push_back(std::move(m));
  if (mappings_.size() > 4) mappings_.erase(mappings_.begin());  // a restarted publisher's old ones
  return mappings_.back().get();
}

StatusOr<double> SharedWeightReader::CopyInto(const std::string& handle,
                                              const SharedWeightLayout& layout,
                                              const NamedTensors& targets) {
  ORRERY_RETURN_IF_ERROR(layout.Matches(targets));
  ORRERY_ASSIGN_OR_RETURN(const SharedBufferMapping* m, Mapping(handle));
  if (static_cast<int64_t>(m->bytes()) < layout.total_bytes()) {
    return DataLossError("shared weights: the buffer holds " + std::to_string(m->bytes()) +
                         " bytes, the layout needs " + std::to_string(layout.total_bytes()));
  }
  std::map<std::string, const Tensor*> by_name;
  for (const auto& [name, t] : targets) by_name[name] = &t;
  const Clock::time_point start = Clock::now();
  const char* base = static_cast<const char*>(m->data());
  std::set<int> cuda;
  if (m->device().is_cuda()) cuda.insert(m->device().index);
  for (const SharedWeightEntry& e : layout.entries()) {
    const Tensor& dst = *by_name.at(e.name);
    if (dst.device().is_cuda()) cuda.insert(dst.device().index);
    ORRERY_RETURN_IF_ERROR(DeviceCopy(dst.raw_data(), dst.device(), base + e.offset, m->device(),
                                      static_cast<size_t>(e.bytes)));
  }
  ORRERY_RETURN_IF_ERROR(SyncDevices(cuda));
  return SecondsSince(start);
}

}  // namespace orrery::model
