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
//
// A mixture of experts has two FSDP parts a layer, as Megatron-FSDP shards them: the
// non-expert part (attention, norms, router, a shared expert: split over tp, norms and
// router whole) over the DP group, and the experts (E / ep of them on a rank, each split
// over etp) over the expert-data-parallel group of dp·cp·tp / (ep·etp) ranks
// (fsdp_expert_group). Each part has its gather and reduce-scatter:
// fwd.fsdp_expert_gather, bwd.fsdp_expert_gather, bwd.fsdp_expert_reduce_scatter. With
// edp = 1 the experts stay whole and have no ops. Mixtral-8x7B (h 4096, 32 heads of 128,
// 8 KV heads, 8 experts of FFN 14336, SwiGLU), tp 2 (etp 2), ep 8, dp 16: edp =
// 16·2 / (8·2) = 2. Attention 4096·(4096 + 2·1024) + 4096·4096 = 41,943,040 / 2 =
// 20,971,520, norms 2·4096, router 4096·8 = 32,768: 21,012,480 non-expert parameters
// (42,024,960 bytes gathered over dp 16); experts 8·3·4096·14336 = 1,409,286,144 / (8·2) =
// 88,080,384 (176,160,768 bytes gathered over edp 2).

#include <cstdint>

#include "lib/dtype.h"
#include "lib/model_spec.h"
#include "lib/parallel_spec.h"
#include "lib/placement.h"

namespace dhelix {

/// Parameters of one transformer layer's non-expert part on one rank before FSDP shards
/// them over dp: the matrices split over tp (rounded up), the norm weights and a router
/// whole. For a dense model, the layer.
int64_t fsdp_layer_parameters(const ModelSpec& model, const ParallelSpec& parallel);

/// Expert parameters of one layer on one rank before FSDP shards them over the expert
/// data-parallel group: E·(one expert's MLP) / (ep·etp), rounded up; 0 for a dense model.
int64_t fsdp_expert_parameters(const ModelSpec& model, const ParallelSpec& parallel);

/// The expert-data-parallel group's size, dp·cp·tp / (ep·etp) (Megatron-Core's).
int64_t fsdp_expert_data_parallel_size(const ParallelSpec& parallel);

/// The expert-data-parallel group of `rank` (Megatron-Core's, fsdp_expert_data_parallel_size
/// members): the ranks of its stage with the same EP index and, when the experts are split
/// over tp (etp = tp), the same TP index; with etp = 1 every TP rank holds whole experts, so
/// the group spans the TP ranks too. dim is kDp: its traffic is data-parallel.
ProcessGroup fsdp_expert_group(const Placement& placement, const ParallelSpec& parallel,
                               int64_t rank);

/// Whether the experts have FSDP ops: a mixture of experts whose edp group exceeds one.
bool fsdp_shards_experts(const ModelSpec& model, const ParallelSpec& parallel);

/// The type FSDP reduce-scatters gradients in: fp32, or bf16 with --grad-reduce-in-bf16.
DType fsdp_gradient_dtype(const ParallelSpec& parallel);

/// fwd.fsdp_gather's (and bwd.fsdp_gather's) size: the non-expert parameters in the
/// model's type, the gathered buffer.
int64_t fsdp_gather_bytes(const ModelSpec& model, const ParallelSpec& parallel);

/// bwd.fsdp_reduce_scatter's size: the non-expert gradients in fsdp_gradient_dtype, the
/// buffer before it is scattered.
int64_t fsdp_reduce_scatter_bytes(const ModelSpec& model, const ParallelSpec& parallel);

/// fwd.fsdp_expert_gather's (and bwd.fsdp_expert_gather's) size: the rank's experts in
/// the model's type.
int64_t fsdp_expert_gather_bytes(const ModelSpec& model, const ParallelSpec& parallel);

/// bwd.fsdp_expert_reduce_scatter's size: the experts' gradients in fsdp_gradient_dtype.
int64_t fsdp_expert_reduce_scatter_bytes(const ModelSpec& model, const ParallelSpec& parallel);

}  // namespace dhelix
