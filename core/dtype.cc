#include "core/dtype.h"

#include <array>
#include <string>

namespace orrery {
namespace {

struct DTypeInfo {
  DType dtype;
  size_t size;
  std::string_view name;
  std::string_view safetensors_name;
};

constexpr std::array<DTypeInfo, 8> kInfo = {{
    {DType::kF32, 4, "f32", "F32"},
    {DType::kF64, 8, "f64", "F64"},
    {DType::kBF16, 2, "bf16", "BF16"},
    {DType::kF16, 2, "f16", "F16"},
    {DType::kI32, 4, "i32", "I32"},
    {DType::kI64, 8, "i64", "I64"},
    {DType::kU8, 1, "u8", "U8"},
    {DType::kBool, 1, "bool", "BOOL"},
}};

const DTypeInfo& Info(DType dtype) { return kInfo[static_cast<size_t>(dtype)]; }

}  // namespace

size_t DTypeSize(DType dtype) { return Info(dtype).size; }
std::string_view DTypeName(DType dtype) { return Info(dtype).name; }
std::string_view SafetensorsDTypeName(DType dtype) { return Info(dtype).safetensors_name; }

bool IsFloatingPoint(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kF64 || dtype == DType::kBF16 ||
         dtype == DType::kF16;
}

StatusOr<DType> ParseDType(std::string_view name) {
  for (const DTypeInfo& info : kInfo) {
    if (info.name == name) return info.dtype;
  }
  return InvalidArgumentError("unknown dtype '" + std::string(name) +
                              "' (expected f32, f64, bf16, f16, i32, i64, u8 or bool)");
}

StatusOr<DType> ParseSafetensorsDType(std::string_view name) {
  for (const DTypeInfo& info : kInfo) {
    if (info.safetensors_name == name) return info.dtype;
  }
  return InvalidArgumentError("unsupported safetensors dtype '" + std::string(name) +
                              "' (expected F32, F64, BF16, F16, I32, I64, U8 or BOOL)");
}

}  // namespace orrery
