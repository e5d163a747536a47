#include "core/tensor.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace orrery {

int64_t ShapeNumel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ShapeToString(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

StatusOr<std::shared_ptr<Storage>> Storage::Allocate(Device device, size_t bytes) {
  ORRERY_ASSIGN_OR_RETURN(void* p, DeviceAlloc(device, bytes));
  return std::shared_ptr<Storage>(new Storage(p, bytes, device, /*owned=*/true, nullptr));
}

std::shared_ptr<Storage> Storage::Wrap(void* data, size_t bytes, Device device,
                                       std::shared_ptr<void> keep_alive) {
  return std::shared_ptr<Storage>(
      new Storage(data, bytes, device, /*owned=*/false, std::move(keep_alive)));
}

Storage::~Storage() {
  if (owned_) DeviceFree(device_, data_, bytes_);
}

StatusOr<Tensor> Tensor::Allocate(Shape shape, DType dtype, Device device) {
  for (int64_t d : shape) {
    if (d < 0) return InvalidArgumentError("negative dimension in shape " + ShapeToString(shape));
  }
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  ORRERY_ASSIGN_OR_RETURN(t.storage_, Storage::Allocate(device, t.nbytes()));
  return t;
}

Tensor Tensor::Empty(Shape shape, DType dtype) {
  StatusOr<Tensor> t = Allocate(std::move(shape), dtype, Device::Cpu());
  if (!t.ok()) {
    std::fprintf(stderr, "orrery: %s\n", t.status().ToString().c_str());
    std::abort();
  }
  return std::move(t).value();
}

Tensor Tensor::Zeros(Shape shape, DType dtype) {
  Tensor t = Empty(std::move(shape), dtype);
  std::memset(t.raw_data(), 0, t.nbytes());
  return t;
}

Tensor Tensor::Wrap(Shape shape, DType dtype, Device device, void* data,
                    std::shared_ptr<void> keep_alive) {
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.storage_ = Storage::Wrap(data, t.nbytes(), device, std::move(keep_alive));
  return t;
}

int64_t Tensor::dim(int i) const {
  if (i < 0) i += ndim();
  assert(i >= 0 && i < ndim());
  return shape_[static_cast<size_t>(i)];
}

std::string Tensor::ToString() const {
  if (!defined()) return "undefined";
  return std::string(DTypeName(dtype_)) + ShapeToString(shape_) + " on " + device().ToString();
}

StatusOr<Tensor> Tensor::Slice(int64_t begin, int64_t end) const {
  if (ndim() == 0) return InvalidArgumentError("cannot slice a scalar tensor");
  if (begin < 0 || end < begin || end > shape_[0]) {
    return OutOfRangeError("slice [" + std::to_string(begin) + ", " + std::to_string(end) +
                           ") out of range for " + ToString());
  }
  Tensor t = *this;
  const int64_t row = shape_[0] == 0 ? 0 : numel() / shape_[0];
  t.offset_ = offset_ + static_cast<size_t>(begin * row) * DTypeSize(dtype_);
  t.shape_[0] = end - begin;
  return t;
}

StatusOr<Tensor> Tensor::Reshape(Shape shape) const {
  if (ShapeNumel(shape) != numel()) {
    return InvalidArgumentError("cannot reshape " + ToString() + " to " + ShapeToString(shape));
  }
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

StatusOr<Tensor> Tensor::To(Device device) const {
  ORRERY_ASSIGN_OR_RETURN(Tensor t, Allocate(shape_, dtype_, device));
  ORRERY_RETURN_IF_ERROR(t.CopyFrom(*this));
  return t;
}

Tensor Tensor::Clone() const {
  StatusOr<Tensor> t = To(device());
  if (!t.ok()) {
    std::fprintf(stderr, "orrery: %s\n", t.status().ToString().c_str());
    std::abort();
  }
  return std::move(t).value();
}

Status Tensor::CopyFrom(const Tensor& src) {
  if (src.dtype_ != dtype_ || src.numel() != numel()) {
    return InvalidArgumentError("cannot copy " + src.ToString() + " into " + ToString());
  }
  return DeviceCopy(raw_data(), device(), src.raw_data(), src.device(), nbytes());
}

Status Tensor::SetZero() { return DeviceZero(raw_data(), device(), nbytes()); }

namespace {

double LoadAsDouble(const void* p, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kF32:
      return static_cast<const float*>(p)[i];
    case DType::kF64:
      return static_cast<const double*>(p)[i];
    case DType::kBF16:
      return BFloat16ToFloat(static_cast<const BFloat16*>(p)[i]);
    case DType::kF16:
      return Float16ToFloat(static_cast<const Float16*>(p)[i]);
    case DType::kI32:
      return static_cast<const int32_t*>(p)[i];
    case DType::kI64:
      return static_cast<double>(static_cast<const int64_t*>(p)[i]);
    case DType::kU8:
      return static_cast<const uint8_t*>(p)[i];
    case DType::kBool:
      return static_cast<const bool*>(p)[i] ? 1.0 : 0.0;
  }
  return 0;
}

void StoreFromDouble(void* p, DType dtype, int64_t i, double v) {
  switch (dtype) {
    case DType::kF32:
      static_cast<float*>(p)[i] = static_cast<float>(v);
      break;
    case DType::kF64:
      static_cast<double*>(p)[i] = v;
      break;
    case DType::kBF16:
      static_cast<BFloat16*>(p)[i] = FloatToBFloat16(static_cast<float>(v));
      break;
    case DType::kF16:
      static_cast<Float16*>(p)[i] = FloatToFloat16(static_cast<float>(v));
      break;
    case DType::kI32:
      static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v);
      break;
    case DType::kI64:
      static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v);
      break;
    case DType::kU8:
      static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(v);
      break;
    case DType::kBool:
      static_cast<bool*>(p)[i] = v != 0.0;
      break;
  }
}

}  // namespace

StatusOr<Tensor> Tensor::Cast(DType dtype) const {
  if (!device().is_cpu()) return FailedPreconditionError("Cast runs on CPU tensors only");
  Tensor out = Empty(shape_, dtype);
  const int64_t n = numel();
  if (dtype == dtype_) {
    std::memcpy(out.raw_data(), raw_data(), nbytes());
    return out;
  }
  if ((dtype_ == DType::kI64 && dtype == DType::kI32) ||
      (dtype_ == DType::kI32 && dtype == DType::kI64) ||
      (dtype_ == DType::kI64 && dtype == DType::kI64)) {
    for (int64_t i = 0; i < n; ++i) {
      int64_t v = dtype_ == DType::kI64 ? data<int64_t>()[i] : data<int32_t>()[i];
      if (dtype == DType::kI32)
        out.data<int32_t>()[i] = static_cast<int32_t>(v);
      else
        out.data<int64_t>()[i] = v;
    }
    return out;
  }
  for (int64_t i = 0; i < n; ++i)
    StoreFromDouble(out.raw_data(), dtype, i, LoadAsDouble(raw_data(), dtype_, i));
  return out;
}

}  // namespace orrery
