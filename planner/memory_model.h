#pragma once
// Memory of one GPU of each pipeline stage: weights, gradients, optimizer states and the
// peak of live activations, checked against the GPU's memory.
//
// Model states (Megatron-LM defaults for bf16 training, "Efficient Large-Scale Language
// Model Training on GPU Clusters", Narayanan et al. 2021, and Megatron-Core's distributed
// optimizer guide, docs/user-guide/features/dist_optimizer.md: "6 + 12/d" bytes per
// parameter for bf16 parameters and fp32 gradients): bf16 weights (2 bytes per parameter),
// fp32 main gradients (4 bytes; Megatron accumulates and reduces gradients in fp32 for bf16
// unless --grad-reduce-in-bf16: 2 bytes), and Adam's fp32 master weights, first and second
// moments (12 bytes; 16 with bf16 gradients, whose fp32 shard copy the optimizer steps on),
// divided over the dp·cp ranks that hold the same weights with the distributed optimizer
// (Megatron-Core shards over the data-parallel group with context parallelism,
// get_data_parallel_group(with_context_parallel=True)). The gradient buffer is not sharded:
// the reduce-scatter writes into the full buffer. Dense weights are split over tp; experts
// over ep and the expert tensor-parallel group.
//
// Activations per layer and micro-batch follow Korthikanti et al. 2022 ("Reducing
// Activation Recomputation in Large Transformer Models"), derived from the tensors each op
// saves for its backward; docs/pipeline.md has the derivation. Per token, with t = tp:
//     norm and GEMM inputs that SP splits (else replicated):  2 bytes x 4h  (+2h of dropout masks)
//     attention (flash: Q, K, V, output):                     2 bytes x (2q + 2kv) / t
//       with a2a / a2a+p2p CP one more q: the head-split output (TE saves it) besides the
//       projection's input, the output after the all-to-all back: 2 bytes x (3q + 2kv) / t
//     MLP (SwiGLU saves gate and up, 2f; GELU its input, f;
//          plus the fc2 input, f):                            2 bytes x (3f or 2f) / t
// For GPT (q = kv = h, f = 4h, GELU, dropout) and SP this is Korthikanti's 34·s·b·h / t.
// The peak over time, both strands together, comes from the pipeline simulator.
//
// All-gather CP (cp_comm_type allgather; TransformerEngine's AttnFuncWithCPAndKVAllGather)
// keeps only the local K, V (counted above) but holds the whole sequence's K and V of the
// layer while its attention runs, G = dt·b·S·2·kv/t bytes (S the whole sequence); its
// backward gathers them again and accumulates dK, dV of the whole sequence (zeros of the
// gathered shape) before their reduce-scatter: 2G in flight. The simulator adds G to what a
// forward holds on top of the kept bytes and 2G to what a backward holds
// (cp_forward_transient_bytes, cp_backward_transient_bytes); an SI block, whose two strands
// may run their attentions at once, holds both, 3G.
// Llama-3-70B (8 KV heads), tp 8, cp 4, 32k, b = 1, bf16: G = 2·32,768·2·128·2 bytes =
// 33,554,432 / 2 = 16,777,216 bytes (16 MiB; the all-gather's size in the cost model),
// 32 MiB during the backward.
//
// Activation recompute (Megatron's --recompute-granularity, Korthikanti et al. 2022
// section 4 and Table 2; docs/pipeline.md):
//   full, uniform, n layers per group: a chunk of k layers keeps only the input of each of
//     its ceil(k/n) groups, 2·s·b·h bytes (split over t with SP, as Megatron checkpoints the
//     sequence-parallel hidden state): Korthikanti's "2sbhL". While one group's backward
//     runs, its recomputed forward holds min(n, k) layers of full activations, less the
//     group's input, which is the checkpoint already kept (not a second copy).
//   full, block, n: the first r = min(n, k) layers of each chunk keep their input, the rest
//     everything; one recomputed layer's activations are live during its backward.
//   selective (core attention): Korthikanti's selective case drops the attention-score
//     term 5·a·s/h, leaving 34·s·b·h/t for GPT with SP. The figure above already counts
//     flash attention, which keeps no scores, so selective keeps the same bytes here; it
//     still pays the attention forward again in the backward (lib/dag_builder_recompute.cc).

#include <cstdint>
#include <string>
#include <vector>

#include "lib/cluster_spec.h"
#include "lib/job_spec.h"
#include "lib/model_spec.h"
#include "lib/parallel_spec.h"
#include "planner/pipeline_schedule.h"

namespace dhelix {

/// Bytes per parameter of the gradients (fp32 main gradients) and of the optimizer states
/// (Adam's fp32 master weights, first and second moments) before any sharding, under
/// Megatron's defaults for bf16 training.
inline constexpr int64_t kGradientBytesPerParameter = 4;
inline constexpr int64_t kOptimizerBytesPerParameter = 12;

/// The main gradient buffer's bytes per parameter: 4 (fp32, Megatron's default), or 2 with
/// --grad-reduce-in-bf16 (Megatron-Core DDP's buffer takes the parameters' dtype).
int64_t gradient_bytes_per_parameter(const ParallelSpec& parallel);
/// The optimizer's bytes per parameter before sharding: 12 (fp32 master weight, Adam's m and
/// v), plus 4 with --grad-reduce-in-bf16: the optimizer steps on an fp32 copy of its gradient
/// shard (Megatron's distributed-optimizer table: 16-bit gradients cost 4 + 16/d bytes per
/// parameter, fp32 ones 6 + 12/d).
int64_t optimizer_bytes_per_parameter(const ParallelSpec& parallel);

struct MemoryOptions {
  /// Megatron's distributed optimizer: optimizer states split over the DP group.
  bool distributed_optimizer = false;
  /// Dropout after the attention projection and the MLP (1-byte masks); off for modern LLMs.
  bool dropout = false;
  /// Share of the GPU's memory kept free for the caching allocator's fragmentation.
  double reserve_fraction = 0.05;
  /// CUDA context, cuBLAS/cuDNN workspaces and NCCL buffers: 2 GiB (docs/pipeline.md).
  int64_t fixed_reserve_bytes = int64_t{2} << 30;
};

/// FSDP without reshard_after_forward: the gathered parameters a layer keeps from its
/// forward to its backward, one copy per micro-batch in flight, dt·P (0 with reshard or
/// without optim_grads_params). Full recompute drops activations, not these: a recomputed
/// layer keeps its input and them, and its replay reads them (lib/dag_builder_recompute.cc).
int64_t fsdp_kept_parameter_bytes(const ModelSpec& model, const ParallelSpec& parallel);

/// Bytes one transformer layer keeps for its backward, for one micro-batch, on one GPU
/// (fsdp_kept_parameter_bytes included).
int64_t layer_activation_bytes(const ModelSpec& model, const ParallelSpec& parallel,
                               const MemoryOptions& options = {});

/// Bytes of one layer's input hidden state for one micro-batch on one GPU (what full
/// recompute keeps per checkpoint): tokens·h·dt, split over tp with SP.
int64_t layer_input_bytes(const ModelSpec& model, const ParallelSpec& parallel);

/// Bytes a chunk of `layers` layers keeps from its forward to its backward for one
/// micro-batch, under parallel.recompute (the file comment's rules).
int64_t chunk_activation_bytes(const ModelSpec& model, const ParallelSpec& parallel, int64_t layers,
                               const MemoryOptions& options = {});

/// Bytes live on top of the kept ones while the backward of such a chunk runs: the
/// recomputed activations of one recompute group but its input, which is kept (0 without
/// full recompute).
int64_t recompute_transient_bytes(const ModelSpec& model, const ParallelSpec& parallel,
                                  int64_t layers, const MemoryOptions& options = {});

/// Under cp_comm_type allgather with cp > 1, the whole sequence's K and V of one layer and
/// micro-batch on one GPU (the all-gather's output): micro_batch·seq_length·2·kv/tp·dt; 0
/// under the other CP types and without CP.
int64_t cp_gathered_kv_bytes(const ModelSpec& model, const ParallelSpec& parallel);

/// Bytes a layer's forward holds in flight for its CP communication on top of the kept ones:
/// under allgather the gathered K and V, cp_gathered_kv_bytes; 0 otherwise.
int64_t cp_forward_transient_bytes(const ModelSpec& model, const ParallelSpec& parallel);

/// Bytes a layer's backward holds in flight for its CP communication on top of the kept
/// ones: under allgather the re-gathered K, V and the whole sequence's dK, dV before their
/// reduce-scatter, 2 x cp_gathered_kv_bytes (the file comment); 0 otherwise.
int64_t cp_backward_transient_bytes(const ModelSpec& model, const ParallelSpec& parallel);

/// Layers of `stage` in the folded (W) or unfolded (1F1B) layout, uneven stages included.
int64_t stage_layer_count(const ModelSpec& model, const ParallelSpec& parallel, PipelineShape shape,
                          int64_t stage);

/// Bytes the head and loss hold while they run for one micro-batch on one GPU: the logits
/// of the rank's tokens over its vocabulary shard, in the model's type and as fp32 for the
/// softmax.
int64_t head_loss_transient_bytes(const ModelSpec& model, const ParallelSpec& parallel);

/// Parameters one GPU of a stage holds, split by how they shard.
struct StageParameters {
  int64_t dense = 0;   ///< split over tp or replicated; optimizer shards over dp·cp
  int64_t expert = 0;  ///< E/ep experts; optimizer shards over dp·cp·tp/(ep·etp)
  /// The part of `dense` FSDP shards over dp (the layers' parameters under
  /// optim_grads_params: lib/fsdp_sizes.h); 0 otherwise. The stage extras stay whole.
  int64_t fsdp_layers = 0;
  /// The part of `expert` FSDP shards over the expert-data-parallel group (every layer's
  /// experts when fsdp_shards_experts); 0 otherwise.
  int64_t fsdp_experts = 0;
  int64_t total() const { return dense + expert; }
};

/// Parameters per GPU of `stage` for the folded (W) or unfolded (1F1B) layout: its layers
/// (L/pp, or stage_layer_count with uneven stages) plus the embedding, final norm and head where
/// the layout puts them (a tied embedding is kept twice when the head is on another stage, as
/// Megatron does).
StageParameters stage_parameters(const ModelSpec& model, const ParallelSpec& parallel,
                                 PipelineShape shape, int64_t stage);

/// Fully sharded data parallelism's terms on one GPU of a stage (docs/cost-model.md "Fully
/// sharded data parallelism: memory"), for a stage of parameters `params` under
/// optim_grads_params; all 0 otherwise. With P the layer's parameters on the rank
/// (fsdp_layer_parameters), L·P = params.fsdp_layers, d = dp, dt the model's bytes and g the
/// gradient's (gradient_bytes_per_parameter):
///   weights     the shards, L·P/d (rounded up), instead of L·P, plus the gathered buffers
///               in flight: the layer running and the one prefetched, per strand (two
///               strands on the folded shapes W and V, one on 1F1B's), 2·strands·P, in dt
///   gradients   the shards, L·P/d, instead of L·P, plus the unsharded gradients of the
///               layer whose backward runs and of the one being reduce-scattered, 2·P, in g
/// The optimizer states are the distributed optimizer's (sharded over dp·cp already). With
/// reshard_after_forward false each micro-batch also holds every layer's gathered
/// parameters from its forward to its backward: layer_activation_bytes counts them (P·dt a
/// layer), so the pipeline simulator's peak holds them for every micro-batch in flight.
/// Full recompute adds no buffer: its replay runs after the backward's gather (or on the
/// kept parameters) and reads those. A mixture of experts' experts are a second part with
/// the same four terms: L·Pe = params.fsdp_experts sharded over e = edp (the expert
/// data-parallel group, fsdp_expert_data_parallel_size) and their gathered and unsharded
/// gradient buffers, Pe = fsdp_expert_parameters; kept parameters without reshard are
/// P + Pe a layer.
struct FsdpMemory {
  int64_t weight_saving_bytes = 0;  ///< dt·(L·P − ceil(L·P/d)) [+ dt·(L·Pe − ceil(L·Pe/e))]
  int64_t gathered_buffer_bytes = 0;  ///< dt·2·strands·P [+ dt·2·strands·Pe]
  int64_t gradient_saving_bytes = 0;  ///< g·(L·P − ceil(L·P/d)) [+ g·(L·Pe − ceil(L·Pe/e))]
  int64_t gradient_buffer_bytes = 0;  ///< g·2·P [+ g·2·Pe]
};
FsdpMemory fsdp_memory(const ModelSpec& model, const ParallelSpec& parallel, PipelineShape shape,
                       const StageParameters& params);

/// One GPU's memory on one stage, bytes.
struct StageMemory {
  int64_t stage = 0;
  StageParameters parameters;
  int64_t weight_bytes = 0;
  int64_t gradient_bytes = 0;
  int64_t optimizer_bytes = 0;
  int64_t activation_bytes = 0;  ///< the peak of live activations
  int64_t total_bytes() const {
    return weight_bytes + gradient_bytes + optimizer_bytes + activation_bytes;
  }
};

/// Every stage's memory; `peak_activation_bytes` has one entry per stage (the simulator's).
std::vector<StageMemory> stage_memory(const ModelSpec& model, const ParallelSpec& parallel,
                                      PipelineShape shape, const MemoryOptions& options,
                                      const std::vector<int64_t>& peak_activation_bytes);

/// What a GPU offers a plan: capacity minus the reserves.
struct MemoryBudget {
  std::string gpu_name;
  int64_t capacity_bytes = 0;
  int64_t reserve_bytes = 0;  ///< reserve_fraction·capacity + fixed_reserve_bytes
  int64_t usable_bytes() const { return capacity_bytes - reserve_bytes; }
};

/// The arithmetic alone: usable_bytes() is negative when the reserve exceeds the capacity.
MemoryBudget memory_budget(const GpuSpec& gpu, const MemoryOptions& options = {});
/// The budget of the job's GPUs. Error(kInfeasible) when the reserve takes all of the GPU's
/// memory, naming the cluster field that sets it (its file and JSON pointer:
/// "h100-small.json: /gpu/memory_bytes", or "/cluster/gpu/memory_bytes" in the job file for
/// an inline cluster), its value and the reserve: no plan could fit, and a budget of
/// "-2.00 GiB usable" would say so obscurely.
MemoryBudget memory_budget(const JobSpec& job, const MemoryOptions& options = {});

/// Throws Error(kInfeasible) when a stage needs more than the usable memory. The message
/// names `scheme` and, for every stage that does not fit, each term in GiB:
/// "dhelix: stage 0 needs 81.20 GiB but 73.00 GiB are usable on H100-SXM (80.00 GiB minus
/// 7.00 GiB reserve): weights 10.00 + gradients 20.00 + optimizer states 30.00 +
/// activations 21.20 GiB".
void check_fits(const std::vector<StageMemory>& stages, const MemoryBudget& budget,
                PipelineScheme scheme);

/// bytes / 2^30.
double to_gib(int64_t bytes);

}  // namespace dhelix
