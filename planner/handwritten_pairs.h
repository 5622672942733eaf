#pragma once
// The overlapped forward-backward pair as people write it by hand, priced with the same
// block cost model as the exact pairing search (segment_cost.h), so that the two differ in
// the order alone. Two baselines use it (docs/pipeline.md, "The baselines as people run
// them"): dualpipev-handwritten (DeepSeek-V3 technical report, section 3.2.1 and Figure 4)
// and megatron-a2a-overlap (Megatron-Core's combined 1F1B, --overlap-moe-expert-parallel-comm,
// TransformerLayerSchedulePlan.run in megatron/core/models/common/model_chunk_schedule_plan.py).
//
// Nodes. Both split a MoE layer at its EP all-to-alls into four nodes per strand. Forward:
// attention (everything up to the dispatch: norms, attention, its TP collectives, router,
// permute), dispatch (the all-to-all), MLP (the experts and whatever else runs between the
// all-to-alls), combine (the all-to-all and what follows it: unpermute, residual add).
// Backward, in its own order: combine (the residual and unpermute gradients and the
// all-to-all), MLP (the experts' input gradients; their weight gradients W apart),
// dispatch (the all-to-all), attention (the rest, weight gradients W apart; the router's
// backward too, as Megatron's attention node holds the router). An op's node follows from
// the DAG alone (node_assignment below): forward ops as soon as their inputs allow,
// backward ops as late as their consumers allow, weight gradients with the node of the
// work they follow. TP, SP and CP collectives stay inside their nodes, where the strand
// issues them: they are not reordered, and hide only behind what the node itself overlaps.
//
// Phases. The pair runs as four blocks with a barrier between them (Figure 4 draws them;
// Megatron joins its nodes by CUDA events, which the block model renders as barriers at
// the same places). Each block puts one strand's compute node beside the other's
// all-to-all:
//
//     block  forward (micro-batch i+1)   backward (micro-batch i)
//       1    attention                   combine
//       2    dispatch                    MLP B           (+ MLP W: megatron-a2a-overlap)
//       3    MLP                         dispatch + MLP W (kDeepSeekV3, and Megatron's
//                                                          --delay-wgrad-compute)
//       4    combine                     attention B + attention W
//
// DeepSeek's Figure 4 runs MLP(B), MLP(W), MLP(F) on the compute SMs while DISPATCH(F)
// then DISPATCH(B) run on the communication SMs: the backward's dispatch follows the input
// gradient and hides under the weight gradient and the forward MLP. Megatron's default
// runs the expert weight gradients inside mlp.backward (block 2); --delay-wgrad-compute
// moves them behind the next all-to-all (block 3), which is DeepSeek's order. Within a
// block the ops start as the block model's list scheduling starts them (the same rule the
// search's blocks follow), so the fixed chain of blocks is one of the plans the exact
// search ranges over: the search's optimum is never worse (tests/planner/
// handwritten_pairs_test.cc checks it on several DAGs).
//
// Worked example (the test's hand-built MoE layer, no slow-downs, no launch interval).
// Forward: f.attn (compute 10) -> f.rs (TP reduce-scatter, local comm 4) -> f.dispatch (EP
// all-to-all, cross comm 6) -> f.mlp (compute 8) -> f.combine (cross comm 6): 34 alone.
// Backward: b.combine (cross 6) -> b.mlp (compute 8) -> {b.mlp_w (compute 4, a weight
// gradient), b.dispatch (cross 10) -> b.attn (compute 12) -> b.rs (TP reduce-scatter,
// local 4)}: 40 alone (b.mlp_w runs beside b.dispatch). Nodes: forward attention {f.attn, f.rs},
// dispatch, MLP, combine one op each; backward combine {b.combine}, MLP {b.mlp | W b.mlp_w},
// dispatch {b.dispatch}, attention {b.attn, b.rs}. DeepSeek's blocks:
//   1  f.attn, f.rs | b.combine: f.attn 0-10 beside b.combine 0-6, f.rs 10-14        14
//   2  f.dispatch | b.mlp: 0-6 beside 0-8                                              8
//   3  f.mlp | b.dispatch, b.mlp_w: f.mlp 0-8 then b.mlp_w 8-12 on compute,
//      b.dispatch 0-10 beside them                                                    12
//   4  f.combine | b.attn, b.rs: f.combine 0-6 beside b.attn 0-12, b.rs 12-16         16
// Total 50 against 34 + 40 = 74 one strand after the other: every all-to-all runs beside
// compute (28 us hidden), while the TP reduce-scatters (block 1 at 10-14, block 4 at
// 12-16) have nothing beside them, as alone: 8 us exposed. Megatron's default order puts
// b.mlp_w in block 2 (12) and leaves block 3 to f.mlp beside b.dispatch (10, 2 us of the
// dispatch exposed): 14 + 12 + 10 + 16 = 52; with --delay-wgrad-compute it is DeepSeek's 50.
// The exact search finds 46.

#include <cstdint>
#include <vector>

#include "lib/layer_dag.h"
#include "planner/pairing_search.h"
#include "planner/segment_cost.h"
#include "planner/strand_graph.h"

namespace dhelix {

/// Which hand-written pair order.
enum class HandwrittenOrder {
  kDeepSeekV3,           ///< Figure 4: expert W beside the backward dispatch
  kMegatronA2a,          ///< combined 1F1B, expert W inside mlp.backward
  kMegatronA2aDelayedW,  ///< combined 1F1B with --delay-wgrad-compute
};

/// A layer's node of an op (see the file comment). Forward nodes run attention, dispatch,
/// MLP, combine; backward nodes combine, MLP, dispatch, attention.
enum class LayerNode { kAttention, kDispatch, kMlp, kCombine };

/// Every op's node, per strand (index = the op's index in its StrandGraph and LayerDag),
/// whether a backward op is weight-gradient work, and whether the layer has EP all-to-alls
/// at all (without them there is nothing the orders overlap).
struct NodeAssignment {
  std::vector<LayerNode> forward;
  std::vector<LayerNode> backward;
  std::vector<bool> backward_weight;
  bool has_all_to_all = false;
};

/// The node of every op of a layer's DAGs: the EP all-to-alls "fwd.dispatch_a2a",
/// "fwd.combine_a2a", "bwd.combine_a2a" and "bwd.dispatch_a2a" (lib/dag_builder_moe.cc)
/// fix the dispatch and combine nodes, the rest follows from the edges (file comment).
/// Copies a recompute puts in the backward (bwd.recompute.*) are ordinary ops there.
NodeAssignment node_assignment(const LayerDag& forward, const LayerDag& backward);

/// The same from graphs whose all-to-alls are named by index (tests build such graphs by
/// hand): `*_dispatch` and `*_combine` are op indices, -1 where the strand has none;
/// `backward_weight` marks the weight-gradient ops. Both strands need both indices or neither.
NodeAssignment node_assignment(const StrandGraph& forward, const StrandGraph& backward,
                               int64_t forward_dispatch, int64_t forward_combine,
                               int64_t backward_combine, int64_t backward_dispatch,
                               const std::vector<bool>& backward_weight);

/// The pair's blocks in `order` (empty blocks left out) with their costs from `model`
/// (its strands those `nodes` describe), and their sum: a PairingResult whose blocks and
/// total_time_us are the order's (the forward_alone / backward_alone fields stay 0).
/// Without all-to-alls the result is the forward alone, then the backward alone, each one
/// block: nothing is reordered.
PairingResult handwritten_pairing(const BlockCostModel& model, const NodeAssignment& nodes,
                                  HandwrittenOrder order);

}  // namespace dhelix
