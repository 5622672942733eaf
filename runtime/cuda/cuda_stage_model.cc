// BasicStageModel instantiated for the CUDA backend (host code: the closures call the
// launchers of runtime/cuda/kernels_cuda.h and cuBLAS).

#include "runtime/cuda/cuda_stage_model.h"

#include "runtime/model/stage_model_impl.h"

namespace dhelix::rt {

static_assert(ModelBackend<cuda::CudaBackend>);
template class BasicStageModel<cuda::CudaBackend>;

}  // namespace dhelix::rt
