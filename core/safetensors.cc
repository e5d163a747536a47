#include "core/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

namespace orrery {
namespace {

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // the format's own limit is 100 MB

Status Corrupt(const std::string& path, const std::string& what) {
  return DataLossError(path + ": invalid safetensors file: " + what);
}

Status WriteAll(int fd, const void* data, size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("write " + path, errno);
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return Status::OK();
}

Status FsyncDir(const std::string& path) {
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return ErrnoError("open directory " + dir, errno);
  ::fsync(fd);
  ::close(fd);
  return Status::OK();
}

}  // namespace

StatusOr<SafetensorsFile> SafetensorsFile::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return ErrnoError("open " + path, errno);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return ErrnoError("stat " + path, err);
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    return Corrupt(
        path, "file is " + std::to_string(size) + " bytes, shorter than the 8-byte header length");
  }
  void* base = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  int err = errno;
  ::close(fd);
  if (base == MAP_FAILED) return ErrnoError("mmap " + path, err);
  SafetensorsFile file;
  file.path_ = path;
  file.mapping_ = std::shared_ptr<void>(base, [size](void* p) { ::munmap(p, size); });

  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i)
    header_len = (header_len << 8) | static_cast<const uint8_t*>(base)[i];
  if (header_len > kMaxHeaderBytes || header_len > size - 8) {
    return Corrupt(path, "header length " + std::to_string(header_len) + " exceeds the file (" +
                             std::to_string(size) + " bytes)");
  }
  const char* header = static_cast<const char*>(base) + 8;
  nlohmann::json j = nlohmann::json::parse(header, header + header_len, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Corrupt(path, "header is not a JSON object");
  const uint64_t buffer_size = size - 8 - header_len;
  file.data_ = header + header_len;

  struct Range {
    size_t begin, end;
    std::string name;
  };
  std::vector<Range> ranges;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) return Corrupt(path, "__metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string())
          return Corrupt(path, "__metadata__ value '" + m.key() + "' is not a string");
        file.metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") ||
        !v.contains("data_offsets") || !v["dtype"].is_string() || !v["shape"].is_array() ||
        !v["data_offsets"].is_array() || v["data_offsets"].size() != 2) {
      return Corrupt(path, "tensor '" + name + "' lacks dtype, shape or data_offsets");
    }
    StatusOr<DType> dtype = ParseSafetensorsDType(v["dtype"].get<std::string>());
    if (!dtype.ok()) return Corrupt(path, "tensor '" + name + "': " + dtype.status().message());
    Entry e;
    e.dtype = *dtype;
    uint64_t numel = 1;
    for (const auto& d : v["shape"]) {
      if (!d.is_number_unsigned())
        return Corrupt(path, "tensor '" + name + "' has a non-integer or negative dimension");
      uint64_t dim = d.get<uint64_t>();
      if (dim != 0 && numel > (1ull << 50) / dim)
        return Corrupt(path, "tensor '" + name + "' shape is too large");
      numel *= dim;
      e.shape.push_back(static_cast<int64_t>(dim));
    }
    const auto& off = v["data_offsets"];
    if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
      return Corrupt(path, "tensor '" + name + "' data_offsets are not non-negative integers");
    }
    e.begin = off[0].get<uint64_t>();
    e.end = off[1].get<uint64_t>();
    if (e.end < e.begin || e.end > buffer_size) {
      return Corrupt(path, "tensor '" + name + "' data_offsets [" + std::to_string(e.begin) + ", " +
                               std::to_string(e.end) + ") lie outside the " +
                               std::to_string(buffer_size) + "-byte data buffer");
    }
    if (e.end - e.begin != numel * DTypeSize(e.dtype)) {
      return Corrupt(path, "tensor '" + name + "' holds " + std::to_string(e.end - e.begin) +
                               " bytes but its shape and dtype need " +
                               std::to_string(numel * DTypeSize(e.dtype)));
    }
    ranges.push_back({e.begin, e.end, name});
    file.entries_[name] = std::move(e);
  }
  std::sort(ranges.begin(), ranges.end(),
            [](const Range& a, const Range& b) { return a.begin < b.begin; });
  size_t expect = 0;
  for (const Range& r : ranges) {
    if (r.begin != expect) {
      return Corrupt(
          path, "tensor '" + r.name + "' starts at byte " + std::to_string(r.begin) +
                    (r.begin < expect ? ", overlapping the previous tensor" : ", leaving a hole"));
    }
    expect = r.end;
    file.names_.push_back(r.name);
  }
  if (expect != buffer_size) {
    return Corrupt(path, "data buffer has " + std::to_string(buffer_size - expect) +
                             " trailing bytes that no tensor claims");
  }
  return file;
}

StatusOr<Tensor> SafetensorsFile::Get(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) return NotFoundError(path_ + ": no tensor named '" + name + "'");
  const Entry& e = it->second;
  return Tensor::Wrap(e.shape, e.dtype, Device::Cpu(), const_cast<char*>(data_) + e.begin,
                      mapping_);
}

Status WriteFileAtomic(const std::string& path, const std::string& contents) {
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return ErrnoError("create " + tmp, errno);
  Status s = WriteAll(fd, contents.data(), contents.size(), tmp);
  if (s.ok() && ::fsync(fd) != 0) s = ErrnoError("fsync " + tmp, errno);
  ::close(fd);
  if (s.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) s = ErrnoError("rename " + tmp, errno);
  if (!s.ok()) {
    ::unlink(tmp.c_str());
    return s;
  }
  return FsyncDir(path);
}

Status WriteSafetensors(const std::string& path,
                        const std::vector<std::pair<std::string, Tensor>>& tensors,
                        const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    header["__metadata__"] = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) header["__metadata__"][k] = v;
  }
  std::vector<Tensor> cpu;
  size_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (name == "__metadata__")
      return InvalidArgumentError("tensor name '__metadata__' is reserved");
    if (!t.defined()) return InvalidArgumentError("tensor '" + name + "' is undefined");
    if (header.contains(name))
      return InvalidArgumentError("tensor name '" + name + "' appears twice");
    Tensor c = t;
    if (!t.device().is_cpu()) {
      ORRERY_ASSIGN_OR_RETURN(c, t.To(Device::Cpu()));
    }
    header[name] = {{"dtype", SafetensorsDTypeName(t.dtype())},
                    {"shape", t.shape()},
                    {"data_offsets", {offset, offset + t.nbytes()}}};
    offset += t.nbytes();
    cpu.push_back(c);
  }
  std::string json = header.dump();
  while ((json.size() + 8) % 8 != 0) json += ' ';  // align the data buffer to 8 bytes
  std::string contents;
  contents.reserve(8 + json.size() + offset);
  uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) contents.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  contents += json;
  for (const Tensor& t : cpu) contents.append(static_cast<const char*>(t.raw_data()), t.nbytes());
  return WriteFileAtomic(path, contents);
}

}  // namespace orrery
