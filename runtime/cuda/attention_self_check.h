#pragma once
// Steps 1-3 of attention_path.h on the rank's GPU: cuDNN's plans for the job's attention
// shape built, then the self-check (forward and backward of both paths on the same fixed
// inputs, compared output by output; under --verify a second cuDNN backward compared bit
// for bit), then the decision; when cuDNN is chosen, the job shape's plans run once more on
// zeroed buffers so that every kernel they launch is loaded now. Runs at set-up, on the compute
// stream, before any receive is posted (device_setup.h, step 2b), and waits for the device: it is
// set-up, not an iteration. Every buffer is zeroed, filled and read back on that stream
// (stream_scratch.h): the compute stream is non-blocking, so the legacy stream's
// cudaMemset/cudaMemcpy would not be ordered before its kernels.

#include <cuda_runtime.h>

#include "runtime/cuda/attention_path.h"
#include "runtime/cuda/cudnn_sdpa.h"
#include "runtime/cuda/device_api.h"

namespace dhelix::cuda {

/// What steps 1-3 found, and the decision. A cuDNN failure during the self-check's runs
/// (an Error from cudnn_sdpa.h) counts as a refusal. Throws only for DHELIX_ATTENTION=cudnn
/// refusals (attention_path.h) and for CUDA errors outside cuDNN.
AttentionDecision prepare_attention_path(DeviceApi& api, CudnnSdpa& sdpa,
                                         const AttentionSetup& setup, StreamHandle stream);

}  // namespace dhelix::cuda
