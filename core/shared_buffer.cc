#include "core/shared_buffer.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <random>
#include <sstream>
#include <vector>

#include "core/cuda_ipc.h"

namespace orrery {
namespace {

std::string Hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

bool Unhex(const std::string& text, std::string* out) {
  if (text.size() % 2 != 0) return false;
  out->clear();
  for (size_t i = 0; i < text.size(); i += 2) {
    int v = 0;
    for (int k = 0; k < 2; ++k) {
      const char c = text[i + k];
      const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
      if (d < 0) return false;
      v = v * 16 + d;
    }
    out->push_back(static_cast<char>(v));
  }
  return true;
}

std::vector<std::string> Split(const std::string& text) {
  std::vector<std::string> parts;
  std::stringstream in(text);
  std::string part;
  while (std::getline(in, part, '/')) parts.push_back(part);
  return parts;
}

bool ParseNumber(const std::string& text, unsigned long long* v) {
  if (text.empty() || text.size() > 20 || text.find_first_not_of("0123456789") != std::string::npos)
    return false;
  *v = std::stoull(text);
  return true;
}

std::string MemfdName(const std::string& nonce) { return "orrery-shared-" + nonce; }

Status Malformed(const std::string& handle) {
  return InvalidArgumentError("shared buffer handle '" + handle.substr(0, 200) +
                              "' is malformed (expected cpu/PID/FD/BYTES/NONCE or "
                              "cuda/DEVICE/BYTES/HEX)");
}

}  // namespace

StatusOr<std::unique_ptr<SharedBuffer>> SharedBuffer::Create(Device device, size_t bytes) {
  if (bytes == 0) return InvalidArgumentError("shared buffer: 0 bytes asked for");
  std::unique_ptr<SharedBuffer> b(new SharedBuffer());
  b->bytes_ = bytes;
  b->device_ = device;
  if (device.is_cuda()) {
    std::string raw;
    ORRERY_ASSIGN_OR_RETURN(b->data_, CudaIpcAllocate(device.index, bytes, &raw));
    b->handle_ =
        "cuda/" + std::to_string(device.index) + "/" + std::to_string(bytes) + "/" + Hex(raw);
    return b;
  }
  std::random_device rd;
  char nonce[17];
  std::snprintf(nonce, sizeof(nonce), "%08x%08x", rd(), rd());
  b->fd_ = ::memfd_create(MemfdName(nonce).c_str(), MFD_CLOEXEC);
  if (b->fd_ < 0) return ErrnoError("shared buffer: memfd_create", errno);
  if (::ftruncate(b->fd_, static_cast<off_t>(bytes)) != 0) {
    return ErrnoError("shared buffer: cannot size the memfd to " + std::to_string(bytes) + " bytes",
                      errno);
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, b->fd_, 0);
  if (p == MAP_FAILED) return ErrnoError("shared buffer: cannot map the memfd", errno);
  b->data_ = p;
  b->handle_ = "cpu/" + std::to_string(::getpid()) + "/" + std::to_string(b->fd_) + "/" +
               std::to_string(bytes) + "/" + nonce;
  return b;
}

SharedBuffer::~SharedBuffer() {
  if (device_.is_cuda()) {
    CudaIpcFree(device_.index, data_);
    return;
  }
  if (data_ != nullptr) ::munmap(data_, bytes_);
  if (fd_ >= 0) ::close(fd_);
}

StatusOr<std::unique_ptr<SharedBufferMapping>> SharedBufferMapping::Open(
    const std::string& handle) {
  const std::vector<std::string> parts = Split(handle);
  std::unique_ptr<SharedBufferMapping> m(new SharedBufferMapping());
  m->handle_ = handle;
  unsigned long long bytes = 0;
  if (parts.size() == 4 && parts[0] == "cuda") {
    unsigned long long device = 0;
    std::string raw;
    if (!ParseNumber(parts[1], &device) || device > 1024 || !ParseNumber(parts[2], &bytes) ||
        bytes == 0 || !Unhex(parts[3], &raw) || raw.size() != kCudaIpcHandleBytes) {
      return Malformed(handle);
    }
    m->device_ = Device::Cuda(static_cast<int>(device));
    m->bytes_ = bytes;
    if (static_cast<int>(device) >= CudaDeviceCount()) {
      return FailedPreconditionError("shared buffer on cuda:" + std::to_string(device) + ": " +
                                     std::to_string(CudaDeviceCount()) +
                                     " CUDA device(s) visible to this process");
    }
    ORRERY_ASSIGN_OR_RETURN(m->data_, CudaIpcOpen(static_cast<int>(device), raw));
    return m;
  }
  unsigned long long pid = 0, fd = 0;
  if (parts.size() != 5 || parts[0] != "cpu" || !ParseNumber(parts[1], &pid) ||
      !ParseNumber(parts[2], &fd) || !ParseNumber(parts[3], &bytes) || bytes == 0 ||
      parts[4].size() != 16 ||
      parts[4].find_first_not_of("0123456789abcdef") != std::string::npos) {
    return Malformed(handle);
  }
  const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
  // The descriptor must still be this buffer's memfd (not a recycled pid or descriptor number).
  char target[256] = {0};
  const ssize_t n = ::readlink(path.c_str(), target, sizeof(target) - 1);
  if (n < 0) return ErrnoError("shared buffer " + path + " (its process gone?)", errno);
  const std::string want = "/memfd:" + MemfdName(parts[4]);
  if (std::string(target, static_cast<size_t>(n)).rfind(want, 0) != 0) {
    return NotFoundError("shared buffer " + path + " is no longer the buffer of the handle (" +
                         std::string(target, static_cast<size_t>(n)) + ")");
  }
  const int raw = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (raw < 0) return ErrnoError("shared buffer: cannot open " + path, errno);
  struct stat st;
  const bool sized = ::fstat(raw, &st) == 0 && static_cast<unsigned long long>(st.st_size) >= bytes;
  void* p = sized ? ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, raw, 0) : MAP_FAILED;
  const int err = errno;
  ::close(raw);  // the mapping keeps the memory
  if (!sized) {
    return DataLossError("shared buffer " + path + " is smaller than the handle's " +
                         std::to_string(bytes) + " bytes");
  }
  if (p == MAP_FAILED) return ErrnoError("shared buffer: cannot map " + path, err);
  m->data_ = p;
  m->bytes_ = bytes;
  m->device_ = Device::Cpu();
  return m;
}

SharedBufferMapping::~SharedBufferMapping() {
  if (data_ == nullptr) return;
  if (device_.is_cuda()) {
    CudaIpcClose(device_.index, data_);
  } else {
    ::munmap(data_, bytes_);
  }
}

}  // namespace orrery
