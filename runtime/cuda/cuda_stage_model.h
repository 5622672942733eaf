#pragma once
// The model on the CUDA backend: the same op wiring as the CPU's StageModel
// (runtime/model/stage_model_impl.h), with bf16 activations in device memory and closures
// that enqueue kernels on the stream of the CudaBackend::Exec they are given.

#include "runtime/cuda/cuda_model_backend.h"
#include "runtime/model/stage_model.h"

namespace dhelix::cuda {
using CudaStageModel = rt::BasicStageModel<CudaBackend>;
}  // namespace dhelix::cuda

// An explicit instantiation must name its template from an enclosing namespace (dhelix),
// not from dhelix::cuda: the one place this folder's code leaves its namespace.
namespace dhelix {
extern template class rt::BasicStageModel<cuda::CudaBackend>;
}  // namespace dhelix
