#pragma once
// The shared expert's gate on the GPU (runtime/model/moe_shared_expert_padded.h): the CUDA
// twin of the gate steps of runtime/model/moe_shared_expert_cpu.cc, each element or row
// the row functions of runtime/kernels/moe_shared_gate.h compute.
//
// Types, as the router's (moe_cuda.h): the gate logit [N] is bf16, the output of the h -> 1
// GEMM (CudaBackend::linear_forward with out = 1), read as fp32; the gate values g [N] fp32;
// activations and their gradients bf16; d_logit [N] bf16, because the two GEMMs that read
// it (dx += d_logit w_g, dw_g += d_logit^T x; linear_dgrad / linear_wgrad_accumulate with
// out = 1) take bf16 inputs, as the router's dz is.
//
// Every function enqueues on `stream` and returns; no host wait, no allocation.
// Deterministic: one thread per element, or a warp per row for d_logit's dot product
// (summed in kernels::lane_tree_sum's order), no atomics.

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "runtime/cuda/kernels_cuda.h"

namespace dhelix::cuda {

/// The kernels of kernels_moe_shared.cu, for loading at set-up.
std::vector<KernelEntry> moe_shared_kernels();

/// gate[n] = sigmoid(logit[n]).
void moe_shared_gate(int64_t rows, const bf16* logit, float* gate, cudaStream_t stream);
/// y[rows, h] += gate[r] * out[rows, h].
void moe_shared_gate_add(int64_t rows, int64_t hidden, const float* gate, const bf16* out, bf16* y,
                         cudaStream_t stream);
/// d_out[rows, h] = gate[r] * dy[rows, h] (the tp = 1 fc2 wgrad's own copy, and half of
/// moe_shared_gate_backward). d_out != dy.
void moe_shared_gate_scale(int64_t rows, int64_t hidden, const float* gate, const bf16* dy,
                           bf16* d_out, cudaStream_t stream);
/// d_logit[rows] = <dy_r, out_r> g (1 - g) and d_out[rows, h] = g dy.
void moe_shared_gate_backward(int64_t rows, int64_t hidden, const float* gate, const bf16* dy,
                              const bf16* out, bf16* d_logit, bf16* d_out, cudaStream_t stream);

}  // namespace dhelix::cuda
