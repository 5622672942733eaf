#pragma once
// The CUDA backend's MoE layers: runtime/model/moe_layers_padded.h on the kernels of
// moe_cuda.h (CudaBackend's moe_* functions), instantiated once in moe_layers_cuda.cc.

#include "runtime/cuda/cuda_model_backend.h"
#include "runtime/model/moe_layers_padded.h"

namespace dhelix::cuda {

using MoeLayersCuda = rt::PaddedMoeLayers<CudaBackend>;
using MoeDeviceLayerIo = rt::PaddedMoeIo<bf16>;

}  // namespace dhelix::cuda

namespace dhelix::rt {
extern template class PaddedMoeLayers<cuda::CudaBackend>;
}  // namespace dhelix::rt
