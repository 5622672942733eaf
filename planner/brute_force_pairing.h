#pragma once
// References for the pairing search (pairing_search.h), with the same block cost.
//
// brute_force_pairing: the definition itself. Every topological order of each strand x
// every cut of each order into contiguous segments x every alignment of the segments (the
// paper's three moves: forward segment alone, backward segment alone, both together),
// each plan's cost summed block by block, explicitly, with no sharing of sub-results
// between plans. Exponential in every direction: for graphs of at most 7 ops per strand.
//
// naive_order_pairing: the paper's method. Enumerate topological orders, then run the
// three-move DP over contiguous segmentations of each order pair. Exact, but it repeats
// the DP for every order pair: the benchmark's baseline.

#include <cstdint>
#include <vector>

#include "planner/segment_cost.h"
#include "planner/strand_graph.h"

namespace dhelix {

/// Up to max_count topological orders of the graph, in lexicographic order of indices.
std::vector<std::vector<int64_t>> enumerate_topological_orders(const StrandGraph& graph,
                                                               int64_t max_count);

/// Number of topological orders (linear extensions), by a DP over downsets; saturates at
/// INT64_MAX.
int64_t count_topological_orders(const StrandGraph& graph);

/// The brute-force optimum.
struct BruteForceResult {
  double total_time_us = 0;
  int64_t order_pairs = 0;  ///< topological order pairs enumerated
  int64_t plans = 0;        ///< complete (segmentation, alignment) plans costed
};

/// Largest strand the brute force accepts.
inline constexpr int64_t kBruteForceMaxOps = 7;

/// Every order x segmentation x alignment, segments of at most max_segment_ops ops each
/// (0 = no bound). DHELIX_CHECKs both graphs have at most kBruteForceMaxOps ops.
BruteForceResult brute_force_pairing(const BlockCostModel& model, int64_t max_segment_ops = 0);

/// Options of the naive reference.
struct NaiveOptions {
  int64_t max_segment_ops = 0;  ///< as PairingOptions::max_segment_ops
  /// Use only the first this many orders of each strand (0 = all): for graphs whose
  /// order count makes the full run impractical. The result is then only an upper bound.
  int64_t max_orders_per_strand = 0;
};

/// The naive reference's optimum and how much of the space it covered.
struct NaiveResult {
  double total_time_us = 0;
  int64_t forward_orders = 0;        ///< orders of the forward strand used
  int64_t backward_orders = 0;       ///< orders of the backward strand used
  int64_t forward_orders_total = 0;  ///< all orders (count_topological_orders)
  int64_t backward_orders_total = 0;
  bool complete = false;  ///< every order pair searched: total_time_us is the optimum
};

NaiveResult naive_order_pairing(const BlockCostModel& model, const NaiveOptions& options = {});

}  // namespace dhelix
