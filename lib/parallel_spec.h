#pragma once
// How a job is spread over GPUs: the sizes of each parallel dimension, the batch
// shape, and the rank order that maps a rank to its coordinates.

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>
#include "lib/enum_names.h"

namespace dhelix {

/// A parallel dimension. Order of the enum is the default rank order's (fastest first).
enum class ParallelDim { kTp, kCp, kEp, kDp, kPp };

/// The name table of ParallelDim (lib/enum_names.h), index = enum value.
inline constexpr EnumNames<ParallelDim, 5> kParallelDimNames{{"tp", "cp", "ep", "dp", "pp"}};
/// "tp", "cp", "ep", "dp", "pp"
constexpr const char* parallel_dim_name(ParallelDim dim) { return kParallelDimNames.name(dim); }

// ----- activation recompute and uneven pipeline stages (Megatron-LM's flags) -----------

/// Megatron's --recompute-granularity: what a layer recomputes in its backward instead of
/// keeping it from the forward. kFull: the whole layer (only its input is kept); kSelective:
/// the core attention (Korthikanti et al. 2022, section 4.1).
enum class RecomputeGranularity { kNone, kFull, kSelective };
/// Megatron's --recompute-method (full granularity only): kUniform recomputes every layer,
/// keeping the input of each group of num_layers layers; kBlock recomputes the first
/// num_layers layers of each chunk and keeps the others' activations.
enum class RecomputeMethod { kUniform, kBlock };

const char* recompute_granularity_name(RecomputeGranularity g);  ///< "none", "full", "selective"
const char* recompute_method_name(RecomputeMethod m);            ///< "uniform", "block"

struct RecomputeSpec {
  RecomputeGranularity granularity = RecomputeGranularity::kNone;
  RecomputeMethod method = RecomputeMethod::kUniform;
  int64_t num_layers = 1;  ///< --recompute-num-layers: group size (uniform) or count (block)

  bool enabled() const { return granularity != RecomputeGranularity::kNone; }
};

// ----- context parallelism: how the attention communicates (Megatron-LM's --cp-comm-type) -----
/// Megatron-LM's --cp-comm-type (TransformerEngine's cp_comm_type), docs/cost-model.md
/// "Context parallelism: communication types":
///   kP2p      K/V blocks travel a ring, one step per CP rank, overlapped with attention
///             (lib/dag_builder_cp.cc); the default.
///   kA2a      DeepSpeed Ulysses (Jacobs et al. 2023): all-to-alls turn Q, K, V from a
///             sequence split into a head split, attention over the whole sequence on
///             heads/cp, an all-to-all back (lib/dag_builder_cp_a2a.cc).
///   kAllGather K and V all-gathered whole, the local queries against them; backward
///             reduce-scatters dK, dV.
///   kA2aP2p   hierarchical: a2a inside sub-groups of A adjacent CP ranks, the
///             ring across the sub-groups (--hierarchical-context-parallel-sizes A P).
enum class CpCommType { kP2p, kA2a, kAllGather, kA2aP2p };
inline constexpr EnumNames<CpCommType, 4> kCpCommTypeNames{{"p2p", "a2a", "allgather", "a2a+p2p"}};
/// "p2p", "a2a", "allgather", "a2a+p2p"
constexpr const char* cp_comm_type_name(CpCommType t) { return kCpCommTypeNames.name(t); }

// ----- fully sharded data parallelism (Megatron-LM's --use-megatron-fsdp) -----
/// Megatron-LM's --data-parallel-sharding-strategy (Megatron-FSDP's ShardingStrategy; the
/// ZeRO stages of Rajbhandari et al. 2020), what is sharded over the dp ranks:
///   kNoShard           nothing: every replica holds and steps every weight (DDP's memory;
///                      Megatron's default)
///   kOptim             optimizer states (ZeRO-1: today's distributed optimizer)
///   kOptimGrads        optimizer states and gradients (ZeRO-2); the parameters stay whole
///                      across micro-batches, the gradients reduce at the iteration's end
///   kOptimGradsParams  everything (ZeRO-3): every layer all-gathers its parameters before its
///                      forward (and its backward, with reshard_after_forward) and
///                      reduce-scatters its gradients after the backward, every micro-batch
///                      (lib/dag_builder_fsdp.cc)
enum class FsdpShardingStrategy { kNoShard, kOptim, kOptimGrads, kOptimGradsParams };
inline constexpr EnumNames<FsdpShardingStrategy, 4> kFsdpShardingStrategyNames{
    {"no_shard", "optim", "optim_grads", "optim_grads_params"}};
/// "no_shard", "optim", "optim_grads", "optim_grads_params"
constexpr const char* fsdp_sharding_strategy_name(FsdpShardingStrategy s) {
  return kFsdpShardingStrategyNames.name(s);
}

struct ParallelSpec {
  int64_t dp = 1;   ///< data-parallel replicas
  int64_t tp = 1;   ///< tensor-parallel size
  bool sp = false;  ///< sequence parallelism (needs tp > 1; all-gather/reduce-scatter instead of
                    ///< all-reduce)
  int64_t cp = 1;   ///< context-parallel size (ring attention over the sequence)
  int64_t pp = 1;   ///< pipeline stages
  int64_t ep = 1;   ///< expert-parallel size, carved out of dp·cp (MoE only)
  int64_t micro_batch_size = 1;   ///< sequences per micro-batch per DP replica
  int64_t global_batch_size = 0;  ///< sequences per iteration over all DP replicas
  int64_t seq_length = 0;         ///< tokens per sequence
  /// Rank order, fastest-varying dimension first; Megatron's default "tp-cp-ep-dp-pp".
  /// ep does not add ranks: it splits the cp·dp block (see placement.h).
  std::vector<ParallelDim> rank_order = {ParallelDim::kTp, ParallelDim::kCp, ParallelDim::kEp,
                                         ParallelDim::kDp, ParallelDim::kPp};

  // ----- activation recompute and uneven pipeline stages -----
  RecomputeSpec recompute;  ///< off by default
  /// Megatron's --decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers:
  /// transformer layers on the first / last 1F1B stage (0: not set, layers split evenly).
  /// planner/folding.h derives both layouts from them.
  int64_t first_stage_layers = 0;
  int64_t last_stage_layers = 0;
  /// Megatron's --account-for-embedding-in-pipeline-split / --account-for-loss-in-pipeline-
  /// split: the embedding (loss) counts as one layer when the layers are split, so the first
  /// (last) stage builds one transformer layer fewer (lib/stage_split.h). Megatron refuses
  /// them together with first/last_stage_layers.
  bool account_for_embedding = false;
  bool account_for_loss = false;

  /// True when first_stage_layers or last_stage_layers is set, or an account_for flag.
  bool uneven_stages() const {
    return first_stage_layers > 0 || last_stage_layers > 0 || account_for_embedding ||
           account_for_loss;
  }
  // ----- cost-model settings: communication overlap and MoE routing -----------------------
  /// Megatron's --overlap-grad-reduce: the DP gradient reduction runs bucket by bucket under
  /// the last micro-batch's backward (planner/dp_overlap.h). On by default.
  bool overlap_grad_reduce = true;
  /// Megatron's --overlap-param-gather: the distributed optimizer's parameter all-gather runs
  /// under the next iteration's first forward. On by default.
  bool overlap_param_gather = true;
  /// Megatron's --expert-tensor-parallel-size: the TP group the experts are split over; 0
  /// means "as Megatron-Core's default", i.e. equal to tp.
  int64_t expert_tp = 0;
  /// Tokens of the busiest expert over the mean (>= 1), scaling the expert GEMMs and the
  /// all-to-alls; nullopt means the default of docs/cost-model.md ("MoE routing").
  std::optional<double> moe_load_imbalance;
  /// Heads of K and V the context-parallel ring carries: false (the KV heads, TE's native
  /// grouped-query attention, current Megatron-Core) or true (every query head: Megatron-LM
  /// up to core 0.5 repeats K and V to the query heads before the attention kernel, so its
  /// CP ring moves heads/kv_heads times the bytes). JSON "cp_ring_heads": "kv" | "query".
  bool cp_ring_query_heads = false;
  /// Megatron-LM's --cp-comm-type: how context parallelism moves K/V (see CpCommType).
  /// JSON "cp_comm_type".
  CpCommType cp_comm_type = CpCommType::kP2p;
  /// Megatron-LM's --hierarchical-context-parallel-sizes, for a2a+p2p: {A, P}, A adjacent
  /// CP ranks form an all-to-all sub-group, the ring spans the P sub-groups (A·P = cp).
  /// Empty when unset. JSON "hierarchical_context_parallel_sizes": [A, P].
  std::vector<int64_t> hierarchical_cp_sizes;
  /// CP ranks one all-to-all spans: cp (a2a), A (a2a+p2p), 1 otherwise.
  int64_t cp_a2a_group() const {
    if (cp_comm_type == CpCommType::kA2a) return cp;
    if (cp_comm_type == CpCommType::kA2aP2p && !hierarchical_cp_sizes.empty())
      return hierarchical_cp_sizes.front();
    return 1;
  }
  /// CP ranks the K/V ring spans: cp (p2p), P (a2a+p2p), 1 otherwise.
  int64_t cp_ring_group() const {
    if (cp_comm_type == CpCommType::kP2p) return cp;
    if (cp_comm_type == CpCommType::kA2aP2p && hierarchical_cp_sizes.size() == 2)
      return hierarchical_cp_sizes.back();
    return 1;
  }
  /// How the runtime separates DHelix's co-executed blocks: false (CUDA events, every block
  /// enqueued ahead, as dhelix-run) or true (the host synchronises after every block and then
  /// launches the next one, as the DHelix paper's prototype does): then every paired block
  /// starts with a launch interval (planner/block_launch.h). JSON "block_sync": "event" |
  /// "host".
  bool host_synchronized_blocks = false;
  /// Megatron-LM's --grad-reduce-in-bf16 (Megatron-Core DDP grad_reduce_in_fp32 = false):
  /// the main gradient buffer and the DP reduction in bf16 instead of fp32 (Megatron's
  /// default for bf16 training); the distributed optimizer then keeps an fp32 copy of its
  /// gradient shard (planner/memory_model.h). NVIDIA's published Megatron-Bridge performance
  /// recipes set it (scripts/performance/utils/helpers.py, set_basic_perf_overrides).
  bool grad_reduce_in_bf16 = false;
  // ----- fully sharded data parallelism (docs/cost-model.md) -----
  /// Megatron-LM's --use-megatron-fsdp. JSON "use_megatron_fsdp".
  bool use_megatron_fsdp = false;
  /// Megatron-LM's --data-parallel-sharding-strategy (with use_megatron_fsdp only).
  /// JSON "data_parallel_sharding_strategy".
  FsdpShardingStrategy fsdp_sharding = FsdpShardingStrategy::kNoShard;
  /// PyTorch FSDP2's reshard_after_forward (optim_grads_params): true frees the gathered
  /// parameters after each layer's forward and gathers them again for its backward; false
  /// keeps them from the forward to the end of that micro-batch's backward. JSON
  /// "fsdp_reshard_after_forward".
  bool fsdp_reshard_after_forward = true;
  /// True when the layers gather their parameters and reduce-scatter their gradients
  /// (use_megatron_fsdp with optim_grads_params).
  bool fsdp_shards_parameters() const {
    return use_megatron_fsdp && fsdp_sharding == FsdpShardingStrategy::kOptimGradsParams;
  }
  /// Whether the optimizer states are sharded over the data-parallel ranks: always without
  /// Megatron-FSDP (dhelix plans with Megatron's distributed optimizer), and with it unless
  /// the strategy is no_shard.
  bool shards_optimizer() const {
    return !use_megatron_fsdp || fsdp_sharding != FsdpShardingStrategy::kNoShard;
  }
  /// expert_tp, or tp when unset.
  int64_t expert_tp_size() const { return expert_tp > 0 ? expert_tp : tp; }
  // ----- end of cost-model settings --------------------------------------------------------

  /// GPUs the job uses: dp·tp·cp·pp. Overflows for absurd sizes: validate_job bounds them,
  /// and checked_world_size() is the overflow-safe form.
  int64_t world_size() const { return dp * tp * cp * pp; }
  /// dp·tp·cp·pp, or nullopt when the product does not fit in int64.
  std::optional<int64_t> checked_world_size() const;
  /// micro_batch_size·dp (sequences per micro-batch step over all replicas), or nullopt when
  /// the product does not fit in int64.
  std::optional<int64_t> checked_replica_batch_size() const;
  /// Micro-batches each pipeline processes per iteration: global / (micro · dp).
  int64_t num_micro_batches() const {
    return micro_batch_size * dp == 0 ? 0 : global_batch_size / (micro_batch_size * dp);
  }
  /// Tokens of one micro-batch on one rank's sequence shard: micro_batch·seq / cp.
  int64_t tokens_per_rank() const { return cp == 0 ? 0 : micro_batch_size * seq_length / cp; }
};

/// The product of `factors`, or nullopt when it does not fit in int64 (checked at each step).
std::optional<int64_t> checked_product(std::initializer_list<int64_t> factors);

/// "tp-cp-ep-dp-pp" style text of a rank order.
std::string rank_order_text(const std::vector<ParallelDim>& order);

}  // namespace dhelix
