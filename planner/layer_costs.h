#pragma once
// One stage's layer-level costs for the schemes, from its layer DAGs, a profile's solo times
// and a co-run model:
//
//   megatron-1f1b  each strand alone: the best single-strand schedule of the layer's
//                  forward and of its backward (search_single_strand; ops of different
//                  streams of one strand may still overlap, e.g. a weight-gradient GEMM
//                  beside a reduce-scatter, as Megatron's asynchronous TP communication does)
//   intra-batch    the same on the chunked (MegaScale-like) DAGs of
//                  lib/dag_builder_intra_batch.h, where all-gather+GEMM and GEMM+
//                  reduce-scatter are split into pieces that pipeline within one strand
//   wavelet+       one layer's forward against one layer's backward, paired round-robin in
//                  their default topological orders (planner/layer_baselines.h)
//   dhelix         the exact pairing search, both scopes (chunk_pairing.h); the better one.
//                  Under FSDP's optim_grads_params it pairs the layer without FSDP's
//                  collectives and prefetches them across SI blocks (fsdp_si_prefetch.h)
//   handwritten    one layer's forward against one layer's backward in the fixed orders
//                  people write by hand (handwritten_pairs.h): DeepSeek-V3's, and
//                  Megatron-Core's combined 1F1B with and without delayed weight gradients
//
// The baselines of baseline_schedules.h reuse these: interleaved 1F1B, ZB-H1 and ZB-V the
// megatron figures, with the backward's weight-gradient part (backward_weight_us: the solo
// times of its BackwardWork::kWeightGradient ops, lib/op_catalogue.h) for the split into I
// and W; DualPipeV the megatron figures and dhelix's SI block for its overlapped pairs
// (the generous reading), dualpipev-handwritten DeepSeek-V3's order for them, and
// megatron-a2a-overlap the better of Megatron's two orders.
//
// Hidden and exposed communication. Inside a simulated block, the wall time of a
// communication op (start to finish, slowdowns included) is "hidden" for the part of it
// during which some compute op of either strand ran, and "exposed" for the rest. A
// schedule's figure per type (the op's group: tp, cp, ep) is the sum over its blocks.
// Example: a 40 us all-gather beside a 30 us GEMM that starts with it is 30 us hidden,
// 10 us exposed.
//
// A kernel slowed by a collective beside it is communication cost too (the DHelix paper's
// Table 7 counts it as "visible (slowdown)"): a compute op that ran d us longer than its solo
// time moves d us of the collectives it overlapped from hidden to exposed, split in
// proportion to how long each ran beside it (at most what each had hidden). Example: a GEMM
// of 30 us solo that takes 36 us beside a 40 us all-gather started with it: the all-gather
// is 36 - 6 = 30 us hidden and 4 + 6 = 10 us exposed: the block lasts 40 us, 10 us more
// than the GEMM alone. So exposed is what the communication adds to the block. A paired
// block's launch interval (planner/block_launch.h: the time before its first op starts) is
// exposed communication too, split over its collectives by their time ("visible (launch
// interval)" in Table 7); so with it hidden + exposed exceeds the collectives' wall time.

#include <cstdint>
#include <vector>

#include "lib/job_spec.h"
#include "lib/layer_dag.h"
#include "lib/plan/plan.h"
#include "lib/profile.h"
#include "planner/chunk_pairing.h"
#include "planner/co_run_model.h"
#include "planner/handwritten_pairs.h"
#include "planner/pipeline_simulator.h"

namespace dhelix {

/// A strand's stream and communication group by op index of a one-layer strand graph
/// (the group is meaningful for communication ops only).
struct StrandKinds {
  std::vector<StreamClass> stream;
  std::vector<ParallelDim> group;
  /// Solo time of each op, us; empty: no op counts as slowed (see blocks_comm).
  std::vector<double> solo_us;
};

/// Kinds of every op of `graph` (built from `dag` by from_layer_dag).
StrandKinds strand_kinds(const StrandGraph& graph, const LayerDag& dag);

/// Hidden and exposed communication per type in `blocks` (see the file comment). Op
/// indices may be those of a window of several layers: index i is op i % size of the layer.
CommBreakdown blocks_comm(const std::vector<PairingBlock>& blocks, const StrandKinds& forward,
                          const StrandKinds& backward);

/// What the layer-level searches found for one stage's layer DAGs.
struct LayerAnalysis {
  int64_t chunk_layers = 1;  ///< layers per folded chunk the scopes were compared for
  LayerDags dags;
  StrandGraph forward;   ///< one layer's forward, profile solo times
  StrandGraph backward;  ///< one layer's backward
  /// FSDP's collectives are prefetched across SI blocks (planner/fsdp_si_prefetch.h): the
  /// search pairs the layer without them, the DP stream carries them beside its blocks.
  bool fsdp_prefetch = false;
  StrandGraph paired_forward;    ///< what dhelix's search paired: `forward`, or without FSDP
  StrandGraph paired_backward;   ///< the same of `backward`
  ChunkPairingResult dhelix;     ///< both scopes, for chunks of the folded layout
  PairingResult wavelet;         ///< round-robin pairing of one layer pair
  LayerCosts megatron;           ///< strands alone (no SI pair)
  LayerCosts intra_batch;        ///< chunked DAGs' strands alone
  LayerCosts wavelet_layer;      ///< forward and backward alone, SI pair round-robin
  LayerCosts dhelix_layer;       ///< forward and backward alone, SI pair from the search
  bool chunk_scope = false;      ///< the cross-layer scope is better for the folded chunk
  double chunk_si_block_us = 0;  ///< the chosen scope's SI block of one folded chunk
  CommBreakdown chunk_si_block_comm;
  /// The layer has EP all-to-alls (handwritten_pairs.h): without them the hand-written
  /// orders overlap nothing and their SI pair is the strands one after the other.
  bool has_all_to_all = false;
  PairingResult deepseek;               ///< DeepSeek-V3's order of one layer pair
  PairingResult megatron_a2a;           ///< Megatron's order, the better of its two variants
  bool megatron_delayed_wgrad = false;  ///< the better one delays the weight gradients
  LayerCosts deepseek_layer;            ///< forward and backward alone, SI pair DeepSeek's
  LayerCosts megatron_a2a_layer;        ///< forward and backward alone, SI pair Megatron's
};

/// The layer costs of `rank`'s layer DAGs, with the forward ops `recompute` repeats in the
/// backward (with_recompute, lib/dag_builder.h); every scheme pays them. `chunk_layers` is
/// the folded layout's layers per chunk; `cross_layer_max_segment_ops` bounds the chunk
/// scope's segments. The profile must cover every op (check_profile_covers). With a `memo`,
/// the pairing searches are looked up there first (planner/pairing_memo.h).
LayerAnalysis analyze_layers(const JobSpec& job, int64_t rank, const Profile& profile,
                             const CoRunModel& co_run, int64_t chunk_layers,
                             int64_t cross_layer_max_segment_ops,
                             RecomputeGranularity recompute = RecomputeGranularity::kNone,
                             PairingMemo* memo = nullptr);

/// Time of one DAG run alone with its best single-strand schedule (0 for an empty DAG).
double single_strand_time_us(const LayerDag& dag, const Profile& profile, const CoRunModel& co_run);

/// The plan's record of a pairing: the ops of both strands and the block templates.
PlanPairing pairing_record(const LayerAnalysis& analysis);

}  // namespace dhelix
