// Element types of a Tensor and their sizes and names.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/status.h"

namespace orrery {

enum class DType : uint8_t { kF32, kF64, kBF16, kF16, kI32, kI64, kU8, kBool };

// Bytes per element.
size_t DTypeSize(DType dtype);
// Short lower-case name: "f32", "bf16", "bool", ...
std::string_view DTypeName(DType dtype);
// Parses a short name ("f32") back to a DType.
StatusOr<DType> ParseDType(std::string_view name);
// The safetensors header spelling: "F32", "BF16", "BOOL", ...
std::string_view SafetensorsDTypeName(DType dtype);
StatusOr<DType> ParseSafetensorsDType(std::string_view name);

bool IsFloatingPoint(DType dtype);

// Maps a C++ element type to its DType (used by Tensor::data<T>()).
template <typename T>
struct DTypeOf;

}  // namespace orrery
