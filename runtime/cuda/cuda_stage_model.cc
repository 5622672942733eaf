// BasicStageModel instantiated for the CUDA backend (host code: the closures call the
// launchers of runtime/cuda/kernels_cuda.h and cuBLAS).

#include "runtime/cuda/cuda_stage_model.h"

// Before the template: its MoeLayersOf<CudaBackend> specialisation (moe_layers_of.h).
#include "runtime/cuda/moe_layers_cuda.h"
#include "runtime/model/stage_model_impl.h"

namespace dhelix::cuda {
static_assert(rt::ModelBackend<CudaBackend>);
}  // namespace dhelix::cuda

// In dhelix, the template's enclosing namespace (cuda_stage_model.h).
namespace dhelix {
template class rt::BasicStageModel<cuda::CudaBackend>;
}  // namespace dhelix
