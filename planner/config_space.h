#pragma once
// The parallel configurations a search considers for one model, cluster, GPU count,
// global batch and sequence length.
//
// A configuration is (tp, sp, cp, pp, dp, ep, expert-tp, micro-batch, recompute) with
// tp · cp · pp · dp = the GPU count. Enumerated, fastest-varying last, in this order:
//
//   tp          powers of two up to the GPU count
//   sp          off and on (on only with tp > 1)
//   cp          powers of two with seq divisible by 2·cp (the load-balanced causal split)
//   pp          1 up to the layer count: even stages where 2·pp divides the layers, else
//               the planner's own uneven split where lib/stage_split.h allows one (the
//               search chooses it per configuration, planner/chosen_split.h: Llama-3.1-
//               405B, 126 layers, pp 16: F = La = 7)
//   dp          what is left: GPUs / (tp · cp · pp), when that divides
//   ep          MoE only: powers of two dividing dp · cp and the expert count
//   expert-tp   MoE only: tp (Megatron-Core's default) and, with tp > 1, 1
//   micro-batch 1, 2, 4, 8 sequences, when dp · mbs divides the global batch
//   recompute   none, selective, full (uniform, one layer a group)
//   cp-comm     cp > 1 only (Megatron-LM's --cp-comm-type): p2p; a2a where the query and
//               KV heads of a TP rank divide by cp; allgather; a2a+p2p with the largest
//               power-of-two sub-group A < cp, A >= 2, that fits a node beside TP
//               (A·tp <= gpus_per_node) and divides those heads. Fixed by --cp-comm-type.
//   fsdp        only where the base job sets use_megatron_fsdp or the command line asks
//               (--use-megatron-fsdp, --data-parallel-sharding-strategy), and dp > 1 (dp 1
//               has nothing to shard: FSDP off there): optim (ZeRO-1, the distributed
//               optimizer) and optim_grads_params (ZeRO-3) where the job allows it (cp 1:
//               lib/job_validation.cc; a mixture of experts shards its experts over the
//               expert-data-parallel group, lib/fsdp_sizes.h). no_shard and
//               optim_grads are left out of the search: dhelix prices optim_grads as optim
//               (the gradients reduce at the iteration's end) and no_shard as optim with
//               unsharded optimizer states, never faster. Fixed by
//               --data-parallel-sharding-strategy; reshard_after_forward is the base job's.
//
// Worked example: 8 GPUs, a dense 4-layer model, gbs 16, seq 4096, recompute fixed, no
// other constraint. pp is 1 or 2 (4 layers fold evenly on 1 and 2 stages; 3 and 4 stages
// have no split). Micro-batches: dp 8 allows mbs 1, 2; dp 4: 1, 2, 4; dp 2 and 1: 1-8.
//
//   tp·cp   (tp, cp) pairs             pp 1        pp 2        configurations
//   1       (1,1)                      dp 8: 2     dp 4: 3     5
//   2       (1,2) (2,1)·sp             dp 4: 3     dp 2: 4     (1 + 2) · 7 = 21
//   4       (1,4) (2,2)·sp (4,1)·sp    dp 2: 4     dp 1: 4     (1 + 2 + 2) · 8 = 40
//   8       (1,8) (2,4)·sp (4,2)·sp    dp 1: 4     -           (1 + 2 + 2 + 2) · 4 = 28
//           (8,1)·sp
//
// 94 in all (·sp: with tp > 1, sp off and on) with the CP communication type fixed;
// searching recompute triples it. Searching the type too (llama-8b's 32 query and 8 KV
// heads, 8-GPU nodes) repeats each cp > 1 configuration once per type it allows:
//
//   (tp, cp)  types                                configurations
//   (1,2)     p2p a2a allgather                    7 · 3 = 21
//   (1,4)     p2p a2a allgather a2a+p2p [2,2]      8 · 4 = 32
//   (2,2)·sp  p2p a2a allgather                    16 · 3 = 48
//   (1,8)     p2p a2a allgather a2a+p2p [4,2]      4 · 4 = 16
//   (2,4)·sp  p2p a2a allgather a2a+p2p [2,2]      8 · 4 = 32
//   (4,2)·sp  p2p a2a allgather                    8 · 3 = 24
//
// 173 cp > 1 configurations instead of 51: 216 in all. Asking for FSDP (CP type fixed)
// doubles the 27 configurations with dp > 1 and cp = 1 (optim and optim_grads_params): 121.
// The job's
// own rules (lib/job_validation.h: heads divisible by tp, and so on) are applied later, by
// the search, so that a rejected configuration is reported with the planner's words.
//
// Constraints narrow each axis: a fixed value, a maximum (max_pp), or an axis switched off
// (no CP). The enumeration order is part of the output contract: ties between equally fast
// configurations are broken by it (the earlier one wins).

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "lib/job_spec.h"

namespace dhelix {

/// What the user fixed or bounded; unset means "search this axis".
struct SearchConstraints {
  std::optional<int64_t> tp, cp, pp, dp, ep, micro_batch_size;
  std::optional<bool> sp;
  int64_t max_pp = 0;                ///< 0: no bound
  int64_t max_micro_batch_size = 8;  ///< micro-batches searched: powers of two up to this
  bool allow_cp = true;              ///< false: cp = 1 only
  bool search_recompute = true;      ///< false: the base job's recompute setting only
  /// Megatron's --cp-comm-type fixed for cp > 1 (a2a+p2p takes the base job's
  /// hierarchical sizes); unset: searched (see the file comment).
  std::optional<CpCommType> cp_comm_type;
  /// Megatron-FSDP: searched (optim, optim_grads_params) where dp > 1 when set; the base
  /// job's use_megatron_fsdp sets it too (see the file comment).
  bool search_fsdp = false;
  /// --data-parallel-sharding-strategy fixed (with FSDP on where dp > 1).
  std::optional<FsdpShardingStrategy> fsdp_sharding;
};

/// Every configuration of the space, in enumeration order (see the file comment). `base`
/// supplies the model, cluster, global batch, sequence length and cost-model settings;
/// its parallel sizes are ignored. Errors: kInvalidInput when gpus < 1.
std::vector<ParallelSpec> enumerate_configurations(const JobSpec& base, int64_t gpus,
                                                   const SearchConstraints& constraints);

/// Why enumerate_configurations(base, gpus, constraints) is empty, naming the axis where
/// every configuration stopped, e.g. "7 GPUs: every tp·cp·pp·dp = 7 has dp in {7}, and no
/// dp·micro_batch_size (micro_batch_size in {1, 2, 4, 8}) divides global batch 8"; "" when
/// it is not empty.
std::string empty_space_reason(const JobSpec& base, int64_t gpus,
                               const SearchConstraints& constraints);

/// "tp8 sp cp2 pp4 dp2 mbs1 recompute=selective" (ep and expert-tp for MoE models; with
/// Megatron-FSDP " fsdp-optim_grads_params", and "(keep)" without reshard_after_forward).
std::string configuration_label(const ParallelSpec& parallel, bool moe);

}  // namespace dhelix
