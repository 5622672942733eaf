#pragma once
// The sizes fully sharded data parallelism moves per transformer layer (Megatron-LM's
// --use-megatron-fsdp with --data-parallel-sharding-strategy optim_grads_params; PyTorch
// FSDP2; ZeRO-3, Rajbhandari et al. 2020). One FSDP unit is one transformer layer, as
// Megatron-FSDP and FSDP2 wrap decoder layers.
//
// Worked example, Llama-3-70B (h 8192, 64 heads of 128, 8 KV heads, SwiGLU FFN 28672) with
// tp 8, dp 8: a layer holds 2·8192 norm weights and 855,638,016 matrix weights (QKV 8192 x
// 10240, proj 8192 x 8192, fc1 8192 x 57344, fc2 28672 x 8192). TP splits the matrices,
// not the norms: 106,954,752 + 16,384 = 106,971,136 parameters per TP rank, of which each
// dp rank keeps 1/8 between uses. Per layer and micro-batch:
//
//    collective                 bytes (nccl-tests' size)          group
//    fwd.fsdp_gather            2 · 106,971,136 = 213,942,272     dp 8 (bf16 parameters)
//    bwd.fsdp_gather            the same (reshard_after_forward)  dp 8
//    bwd.fsdp_reduce_scatter    4 · 106,971,136 = 427,884,544     dp 8 (fp32 gradients; 2
//                                                                 bytes with
//                                                                 --grad-reduce-in-bf16)

#include <cstdint>

#include "lib/dtype.h"
#include "lib/model_spec.h"
#include "lib/parallel_spec.h"

namespace dhelix {

/// Parameters of one transformer layer on one rank before FSDP shards them: the matrices
/// split over tp (rounded up), the norm weights whole. Dense models only (validation
/// refuses optim_grads_params for mixture-of-experts models).
int64_t fsdp_layer_parameters(const ModelSpec& model, const ParallelSpec& parallel);

/// The type FSDP reduce-scatters gradients in: fp32, or bf16 with --grad-reduce-in-bf16.
DType fsdp_gradient_dtype(const ParallelSpec& parallel);

/// fwd.fsdp_gather's (and bwd.fsdp_gather's) size: the layer's parameters in the model's
/// type, the gathered buffer.
int64_t fsdp_gather_bytes(const ModelSpec& model, const ParallelSpec& parallel);

/// bwd.fsdp_reduce_scatter's size: the layer's gradients in fsdp_gradient_dtype, the
/// buffer before it is scattered.
int64_t fsdp_reduce_scatter_bytes(const ModelSpec& model, const ParallelSpec& parallel);

}  // namespace dhelix
