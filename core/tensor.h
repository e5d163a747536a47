// Tensor: a shape, an element type and contiguous (row-major) storage on one device.
//
// Tensors share storage on copy (like a shared_ptr); Clone() makes a deep copy. Slice() along dim 0
// and Reshape() are views of the same storage. Everything in Orrery's kernels takes contiguous
// tensors, so there are no strides.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "core/half.h"
#include "core/status.h"

namespace orrery {

using Shape = std::vector<int64_t>;

int64_t ShapeNumel(const Shape& shape);
std::string ShapeToString(const Shape& shape);  // "[2, 3, 4]"

// Owns one device allocation. Shared by every tensor view of it.
class Storage {
 public:
  static StatusOr<std::shared_ptr<Storage>> Allocate(Device device, size_t bytes);
  // Wraps memory owned elsewhere (an mmap'ed file, say); `keep_alive` is held until the storage
  // dies.
  static std::shared_ptr<Storage> Wrap(void* data, size_t bytes, Device device,
                                       std::shared_ptr<void> keep_alive);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  Storage(void* data, size_t bytes, Device device, bool owned, std::shared_ptr<void> keep_alive)
      : data_(data),
        bytes_(bytes),
        device_(device),
        owned_(owned),
        keep_alive_(std::move(keep_alive)) {}

  void* data_;
  size_t bytes_;
  Device device_;
  bool owned_;
  std::shared_ptr<void> keep_alive_;
};

class Tensor {
 public:
  Tensor() = default;  // an undefined tensor: defined() is false

  // Allocates uninitialised memory on any device; fails when the device is missing or full.
  static StatusOr<Tensor> Allocate(Shape shape, DType dtype, Device device);
  // CPU tensors, for the common case (abort only if the host is out of memory).
  static Tensor Empty(Shape shape, DType dtype);
  static Tensor Zeros(Shape shape, DType dtype);
  // A CPU tensor holding `values` (numel must equal values.size()).
  template <typename T>
  static Tensor FromVector(Shape shape, const std::vector<T>& values);
  // A view of external memory kept alive by `keep_alive`.
  static Tensor Wrap(Shape shape, DType dtype, Device device, void* data,
                     std::shared_ptr<void> keep_alive);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  // Size of dimension i; negative i counts from the end.
  int64_t dim(int i) const;
  int64_t numel() const { return ShapeNumel(shape_); }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device() : Device::Cpu(); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * DTypeSize(dtype_); }
  std::string ToString() const;  // "f32[2, 3] on cpu"

  void* raw_data() const { return static_cast<char*>(storage_->data()) + offset_; }
  // Typed pointer; the element type must match dtype() (checked with assert).
  template <typename T>
  T* data() const;

  // Rows [begin, end) along dim 0, sharing storage.
  StatusOr<Tensor> Slice(int64_t begin, int64_t end) const;
  // The same storage under another shape with the same numel.
  StatusOr<Tensor> Reshape(Shape shape) const;
  // A deep copy on `device` (the same device included).
  StatusOr<Tensor> To(Device device) const;
  Tensor Clone() const;  // deep copy on the same device; aborts only on out-of-memory
  // Copies src's bytes into this tensor: same dtype and numel, any devices.
  Status CopyFrom(const Tensor& src);
  Status SetZero();
  // Converts element type on the CPU (floating and integer types; bf16/f16 round to nearest even).
  StatusOr<Tensor> Cast(DType dtype) const;

 private:
  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;  // bytes
  Shape shape_;
  DType dtype_ = DType::kF32;
};

template <typename T>
T* Tensor::data() const {
  assert(defined() && DTypeOf<T>::value == dtype_);
  return static_cast<T*>(raw_data());
}

template <typename T>
Tensor Tensor::FromVector(Shape shape, const std::vector<T>& values) {
  Tensor t = Empty(std::move(shape), DTypeOf<T>::value);
  assert(static_cast<size_t>(t.numel()) == values.size());
  std::copy(values.begin(), values.end(), t.data<T>());
  return t;
}

}  // namespace orrery
