#pragma once
// The exact pairing search: how to cut a forward strand and a backward strand into
// segments, and which segments to co-run, so that the two passes end as early as possible.
//
// The paper (section 4.2) enumerates topological orders of both DAGs, cuts each order pair
// into contiguous segments and runs a DP with three moves over segment indices:
//     T(i, j) = min(T(i-1, j) + P(i, 0), T(i, j-1) + P(0, j), T(i-1, j-1) + P(i, j)).
// We search the same space in one DP. A prefix of a topological order is a downset (a set
// of ops closed under predecessors), and a block's cost depends only on its two op sets
// (segment_cost.h), so a plan is nothing but a chain of downset pairs
//     ({}, {}) = (F0, B0) < (F1, B1) < ... < (Fn, Bn) = (all forward ops, all backward ops)
// with block k = (Fk \ Fk-1, Bk \ Bk-1), at least one side non-empty. Conversely every such
// chain is a segmentation of some order pair (list each difference in any topological
// order). So the optimum over orders x segmentations x alignments is
//     T(Df', Db') = min over Df <= Df', Db <= Db', (Df, Db) != (Df', Db') of
//                   T(Df, Db) + P(Df' \ Df, Db' \ Db),          T({}, {}) = 0,
// over pairs of downsets: the three moves are Df = Df' (backward alone), Db = Db'
// (forward alone) and both changing (a co-run block).
//
// Worked example. F = f0 (local comm, 10 us) -> f1 (compute, 10 us); B = b0 (compute,
// 10 us) -> b1 (local comm, 10 us); no slowdowns. Downsets: F: {}, {f0}, {f0,f1}; B: {},
// {b0}, {b0,b1}: nine states. Some values:
//     T({f0}, {})  = 10   (f0 alone)        T({}, {b0})      = 10
//     T({f0}, {b0}) = 10  (f0 on the comm stream beside b0 on the compute stream)
//     T({f0,f1}, {}) = 20                   T({}, {b0,b1})   = 20
//     T({f0,f1}, {b0,b1}) = min(T({f0},{b0}) + P({f1},{b1}) = 10 + 10,
//                               P(F, B) = 20 (the simulator itself pairs f0 with b0),
//                               T({f0,f1}, {}) + T-like backward alone = 20 + 20, ...) = 20
// against 40 for the strands one after the other. With slow-downs or a cross-strand
// conflict the barrier-separated plan and the single block differ, which the DP weighs.
//
// Speed. States are |downsets(F)| x |downsets(B)|; a state's successors are all pairs of
// supersets, so the plain DP simulates one block per comparable pair of states. Four
// exact prunings cut that down (docs/planner.md proves each):
//  1. a block costs at least the longest solo-time path inside either side (rates are
//     <= 1) and at least a bound from its solo work per stream that counts the slow-downs
//     the streams must suffer to overlap (co_run_bound.h; at least the busiest stream's
//     work);
//  2. what is left after a state costs at least the same bound of the remaining work and
//     the longest remaining path of either strand;
//  3. branch and bound: a transition whose value plus (1) plus (2) cannot beat the best
//     complete plan known (first the strands one after the other, then whatever the DP
//     reaches) is skipped, and so is one that cannot beat its target state's value;
//  4. the same two tests during the block's simulation, with the time simulated so far
//     plus (1) of the work left: the simulation stops as soon as they fail
//     (BlockCostModel::bounded_cost_us), and the memo keeps the lower bound it proved.
//  5. a work budget (not a pruning: it narrows the space): the DP weighs every pair of a
//     forward step and a backward step, |steps(F)| x |steps(B)| block pairs before pruning.
//     Most layers need a few million; a strand with many unordered ops needs far more
//     (Llama-3-70B, TP 8, CP 8, micro-batch 4, selective recompute: 1,501 x 173,390 = 2.6e8,
//     minutes of search). Past PairingOptions::max_block_pairs the search bounds the
//     segments to the largest of 24, 16, 12, 8, 6, 4, 3, 2, 1 ops (tighter than asked) that
//     brings the product under the budget, and is exact within that bound: the best plan
//     whose blocks hold at most that many ops of each strand, an achievable plan and so an
//     upper bound on the unbounded optimum (PairingResult::segment_bound says which). The
//     bound follows from counts alone, so a job gets the same plan on every machine. The
//     strands alone are then searched again as asked (linear in their moves), since
//     Megatron-LM's layer times come from them.
// Block costs are memoized by piece pair: each strand's distinct differences of downsets
// are numbered once (downset_lattice.h); in a window of identical layers a difference is
// first shifted down to the first layer (segment_cost.h, LayerPeriods), since a block
// shifted by whole layers costs exactly the same.

#include <cstdint>
#include <vector>

#include "planner/segment_cost.h"
#include "planner/strand_graph.h"

namespace dhelix {

/// Search options.
struct PairingOptions {
  /// Most ops of one strand in one block (forward side and backward side each); 0 = no bound.
  int64_t max_segment_ops = 0;
  /// Branch-and-bound pruning (exact; off only to measure what it saves).
  bool prune = true;
  /// Most downsets one strand may have, most moves from a downset to a superset (8 bytes
  /// each) per strand, and most states (12 bytes each); beyond, Error(kUnsupported) before
  /// the storage is allocated. The shipped examples need at most 403 downsets, 12,217
  /// moves and 22,165 states (the Llama-66B CP4 window).
  int64_t max_downsets = 1 << 20;
  int64_t max_steps = int64_t{1} << 22;
  int64_t max_states = int64_t{1} << 26;
  /// Most block pairs (forward steps x backward steps) the joint search weighs; past it the
  /// segments are bounded (5. in the file comment). 0 = no budget.
  int64_t max_block_pairs = int64_t{1} << 25;
  /// Launch interval of every block with ops of both strands, us (segment_cost.h); the
  /// callers that build the BlockCostModel pass it on (chunk_pairing.h).
  double paired_block_gap_us = 0;
};

/// One block of a plan: the op sets that co-run and end at one barrier.
struct PairingBlock {
  OpMask forward_ops = 0;
  OpMask backward_ops = 0;
  double start_us = 0;         ///< from the plan's start: the sum of the previous blocks' times
  double time_us = 0;          ///< P(forward_ops, backward_ops)
  BlockSimulation simulation;  ///< per-op times, relative to start_us
};

/// What the search did, for benchmarks and reports.
struct PairingStats {
  int64_t forward_downsets = 0;
  int64_t backward_downsets = 0;
  int64_t states = 0;                ///< forward_downsets x backward_downsets
  int64_t states_expanded = 0;       ///< states whose transitions were scanned
  int64_t transitions = 0;           ///< (state, superset state) pairs scanned
  int64_t transitions_pruned = 0;    ///< skipped by a lower bound
  int64_t transitions_given_up = 0;  ///< simulated (or memo) cost proved too high, pruning 4
  int64_t block_simulations = 0;     ///< distinct blocks simulated (memo misses)
};

/// The optimum and the strands' sequential schedule for comparison.
struct PairingResult {
  std::vector<PairingBlock> blocks;  ///< in execution order
  double total_time_us = 0;          ///< sum of the blocks' times: the optimum
  /// Best schedules of each strand alone (same segmentation freedom, same block model).
  std::vector<PairingBlock> forward_alone_blocks;
  std::vector<PairingBlock> backward_alone_blocks;
  double forward_alone_us = 0;
  double backward_alone_us = 0;
  double sequential_time_us = 0;  ///< forward_alone_us + backward_alone_us
  /// Most ops of one strand in one block that the search allowed: the options' bound, or a
  /// tighter one that the work budget chose (0 = unbounded).
  int64_t segment_bound = 0;
  PairingStats stats;
};

/// Sum of the blocks' times in microseconds: a plan's length, blocks running back to back.
double total_time_us(const std::vector<PairingBlock>& blocks);

/// Every downset of the graph (the empty set and the full set included), sorted by size,
/// then by mask value, so that a subset always comes before its supersets. Throws
/// Error(kUnsupported) when there are more than max_count.
std::vector<OpMask> enumerate_downsets(const StrandGraph& graph, int64_t max_count);

/// The exact optimum of the pairing DP over downset pairs for the model's two strands.
PairingResult search_pairing(const BlockCostModel& model, const PairingOptions& options = {});

/// Best schedule of one strand alone: the DP over its downsets with blocks of that strand
/// only. Blocks' masks of the other strand are 0.
std::vector<PairingBlock> search_single_strand(const BlockCostModel& model, Strand strand,
                                               const PairingOptions& options = {});

/// Re-simulates a plan's blocks: their times' sum (tests check it equals total_time_us).
double resimulate_total_us(const BlockCostModel& model, const std::vector<PairingBlock>& blocks);

}  // namespace dhelix
