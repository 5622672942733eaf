// PaddedMoeLayers instantiated for the CUDA backend (host code: the closures call
// moe_cuda.h's launchers and cuBLAS through CudaBackend).

#include "runtime/cuda/moe_layers_cuda.h"

namespace dhelix::cuda {
static_assert(rt::PaddedMoeBackend<CudaBackend>);
}  // namespace dhelix::cuda

namespace dhelix::rt {
template class PaddedMoeLayers<cuda::CudaBackend>;
}  // namespace dhelix::rt
