#pragma once
// The layer-level baselines DHelix is compared with (paper section 6.1), under the same
// block cost model as the exact search (segment_cost.h), so that differences come from
// scheduling alone:
//
//   Megatron-LM 1F1B  one strand at a time: the best single-strand schedule of the normal
//                     layer DAGs (search_single_strand; Megatron's CP ring overlap is in the
//                     DAG already). single_strand_schedule() below handles any DAG size.
//   Intra-batch       the same on the MegaScale-style chunked DAGs of
//                     lib/dag_builder_intra_batch.h.
//   Wavelet+          two strands co-scheduled without operator-level planning:
//                     round_robin_pairing() below.
//
// Round-robin, precisely. Each strand keeps its default order, the StrandGraph index order
// (the layer DAG's deterministic topological order: the order a framework issues the ops
// in). The two strands' ops are issued alternately, f0 b0 f1 b1 ..., into the rank's three
// streams, with no barrier at all, and every stream executes its ops in issue order (a
// CUDA stream is a FIFO: an op whose input is not ready holds up the ops queued behind it).
// The layer pair is one block simulated by BlockCostModel::simulate_in_order under the
// same co-run rates as the search. This is not one of the plans the exact search ranges
// over (its blocks start ready ops by priority, not in a fixed FIFO order), so the search
// is not better by construction; the tests show how it compares.
//
// Why this renders Wavelet (Wang et al., MLSys 2021) fairly. Wavelet's tick-tock schedule
// runs two micro-batches' waves side by side, each "executing its original sequential
// workflow without intentional operator reorganization" (DHelix paper, section 3.3); the
// DHelix authors "implement Wavelet's simple round-robin scheduling to interleave
// operators within DHelix" (section 6.1). Wavelet+ keeps DHelix's folding (no model
// replication), which is decided above this layer-level cost. What it lacks is what DHelix
// adds: choosing which ops meet and placing barriers so that a queued op never blocks the
// stream behind it. (An earlier rendering put a barrier after every op pair; it made
// Wavelet+ slower than Megatron, the opposite of the paper's measurements, because it
// also forbids each strand's own overlap.)
//
// Worked example: F = f0 (compute 10) -> f1 (local comm 8); B = b0 (local comm 6) -> b1
// (compute 12) -> b2 (compute 4); no slowdowns. Issue order f0 b0 f1 b1 b2. Compute queue
// f0 b1 b2, comm queue b0 f1. t=0: f0 (compute) and b0 (comm) start; b0 ends at 6, f1 is
// next on the comm queue but waits for f0; f0 ends at 10: f1 starts on comm (10-18) and b1
// on compute (10-22); b2 runs 22-26. Total 26 us, against 18 + 22 = 40 one strand after
// the other.

#include <cstdint>
#include <functional>
#include <vector>

#include "lib/layer_dag.h"
#include "planner/co_run_model.h"
#include "planner/pairing_memo.h"
#include "planner/pairing_search.h"
#include "planner/segment_cost.h"
#include "planner/strand_graph.h"

namespace dhelix {

/// Wavelet+'s plan of the model's two strands (see the file comment): one block holding
/// every op, simulated in round-robin issue order; forward_alone / backward_alone and
/// sequential_time_us from search_single_strand for reference. stats.block_simulations is
/// 1; the other stats are 0 (nothing is searched).
PairingResult round_robin_pairing(const BlockCostModel& model);

/// One DAG run alone (no second strand) with the best single-strand schedule, for DAGs of
/// any size. A StrandGraph holds at most kMaxStrandOps ops, and the chunked intra-batch
/// DAGs exceed that (tp = 8: 66 forward, 70 backward ops), so the DAG's topological order
/// is cut into pieces of at most kMaxStrandOps ops, each searched with
/// search_single_strand, times summed. Cuts are placed, in order of preference, at:
///  1. a separator: an op that every earlier op precedes and every later op follows (the
///     sum is then exactly the whole strand's optimum: no schedule can overlap ops on the
///     two sides, and list-scheduling priorities on either side shift by a constant);
///  2. an op that every earlier op precedes except sinks (weight-gradient GEMMs: the sum
///     is an achievable schedule in which those sinks stay on their side of the cut, an
///     upper bound on the optimum; Megatron runs wgrads in their own half-layer anyway);
///  3. failing both, after kMaxStrandOps ops (an upper bound as well).
/// The latest such cut within reach is taken. DAGs of at most kMaxStrandOps ops are one
/// piece: the result equals search_single_strand on from_layer_dag.
struct SingleStrandSchedule {
  std::vector<StrandGraph> pieces;                ///< in order; op ids as in the DAG
  std::vector<std::vector<PairingBlock>> blocks;  ///< per piece; masks of `strand`
  std::vector<double> piece_time_us;              ///< per piece: its blocks' sum
  double total_time_us = 0;                       ///< sum over the pieces
  bool exact = true;  ///< every cut was a separator (rule 1): the total is the optimum
};

/// The schedule above. `strand` only says in which slot of the BlockCostModel the pieces
/// sit (forward_ops or backward_ops of the blocks). Solo times as in from_layer_dag (a
/// negative time is an Error(kInvalidInput) naming the op).
SingleStrandSchedule single_strand_schedule(const LayerDag& dag,
                                            const std::function<double(const Op&)>& solo_time_us,
                                            const CoRunModel& co_run, Strand strand,
                                            const PairingOptions& options = {},
                                            PairingMemo* memo = nullptr);

}  // namespace dhelix
