#include "core/device.h"

#include <cstdlib>
#include <cstring>
#include <new>

#include "core/cuda_allocator.h"

namespace orrery {

namespace {
constexpr size_t kCpuAlignment = 256;
}

std::string Device::ToString() const {
  return is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(index);
}

StatusOr<Device> ParseDevice(const std::string& text) {
  if (text == "cpu") return Device::Cpu();
  if (text == "cuda") return Device::Cuda(0);
  if (text.rfind("cuda:", 0) == 0) {
    const std::string digits = text.substr(5);
    if (!digits.empty() && digits.size() < 4 &&
        digits.find_first_not_of("0123456789") == std::string::npos) {
      return Device::Cuda(std::stoi(digits));
    }
  }
  return InvalidArgumentError("invalid device '" + text + "' (expected cpu, cuda or cuda:N)");
}

StatusOr<void*> DeviceAlloc(Device device, size_t bytes) {
  if (device.is_cuda()) return CudaCachingAlloc(device.index, bytes);
  void* p = ::operator new(bytes == 0 ? kCpuAlignment : bytes, std::align_val_t(kCpuAlignment),
                           std::nothrow);
  if (p == nullptr) {
    return ResourceExhaustedError("out of host memory allocating " + std::to_string(bytes) +
                                  " bytes");
  }
  return p;
}

void DeviceFree(Device device, void* ptr, size_t bytes) {
  if (ptr == nullptr) return;
  if (device.is_cuda()) {
    CudaCachingFree(device.index, ptr, bytes);
    return;
  }
  ::operator delete(ptr, std::align_val_t(kCpuAlignment));
}

Status DeviceCopy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  if (bytes == 0) return Status::OK();
  if (dst_device.is_cpu() && src_device.is_cpu()) {
    std::memmove(dst, src, bytes);
    return Status::OK();
  }
  return CudaCopy(dst, dst_device.is_cuda() ? dst_device.index : -1, src,
                  src_device.is_cuda() ? src_device.index : -1, bytes);
}

Status DeviceZero(void* dst, Device device, size_t bytes) {
  if (bytes == 0) return Status::OK();
  if (device.is_cpu()) {
    std::memset(dst, 0, bytes);
    return Status::OK();
  }
  return CudaZero(device.index, dst, bytes);
}

}  // namespace orrery
