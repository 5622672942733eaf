#include "planner/memory_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "lib/dtype.h"
#include "lib/error.h"
#include "lib/fsdp_sizes.h"
#include "lib/int_math.h"

namespace dhelix {

namespace {

constexpr int64_t kFp32Bytes = 4;

// Per-GPU parameters of one layer: attention and dense MLP split over tp, norms and the
// router replicated, experts split over ep and the expert tensor-parallel group.
StageParameters layer_parameters(const ModelSpec& model, const ParallelSpec& parallel) {
  const int64_t norms = 2 * norm_parameter_count(model);
  int64_t router = 0;
  int64_t experts = 0;
  if (model.is_moe()) {
    router = model.hidden_size * model.moe->num_experts;
    experts = model.moe->num_experts *
              mlp_parameter_count(model, model.moe->expert_ffn_hidden_size, false);
  }
  const int64_t split = layer_parameter_count(model) - norms - router - experts;
  StageParameters params;
  params.dense = ceil_div(split, parallel.tp) + norms + router;
  params.expert = ceil_div(experts, parallel.ep * parallel.expert_tp_size());
  return params;
}

// Optimizer bytes of a stage's parameters on one GPU.
int64_t optimizer_bytes(const StageParameters& params, const ParallelSpec& parallel,
                        bool distributed) {
  const int64_t per_parameter = optimizer_bytes_per_parameter(parallel);
  // Megatron-FSDP's no_shard keeps every state on every replica whatever the options say.
  if (!distributed || !parallel.shards_optimizer()) return per_parameter * params.total();
  const int64_t dense_shards = parallel.dp * parallel.cp;
  const int64_t expert_shards = std::max<int64_t>(
      1, parallel.dp * parallel.cp * parallel.tp / (parallel.ep * parallel.expert_tp_size()));
  return ceil_div(per_parameter * params.dense, dense_shards) +
         ceil_div(per_parameter * params.expert, expert_shards);
}

std::string gib_text(int64_t bytes) { return fmt::format("{:.2f}", to_gib(bytes)); }

// "4.00 MiB" below a GiB (where "0.00 GiB" would hide the value), else "80.00 GiB".
std::string size_text(int64_t bytes) {
  if (bytes < (int64_t{1} << 30)) {
    return fmt::format("{:.2f} MiB", static_cast<double>(bytes) / static_cast<double>(1 << 20));
  }
  return gib_text(bytes) + " GiB";
}

}  // namespace

int64_t gradient_bytes_per_parameter(const ParallelSpec& parallel) {
  return parallel.grad_reduce_in_bf16 ? 2 : kGradientBytesPerParameter;
}

int64_t optimizer_bytes_per_parameter(const ParallelSpec& parallel) {
  return kOptimizerBytesPerParameter + (parallel.grad_reduce_in_bf16 ? kFp32Bytes : 0);
}

double to_gib(int64_t bytes) {
  return static_cast<double>(bytes) / static_cast<double>(int64_t{1} << 30);
}

int64_t fsdp_kept_parameter_bytes(const ModelSpec& model, const ParallelSpec& parallel) {
  if (!parallel.fsdp_shards_parameters() || parallel.fsdp_reshard_after_forward) return 0;
  const int64_t experts =
      fsdp_shards_experts(model, parallel) ? fsdp_expert_parameters(model, parallel) : 0;
  return dtype_bytes(model.dtype) * (fsdp_layer_parameters(model, parallel) + experts);
}

int64_t layer_activation_bytes(const ModelSpec& model, const ParallelSpec& parallel,
                               const MemoryOptions& options) {
  const int64_t tokens = parallel.tokens_per_rank();
  const int64_t dt = dtype_bytes(model.dtype);
  const int64_t h = model.hidden_size;
  const int64_t q = model.num_attention_heads * model.head_dim;
  const int64_t kv = model.num_kv_heads * model.head_dim;
  const int64_t tp = parallel.tp;
  // Inputs of both norms and of the QKV and FC1 (or router/permute) GEMMs: split by SP.
  int64_t sequence_part = dt * 4 * h + (options.dropout ? 2 * h : 0);
  // Flash attention keeps Q, K, V and its output (also the projection's input).
  int64_t head_part = dt * (2 * q + 2 * kv);
  const int64_t held_parameters = fsdp_kept_parameter_bytes(model, parallel);
  // Ulysses (a2a, a2a+p2p): TransformerEngine keeps Q, K, V and O in the head split (the
  // same bytes per rank), but the projection's input is the output after the all-to-all
  // back, a second tensor of q columns (AttnFuncWithCPAndQKVOA2A saves the head-split O).
  if (parallel.cp > 1 && parallel.cp_a2a_group() > 1) head_part += dt * q;
  if (model.is_moe()) {
    const MoeSpec& moe = *model.moe;
    // Balanced routing keeps top_k copies of each token; a capacity factor below 1 drops
    // the excess (no padding: see lib/dag_builder_moe.cc).
    const double copies = static_cast<double>(moe.top_k) *
                          (moe.capacity_factor > 0 ? std::min(moe.capacity_factor, 1.0) : 1.0);
    // Each routed copy keeps its permuted input (h), activation inputs and fc2 input, and the
    // expert output the weighted combine needs (h); the router keeps fp32 probabilities.
    const int64_t per_copy = dt * (2 * h + mlp_matrix_count(model) * moe.expert_ffn_hidden_size);
    head_part += static_cast<int64_t>(std::llround(copies * static_cast<double>(per_copy))) +
                 kFp32Bytes * moe.num_experts;
  } else {
    // One ffn-wide tensor per MLP matrix: SwiGLU's gate and up outputs (GELU's fc1 output)
    // and fc2's input.
    head_part += dt * mlp_matrix_count(model) * model.ffn_hidden_size;
  }
  const int64_t sequence_divisor = parallel.sp ? tp : 1;
  return tokens * sequence_part / sequence_divisor + tokens * head_part / tp + held_parameters;
}

int64_t layer_input_bytes(const ModelSpec& model, const ParallelSpec& parallel) {
  const int64_t elements = parallel.tokens_per_rank() * model.hidden_size;
  return dtype_bytes(model.dtype) * elements / (parallel.sp ? parallel.tp : 1);
}

int64_t chunk_activation_bytes(const ModelSpec& model, const ParallelSpec& parallel, int64_t layers,
                               const MemoryOptions& options) {
  const int64_t full = layer_activation_bytes(model, parallel, options);
  const RecomputeSpec& r = parallel.recompute;
  if (r.granularity != RecomputeGranularity::kFull || layers == 0) return layers * full;
  const int64_t input = layer_input_bytes(model, parallel);
  // Recompute drops activations, not FSDP's kept parameters: every layer keeps its own.
  const int64_t kept = layers * fsdp_kept_parameter_bytes(model, parallel);
  if (r.method == RecomputeMethod::kUniform) return ceil_div(layers, r.num_layers) * input + kept;
  const int64_t recomputed = std::min(r.num_layers, layers);
  return recomputed * input + (layers - recomputed) * full +
         (recomputed * fsdp_kept_parameter_bytes(model, parallel));
}

int64_t recompute_transient_bytes(const ModelSpec& model, const ParallelSpec& parallel,
                                  int64_t layers, const MemoryOptions& options) {
  const RecomputeSpec& r = parallel.recompute;
  if (r.granularity != RecomputeGranularity::kFull || layers == 0) return 0;
  const int64_t group = r.method == RecomputeMethod::kUniform ? std::min(r.num_layers, layers) : 1;
  // The group's first input is the checkpoint chunk_activation_bytes already keeps: the
  // recomputed forward reads it where it is (Megatron's checkpoint is that tensor), so it is
  // not held twice. dhelix-run measured the double count (docs/runtime.md).
  // FSDP's kept parameters are not recomputed (chunk_activation_bytes holds them already),
  // and the replay under reshard reads the backward's gathered buffer, which fsdp_memory
  // counts: neither is transient here.
  return group * (layer_activation_bytes(model, parallel, options) -
                  fsdp_kept_parameter_bytes(model, parallel)) -
         layer_input_bytes(model, parallel);
}

int64_t cp_gathered_kv_bytes(const ModelSpec& model, const ParallelSpec& parallel) {
  if (parallel.cp == 1 || parallel.cp_comm_type != CpCommType::kAllGather) return 0;
  const int64_t kv_width = model.num_kv_heads / parallel.tp * model.head_dim;
  return dtype_bytes(model.dtype) * parallel.micro_batch_size * parallel.seq_length * 2 * kv_width;
}

int64_t cp_forward_transient_bytes(const ModelSpec& model, const ParallelSpec& parallel) {
  return cp_gathered_kv_bytes(model, parallel);
}

int64_t cp_backward_transient_bytes(const ModelSpec& model, const ParallelSpec& parallel) {
  return 2 * cp_gathered_kv_bytes(model, parallel);
}

int64_t stage_layer_count(const ModelSpec& model, const ParallelSpec& parallel, PipelineShape shape,
                          int64_t stage) {
  if (!parallel.uneven_stages()) return model.num_layers / parallel.pp;
  if (folded_shape(shape)) return fold_job_layers(model.num_layers, parallel).stage_layers(stage);
  return unfold_job_layers(model.num_layers, parallel).stages.at(static_cast<size_t>(stage)).count;
}

int64_t head_loss_transient_bytes(const ModelSpec& model, const ParallelSpec& parallel) {
  const int64_t vocab_shard = ceil_div(model.vocab_size, parallel.tp);
  return parallel.tokens_per_rank() * vocab_shard * (dtype_bytes(model.dtype) + kFp32Bytes);
}

StageParameters stage_parameters(const ModelSpec& model, const ParallelSpec& parallel,
                                 PipelineShape shape, int64_t stage) {
  DHELIX_CHECK(parallel.pp >= 1 && stage >= 0 && stage < parallel.pp);
  const StageParameters layer = layer_parameters(model, parallel);
  const int64_t layers = stage_layer_count(model, parallel, shape, stage);
  StageParameters params{layer.dense * layers, layer.expert * layers};
  if (parallel.fsdp_shards_parameters()) params.fsdp_layers = layer.dense * layers;
  if (fsdp_shards_experts(model, parallel)) params.fsdp_experts = layer.expert * layers;
  const int64_t embedding_stage = 0;
  const int64_t head_stage = folded_shape(shape) ? 0 : parallel.pp - 1;
  const int64_t vocab_shard = ceil_div(model.vocab_size, parallel.tp) * model.hidden_size;
  if (stage == embedding_stage) {
    params.dense += vocab_shard;
    if (model.position == PositionKind::kLearned)
      params.dense += model.max_seq_length * model.hidden_size;
  }
  if (stage == head_stage) {
    params.dense += norm_parameter_count(model);
    // An untied head, or a tied embedding's copy on a stage that lacks the embedding.
    if (!model.tied_embeddings || head_stage != embedding_stage) params.dense += vocab_shard;
  }
  return params;
}

FsdpMemory fsdp_memory(const ModelSpec& model, const ParallelSpec& parallel, PipelineShape shape,
                       const StageParameters& params) {
  FsdpMemory m;
  if (!parallel.fsdp_shards_parameters() || params.fsdp_layers == 0) return m;
  const int64_t dt = dtype_bytes(model.dtype);
  const int64_t g = gradient_bytes_per_parameter(parallel);
  const int64_t strands = folded_shape(shape) ? 2 : 1;
  // Each part: its stage's parameters `all` over `members`, `layer` of them a layer.
  const auto add_part = [&](int64_t all, int64_t members, int64_t layer) {
    const int64_t unsharded = all - ceil_div(all, members);
    m.weight_saving_bytes += dt * unsharded;
    m.gathered_buffer_bytes += dt * 2 * strands * layer;
    m.gradient_saving_bytes += g * unsharded;
    m.gradient_buffer_bytes += g * 2 * layer;
  };
  add_part(params.fsdp_layers, parallel.dp, fsdp_layer_parameters(model, parallel));
  if (params.fsdp_experts > 0) {
    add_part(params.fsdp_experts, fsdp_expert_data_parallel_size(parallel),
             fsdp_expert_parameters(model, parallel));
  }
  return m;
}

std::vector<StageMemory> stage_memory(const ModelSpec& model, const ParallelSpec& parallel,
                                      PipelineShape shape, const MemoryOptions& options,
                                      const std::vector<int64_t>& peak_activation_bytes) {
  DHELIX_CHECK(static_cast<int64_t>(peak_activation_bytes.size()) == parallel.pp);
  std::vector<StageMemory> stages;
  for (int64_t p = 0; p < parallel.pp; ++p) {
    StageMemory m;
    m.stage = p;
    m.parameters = stage_parameters(model, parallel, shape, p);
    const FsdpMemory fsdp = fsdp_memory(model, parallel, shape, m.parameters);
    m.weight_bytes = dtype_bytes(model.dtype) * m.parameters.total() - fsdp.weight_saving_bytes +
                     fsdp.gathered_buffer_bytes;
    m.gradient_bytes = gradient_bytes_per_parameter(parallel) * m.parameters.total() -
                       fsdp.gradient_saving_bytes + fsdp.gradient_buffer_bytes;
    m.optimizer_bytes = optimizer_bytes(m.parameters, parallel, options.distributed_optimizer);
    m.activation_bytes = peak_activation_bytes[static_cast<size_t>(p)];
    stages.push_back(m);
  }
  return stages;
}

MemoryBudget memory_budget(const GpuSpec& gpu, const MemoryOptions& options) {
  MemoryBudget budget;
  budget.gpu_name = gpu.name;
  budget.capacity_bytes = gpu.memory_bytes;
  budget.reserve_bytes = static_cast<int64_t>(std::llround(options.reserve_fraction *
                                                           static_cast<double>(gpu.memory_bytes))) +
                         options.fixed_reserve_bytes;
  return budget;
}

MemoryBudget memory_budget(const JobSpec& job, const MemoryOptions& options) {
  const ClusterSpec& cluster = job.cluster;
  MemoryBudget budget = memory_budget(cluster.gpu, options);
  if (budget.usable_bytes() > 0) return budget;
  // A job's inline cluster lives at /cluster of the job file; a cluster file holds it at
  // its root; a preset has no file.
  const bool inline_cluster =
      !cluster.source_file.empty() && cluster.source_file == job.source_file;
  const std::string where = cluster.source_file.empty()
                                ? fmt::format("cluster preset {}: gpu.memory_bytes", cluster.name)
                                : fmt::format("{}: {}/gpu/memory_bytes", cluster.source_file,
                                              inline_cluster ? "/cluster" : "");
  throw Error(ErrorCode::kInfeasible,
              fmt::format("{}: {} bytes ({}) is no more than the memory every plan keeps free "
                          "on a GPU, {} bytes ({} GiB: {} % of the memory for allocator "
                          "fragmentation + {} GiB for the CUDA context, library workspaces and "
                          "NCCL buffers): no plan fits on {}; give the GPU's real memory",
                          where, cluster.gpu.memory_bytes, size_text(cluster.gpu.memory_bytes),
                          budget.reserve_bytes, gib_text(budget.reserve_bytes),
                          options.reserve_fraction * 100, gib_text(options.fixed_reserve_bytes),
                          cluster.gpu.name.empty() ? std::string("this GPU") : cluster.gpu.name));
}

void check_fits(const std::vector<StageMemory>& stages, const MemoryBudget& budget,
                PipelineScheme scheme) {
  std::string message;
  for (const StageMemory& m : stages) {
    if (m.total_bytes() <= budget.usable_bytes()) continue;
    if (!message.empty()) message += "\n";
    message += fmt::format(
        "{}: stage {} needs {} GiB but {} GiB are usable on {} ({} GiB minus {} GiB reserve): "
        "weights {} + gradients {} + optimizer states {} + activations {} GiB",
        pipeline_scheme_name(scheme), m.stage, gib_text(m.total_bytes()),
        gib_text(budget.usable_bytes()), budget.gpu_name, gib_text(budget.capacity_bytes),
        gib_text(budget.reserve_bytes), gib_text(m.weight_bytes), gib_text(m.gradient_bytes),
        gib_text(m.optimizer_bytes), gib_text(m.activation_bytes));
  }
  if (!message.empty()) throw Error(ErrorCode::kInfeasible, message);
}

}  // namespace dhelix
