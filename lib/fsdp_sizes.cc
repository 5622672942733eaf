#include "lib/fsdp_sizes.h"

#include "lib/int_math.h"

namespace dhelix {

int64_t fsdp_layer_parameters(const ModelSpec& model, const ParallelSpec& parallel) {
  const int64_t norms = 2 * norm_parameter_count(model);
  return ceil_div(layer_parameter_count(model) - norms, parallel.tp) + norms;
}

DType fsdp_gradient_dtype(const ParallelSpec& parallel) {
  return parallel.grad_reduce_in_bf16 ? DType::kBf16 : DType::kFp32;
}

int64_t fsdp_gather_bytes(const ModelSpec& model, const ParallelSpec& parallel) {
  return dtype_bytes(model.dtype) * fsdp_layer_parameters(model, parallel);
}

int64_t fsdp_reduce_scatter_bytes(const ModelSpec& model, const ParallelSpec& parallel) {
  return dtype_bytes(fsdp_gradient_dtype(parallel)) * fsdp_layer_parameters(model, parallel);
}

}  // namespace dhelix
