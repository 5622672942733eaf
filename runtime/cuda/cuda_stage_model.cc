// BasicStageModel instantiated for the CUDA backend (host code: the closures call the
// launchers of runtime/cuda/kernels_cuda.h and cuBLAS).

#include "runtime/cuda/cuda_stage_model.h"

#include "runtime/model/stage_model_impl.h"

namespace dhelix::rt {

static_assert(ModelBackend<CudaBackend>);
template class BasicStageModel<CudaBackend>;

}  // namespace dhelix::rt
