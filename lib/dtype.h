#pragma once
// Element types of weights and activations.

#include <cstdint>
#include <optional>
#include <string>

namespace dhelix {

enum class DType { kBf16, kFp16, kFp32 };

/// Bytes of one element.
int64_t dtype_bytes(DType dtype);
/// "bf16", "fp16", "fp32": the names used in JSON and messages.
const char* dtype_name(DType dtype);
/// Inverse of dtype_name; also accepts HuggingFace's "bfloat16", "float16", "float32".
std::optional<DType> parse_dtype(const std::string& name);

}  // namespace dhelix
