#pragma once
// FSDP under DHelix with prefetch across SI blocks. The layer DAGs put each layer's FSDP
// collectives inside the layer (lib/dag_builder_fsdp.cc): the gather before the first
// weight reader, the reduce-scatter after the last weight gradient. Searched that way, an SI
// block pairing layer l's forward (micro-batch a) with layer l's backward (micro-batch b)
// queues both strands' gathers on the one DP link at the block's start, where only the
// other strand's compute covers them, while the frameworks (planner/fsdp_prefetch.h) hide
// layer l+1's gather under all of layer l's compute. So dhelix moves them out of the block:
//
//   * the pairing search runs on the layer DAGs without FSDP's ops (the plain DAGs of the
//     same job), so that what it hides of TP and CP stays as it is without FSDP;
//   * during SI block l (the layer pair l) the DP stream carries the next block's gathers
//     (both strands' next layers: fwd.fsdp_gather of the forward strand's next layer,
//     bwd.fsdp_gather of the backward strand's next layer with reshard_after_forward), and
//     a backward's reduce-scatter, issued once its gradients are complete, runs during the
//     blocks after it; prefetch depth 1. The plan carries this: the pairing's op records
//     leave FSDP's ops out and the lowering issues them by that rule, beside the blocks
//     (lib/plan/rank_program.h), so no block barrier waits for them;
//   * memory: one more block's gathered weights in flight, the 2·strands·P of
//     planner/memory_model.h's FsdpMemory (the layer pair running, 2P, and the pair
//     prefetched, 2P, on the folded shapes), so the memory model holds them already.
//
// Price, per SI block (steady state: every block gathers what the next one reads and
// reduce-scatters what the previous one produced, one block's worth of each):
//
//   T = max(P0 + h·σ, C + S),   S = S_f + S_b,   C = C_f + C_b,   h = min(S, P0 − C)
//
// where P0 is the pairing search's SI block of the plain DAGs (its TP and CP hiding and
// co-run slowdowns included), S_f, S_b the FSDP collectives of the forward and backward
// pass (fsdp_pass_collectives: the forward's gather; the backward's gather and
// reduce-scatter), C_f, C_b the passes' other ops on the FSDP stream (TP collectives when the
// DP group is as local as the TP group; nothing when only DP crosses nodes), and σ the
// co-run model's compute lost per us of FSDP collective beside both strands' compute
// (fsdp_pair_slowdown, fsdp_compute_slowdown's weighting over both strands). This is
// prefetched_strand of planner/fsdp_prefetch.h applied to the pair: the same rule as the
// baselines', one block instead of one strand's layer. A chunk of n layer pairs searched in
// the cross-layer scope (P0 the chunk's time) is priced the same with n·S and n·C: each
// layer's prefetch slot is its share of the chunk's compute. A strand alone (warm-up,
// cool-down) is priced as the baselines price it, prefetched_strand of its pass.
//
// Worked table (tests/planner/fsdp_si_prefetch_test.cc). A layer of T0_f = 1000 us forward,
// T0_b = 2000 us backward alone, paired P0 = 2400 us (the pair hides TP); the baseline is
// the two strands one after the other, each prefetching one layer ahead:
//
//   case            S_f   S_b (g + r-s)  C_f+C_b  σ    baseline, f + b    dhelix
//   compute-bound   500   500 + 1000     0        0    1000 + 2000        max(2400, 2000)
//                                                      = 3000             = 2400
//   DP-bound        1000  1000 + 2000    0        0    1000 + 3000        max(2400, 4000)
//                                                      = 4000             = 4000
//   TP on DP link   500   500 + 1000     300+600  0    1000 + 2100        max(2400, 2900)
//                                                      = 3100             = 2900
//   slowed kernels  500   500 + 1000     0        0.1  1050 + 2150        h = 2000:
//                                                      = 3200             max(2600, 2000) = 2600
//
// Since max(a, b) + max(c, d) ≥ max(a + c, b + d) and P0 ≤ T0_f + T0_b, without slowdown
// (σ = 0) the block is never slower than the baseline's two strands: both are bound by the
// DP link when S exceeds the compute (the second row), and dhelix gains what its pairing
// hides otherwise. With σ > 0 its kernels may lose more than the baseline's (h can exceed
// the baseline's per-strand h_f + h_b, which each strand's own compute caps).
// The first block of a task is priced as the others (as the baselines' first layer is): the
// lowering issues its gathers in the stage's previous SI block task, each strand's with that
// strand's last layer there (lib/plan/rank_program.h); after a forward or backward
// task alone (warm-up), they are issued before the block and the price is optimistic by at
// most one pair's gathers.

#include "planner/fsdp_prefetch.h"

namespace dhelix {

/// σ of an SI block: each compute op of both strands weighted by its solo time, each FSDP
/// collective of both strands by its share of S (fsdp_compute_slowdown over the two graphs,
/// one layer each, FSDP ops marked fsdp_collective); 0 without FSDP ops or compute.
double fsdp_pair_slowdown(const StrandGraph& forward, const StrandGraph& backward,
                          const CoRunModel& co_run);

/// The FSDP collectives a chunk of `layer_pairs` SI blocks carries on its DP stream: both
/// passes' S and C summed, times `layer_pairs`, with the slowdown `slowdown`.
FsdpPassCollectives si_block_collectives(const FsdpPassCollectives& forward,
                                         const FsdpPassCollectives& backward, double slowdown,
                                         int64_t layer_pairs = 1);

/// One SI block (or chunk) of the plain pairing, `paired_without_fsdp_us`, with the next
/// block's gathers and this block's reduce-scatter on the DP stream: T = max(P0 + h·σ, C + S)
/// and the hidden and exposed parts of S (see the file comment).
PrefetchedStrand prefetched_si_block(double paired_without_fsdp_us,
                                     const FsdpPassCollectives& collectives);

}  // namespace dhelix
