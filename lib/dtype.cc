#include "lib/dtype.h"

namespace dhelix {

int64_t dtype_bytes(DType dtype) {
  switch (dtype) {
    case DType::kBf16:
    case DType::kFp16:
      return 2;
    case DType::kFp32:
      return 4;
  }
  return 4;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kBf16:
      return "bf16";
    case DType::kFp16:
      return "fp16";
    case DType::kFp32:
      return "fp32";
  }
  return "?";
}

std::optional<DType> parse_dtype(const std::string& name) {
  if (name == "bf16" || name == "bfloat16") return DType::kBf16;
  if (name == "fp16" || name == "float16") return DType::kFp16;
  if (name == "fp32" || name == "float32") return DType::kFp32;
  return std::nullopt;
}

}  // namespace dhelix
