// BasicStageModel instantiated for the CUDA backend (host code: the closures call the
// launchers of runtime/cuda/kernels_cuda.h and cuBLAS).

#include "runtime/cuda/cuda_stage_model.h"

#include "runtime/model/stage_model_impl.h"

namespace dhelix::cuda {
static_assert(rt::ModelBackend<CudaBackend>);
}  // namespace dhelix::cuda

// In dhelix, the template's enclosing namespace (cuda_stage_model.h).
namespace dhelix {
template class rt::BasicStageModel<cuda::CudaBackend>;
}  // namespace dhelix
