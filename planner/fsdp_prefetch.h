#pragma once
// FSDP as the frameworks overlap it, for the baselines (Megatron-LM 1F1B, intra-batch and
// the schemes built on their strands): one-layer prefetch. PyTorch FSDP2 and Megatron-FSDP
// issue layer l+1's parameter all-gather while layer l computes (forward_prefetch /
// backward_prefetch), and layer l's gradient reduce-scatter runs while layer l-1's backward
// computes, each on a communication stream of its own. Steady state, one layer's strand
// then lasts as long as the longer of
//   * its work without FSDP, T0 (the best single-strand schedule of the layer DAG without
//     the FSDP ops: what the framework runs without FSDP), and
//   * the stream that carries FSDP's collectives: the layer's share of them, S (the forward:
//     one gather; the backward: one gather with reshard_after_forward, one reduce-scatter),
//     plus the layer's other ops on that stream, C (TP collectives when the DP group is as
//     local as the TP group; nothing when it crosses nodes and TP does not),
// so T = max(T0, C + S): FSDP hides min(S, T0 − C) and exposes T − T0. The layer DAGs put the
// collectives in the layer itself (lib/dag_builder_fsdp.cc), where one strand alone can hide
// none of them: the gather precedes every weight reader, the reduce-scatter follows the last
// weight gradient. DHelix's exact search hides them under the other strand instead (and,
// in its cross-layer scope, under the neighbouring layer of the same strand).
//
// Worked example (tests/planner/fsdp_prefetch_test.cc): a forward of T0 = 1000 us with
// 300 us of TP collectives on the DP group's stream and a 500 us gather: T = max(1000,
// 300 + 500) = 1000 us, all 500 us hidden. Its backward, T0 = 2000 us, 600 us of TP
// collectives, a 500 us gather and a 1000 us reduce-scatter: T = max(2000, 600 + 1500) =
// 2100 us, 1400 us hidden, 100 us exposed; fully exposed it would be 3500 us.
//
// The first layer of each chunk has nothing to prefetch behind; it is priced as the others
// (generous to the baselines: the gain stated over them is, if anything, understated).

#include <functional>

#include "lib/layer_dag.h"
#include "planner/pipeline_simulator.h"

namespace dhelix {

/// FSDP's collectives of one pass of a layer DAG and what else uses their stream.
struct FsdpPassCollectives {
  double fsdp_us = 0;         ///< S: solo times of the pass's FSDP gathers and reduce-scatter
  double same_stream_us = 0;  ///< C: solo times of the pass's other ops on their stream
};

/// S and C of `dag` (one pass, built with FSDP); zeros when it has no FSDP op.
FsdpPassCollectives fsdp_pass_collectives(const LayerDag& dag,
                                          const std::function<double(const Op&)>& solo_time_us);

/// True for the ops lib/dag_builder_fsdp.cc adds (ids fwd.fsdp_*, bwd.fsdp_*).
bool is_fsdp_op(const Op& op);

/// One strand with one-layer prefetch: T = max(T0, C + S) and the hidden and exposed parts of
/// S (see the file comment).
struct PrefetchedStrand {
  double time_us = 0;
  double hidden_us = 0;
  double exposed_us = 0;
};
PrefetchedStrand prefetched_strand(double without_fsdp_us, const FsdpPassCollectives& fsdp);

/// `plain` (the layer's strands alone without FSDP) with the prefetched FSDP collectives:
/// the strand times of prefetched_strand, their DP communication added to the forward and
/// backward breakdowns. The SI pair and backward_weight_us are left as they are.
LayerCosts with_fsdp_prefetch(LayerCosts plain, const FsdpPassCollectives& forward,
                              const FsdpPassCollectives& backward);

}  // namespace dhelix
