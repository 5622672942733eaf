#pragma once
// Pieces that cost the same in every block, found before any is simulated.
//
// Why. A block's simulation (segment_cost.h) reads, of each side's op set, only the ops'
// streams, solo times, the edges inside the set, the co-run rates between ops on
// different streams (ops of one stream never run together) and the ops' order by index
// (ready ops are scanned by index; ties go to the lower one). Two op sets of one strand
// that agree on all of these, op for op in index order, give bit-for-bit the same
// simulation beside any partner: same priorities, same choices, same floating-point
// operations in the same order. Layers built of repeated parts have many such sets: the
// CP ring's steps are one pattern cp times over, so a piece spanning ring steps 2-4 costs
// what the same piece over steps 3-5 costs. The layer shift of a window (LayerPeriods) is
// a special case. Numbering pieces by shape instead of by mask shares their memo entries
// and their simulations.
//
// Op classes. Ops u and v of one strand are alike when their streams and solo times are
// equal and, against every op w on another stream (either strand), rate(u, w) = rate(v, w)
// and rate(w, u) = rate(w, v), compared bit for bit. That is an equality of feature
// vectors, so an equivalence, and it makes the rate of a pair on different streams a
// function of the two classes: for u ~ u' and w ~ w', rate(u, w) = rate(u', w) = rate(u', w').
//
// A piece's shape: for each of its ops in index order, the op's class and the positions,
// within the piece, of its predecessors inside the piece.
//
// Worked example. F = a0 -> c0 -> a1 -> c1 (a: all-gather on the comm stream, 5 us; c:
// GEMM, 10 us; a0 ~ a1 and c0 ~ c1). Pieces {a0, c0} and {a1, c1} both have the shape
// (a, no predecessor), (c, after position 0): one id, one simulation per partner. {c0, a1}
// has the shape (c, -), (a, after 0): another id.

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "planner/segment_cost.h"
#include "planner/strand_graph.h"

namespace dhelix {

/// Class of each op of `strand` (index = op index), by the rule above; classes are
/// numbered by their first op.
std::vector<int32_t> op_classes(const BlockCostModel& model, Strand strand);

/// Numbers the op sets of one strand by shape.
class PieceShapes {
 public:
  PieceShapes(const BlockCostModel& model, Strand strand);
  /// The number of `piece`'s shape: the one given to the first piece of that shape, or
  /// `fresh` when it is the first.
  int32_t find_or_insert(OpMask piece, int32_t fresh);

 private:
  struct KeyHash {
    size_t operator()(const std::vector<uint64_t>& key) const;
  };
  const StrandGraph* graph_;
  std::vector<int32_t> class_;
  std::unordered_map<std::vector<uint64_t>, int32_t, KeyHash> ids_;
  std::vector<uint64_t> key_;  ///< scratch
};

}  // namespace dhelix
