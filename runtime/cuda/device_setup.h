#pragma once
// What a rank does on its GPU before it posts its first pipeline receive, so that nothing
// in iteration 1 can hang behind a receive kernel spinning for its peer (docs/gpu.md,
// "iteration 1"). In order:
//   0. before CUDA starts, before MPI_Init (cuda_environment.h): CUDA_MODULE_LOADING=LAZY
//      (steps 1-3 load what an iteration launches; EAGER, the user's option, loads every
//      module of the process with the context), and CUDA_DEVICE_MAX_CONNECTIONS=32 (CUDA's
//      most) so that dhelix's streams and NCCL's internal ones each get a hardware queue. A
//      value the user set is kept: the kernels are loaded explicitly (step 1) whatever the
//      first says, and the second is checked
//      (device_streams.h), against the value in effect when dhelix set it too late;
//   1. every dhelix kernel loaded (DeviceApi::load_kernels) and the per-thread stack limit
//      raised to the largest kernel's need: raising it later, at a launch, reconfigures
//      device memory, which NCCL documents as a cause of hangs while its kernels run;
//   2. each GEMM shape of the model (model_gemm_shapes) run once on the compute stream's
//      cuBLAS handle: cuBLAS loads its kernel for a shape on the first call;
//   2b. the attention path decided (DeviceApi::prepare_attention, attention_path.h): cuDNN's
//      plans for the job's attention shape built (some engines compile kernels at run time,
//      CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION) and its self-check run, on the compute
//      stream: after this no attention kernel is loaded or compiled inside an iteration;
//   3. (device_comms.h) every NCCL communicator created and warmed with every operation
//      it runs, at every size class (comm_warmup.h);
//   4. a device synchronisation: the set-up is over before iteration 1 begins.
// All through DeviceApi, so the tests check the order on the recording fake.

#include <cstdint>
#include <optional>
#include <vector>

#include "lib/job_spec.h"
#include "lib/op_catalogue.h"
#include "lib/rank_shape.h"
#include "runtime/cuda/device_api.h"

namespace dhelix::cuda {

/// The cuBLAS shapes of a linear layer's three GEMMs (CublasGemm's linear_forward,
/// linear_dgrad and linear_wgrad_accumulate call exactly these).
GemmShape linear_forward_shape(int64_t rows, int64_t in, int64_t out);
GemmShape linear_dgrad_shape(int64_t rows, int64_t in, int64_t out);
GemmShape linear_wgrad_shape(int64_t rows, int64_t in, int64_t out);
/// The runtime's GEMM for a planner GEMM op of `role` whose result is C[m, n] with inner
/// dimension k (lib/dag_builder_ops.cc's shapes): the linear layer's forward (kForward,
/// kNone: the head, the router), dgrad or wgrad (fp32, accumulating). dhelix-profile times
/// this (profiler/cuda/cuda_op_plan.h).
GemmShape gemm_shape_of_role(GemmRole role, int64_t m, int64_t n, int64_t k);

/// Every distinct GEMM shape a model slice runs (ascending): the four linears of a layer
/// when it holds layers, the LM head's when it holds the head.
std::vector<GemmShape> model_gemm_shapes(const RankShape& shape, bool has_layers, bool has_head);
/// The same for a model slice of `job` that holds layers, MoE layers included
/// (runtime/model/moe_layers_padded.h): the router's [T, h] x [E, h]^T and every local
/// expert's fc1 and fc2 on its ep C padded rows, instead of the dense MLP's, and a shared
/// expert's fc1, fc2 and h -> 1 gate (moe_shared_expert_padded.h); merged, ascending. Without MoE
/// (or with cf = 0, which the device refuses) model_gemm_shapes'.
std::vector<GemmShape> job_gemm_shapes(const JobSpec& job, int64_t rank, bool has_layers,
                                       bool has_head);

/// Step 2b's request for a model slice: the causal attention of one micro-batch that its
/// layers run through attention_forward / attention_backward (where cuDNN may serve):
///   cp = 1:                micro_batch sequences of seq_shard tokens, this rank's heads
///   cp > 1, cp_comm_type a2a (Ulysses): the whole sequence (seq_shard x cp tokens) on
///                          heads / cp and kv_heads / cp (layer_ops_ulysses.h)
///   cp > 1, p2p, allgather, a2a+p2p: nullopt, the layers run ring steps (the tensor-core
///                          ring kernel of ring_attention_cuda.h, never cuDNN)
/// and nullopt for a slice without layers.
std::optional<AttentionSetup> model_attention_setup(const RankShape& shape, bool has_layers,
                                                    CpCommType cp_comm_type, bool deterministic,
                                                    AttentionChoice choice);

/// What prepare_device did.
struct DevicePreparation {
  KernelInventory kernels;
  int64_t stack_bytes = 0;                     ///< the per-thread stack limit asked for
  int64_t gemm_shapes = 0;                     ///< shapes run once
  std::optional<AttentionDecision> attention;  ///< step 2b, when the model has attention
};

/// Steps 1, 2 and 2b of the file comment on `compute` (2b only with `attention`: a slice
/// with layers). Waits for the device at the end.
DevicePreparation prepare_device(DeviceApi& api, const std::vector<GemmShape>& gemm_shapes,
                                 const std::optional<AttentionSetup>& attention,
                                 StreamHandle compute);

}  // namespace dhelix::cuda
