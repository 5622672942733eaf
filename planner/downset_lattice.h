#pragma once
// The data the pairing search (pairing_search.h) walks: one strand's downsets, every move
// from a downset to a superset ("step"), and the distinct op sets those moves run
// ("pieces"), each prepared once for the block simulation; plus the memo of block costs
// by piece pair.
//
// Why pieces. A block is a pair of differences of downsets. The same difference arises
// from many downset pairs (a movable op outside it may or may not be done), and under the
// shift symmetry of a window of identical layers (segment_cost.h, LayerPeriods) a
// difference in layer 2 costs what the same difference in layer 0 costs. Numbering the
// distinct differences, shifted down to their representative, turns the memo into a
// dense table indexed by two small integers and lets each side's priorities and ready
// sets be computed once instead of once per block.
//
// Worked example. F = f0 -> f1, f0 -> f2 (f1 and f2 independent). Downsets, by size then
// mask: {} {f0} {f0,f1} {f0,f2} {f0,f1,f2}. Steps from {f0}: itself (piece {}), {f0,f1}
// (piece {f1}), {f0,f2} (piece {f2}), {f0,f1,f2} (piece {f1,f2}); from {f0,f1}: itself,
// {f0,f1,f2} (piece {f2}, shared with the step {f0} -> {f0,f2}).
//
// Size. Downsets, steps and states are exponential in the strand's width (the most ops
// with no order between them): 16 independent ops have 65536 downsets and 3^16 = 43
// million steps. Every count is checked against PairingOptions' limits while it grows,
// before the storage it sizes is allocated, and refused with Error(kUnsupported).

#include <array>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "planner/segment_cost.h"
#include "planner/strand_graph.h"

namespace dhelix {

struct PairingOptions;

/// Streams: one solo-work figure per StreamClass.
inline constexpr int kNumStreamClasses = 3;

/// One move of one strand from a downset to a superset (itself included: the empty piece).
struct LatticeStep {
  int32_t target = 0;  ///< index of the superset downset
  int32_t piece = 0;   ///< index of the difference's representative in Lattice::pieces
};

/// One strand's downsets with what the search and its bounds need.
struct Lattice {
  Strand strand = Strand::kForward;
  std::vector<OpMask> downsets;  ///< by size, then mask: subsets before supersets
  std::vector<std::array<double, kNumStreamClasses>> load_us;  ///< solo work per stream inside
  std::vector<double> remaining_path_us;  ///< longest path through ops outside the downset
  /// Steps of downset i: steps[step_begin[i] .. step_begin[i + 1]), by target (itself first).
  std::vector<int64_t> step_begin;
  std::vector<LatticeStep> steps;
  /// Pieces: distinct differences (shifted to their representative), with their longest
  /// solo-time path. pieces[0] is the empty set. (Their block sides are prepared by
  /// PieceCostTable when first simulated: most pieces of a wide strand never are.)
  std::vector<OpMask> pieces;
  std::vector<double> piece_path_us;

  int64_t size() const { return static_cast<int64_t>(downsets.size()); }
  int64_t empty_piece() const { return 0; }
};

/// The downsets of `strand`'s graph only (load, remaining path; no steps yet): cheap, so
/// that the joint state count can be checked before the steps are built. Throws
/// Error(kUnsupported) past options.max_downsets.
Lattice lattice_downsets(const BlockCostModel& model, Strand strand, const PairingOptions& options);

/// Adds the steps (within options.max_segment_ops) and their pieces. Throws
/// Error(kUnsupported) when the steps would exceed options.max_steps, before storing them.
void build_lattice_steps(const BlockCostModel& model, const PairingOptions& options,
                         Lattice* lattice);

/// Block costs by (forward piece, backward piece), each simulated on its first request:
/// a dense table while the two piece counts' product is small, else a hash table of at
/// most kMaxSparseSlots slots. A request may say below which cost it cares
/// (BlockCostModel::bounded_cost_us); a simulation given up early leaves a lower bound in
/// the table, which answers later requests that care less; one that cares more simulates
/// the block to the end (so no block is simulated more than twice: windows ask for one
/// block from many states at many thresholds). Entries: P >= 0 (+0.0 included) exact, -x a lower
/// bound x (-0.0: none known yet), told apart by the sign bit.
class PieceCostTable {
 public:
  PieceCostTable(const BlockCostModel& model, const Lattice& forward, const Lattice& backward);
  /// P(forward piece, backward piece) in us when it is below give_up_us; otherwise P or a
  /// lower bound on it, either >= give_up_us.
  double cost_us(int64_t forward_piece, int64_t backward_piece,
                 double give_up_us = BlockCostModel::kNoGiveUp) {
    const uint64_t key = static_cast<uint64_t>(forward_piece * num_backward_ + backward_piece);
    if (!dense_.empty()) {
      double& slot = dense_[key];
      if (!std::signbit(slot) || -slot >= give_up_us) return std::abs(slot);
      // A block stopped early once is simulated to the end the second time.
      slot = simulate(forward_piece, backward_piece,
                      slot == 0 ? give_up_us : BlockCostModel::kNoGiveUp);
      return std::abs(slot);
    }
    return sparse_cost_us(key, forward_piece, backward_piece, give_up_us);
  }
  /// Blocks simulated so far (given up early or not; a block simulated again counts again).
  int64_t simulations() const { return simulations_; }

 private:
  /// An entry: P, or -(lower bound) when given up.
  double simulate(int64_t forward_piece, int64_t backward_piece, double give_up_us);
  /// The prepared side of a piece of lattice k (0 forward, 1 backward), prepared once.
  const BlockSide& side(int k, int64_t piece);
  double sparse_cost_us(uint64_t key, int64_t forward_piece, int64_t backward_piece,
                        double give_up_us);
  void grow();

  const BlockCostModel* model_;
  const Lattice* forward_;
  const Lattice* backward_;
  int64_t num_backward_ = 0;
  /// Per lattice: each piece's side (priority null: not prepared yet) and the priority
  /// arrays the prepared ones point into.
  std::array<std::vector<BlockSide>, 2> sides_;
  std::array<std::vector<std::unique_ptr<double[]>>, 2> priorities_;
  std::vector<double> dense_;  ///< entries as above
  struct Entry {
    uint64_t key = ~uint64_t{0};  ///< all ones: empty slot
    double cost_us = 0;           ///< an entry as above
  };
  /// The hash table's largest size (64 MB): the memo is a cache, and past this size a
  /// miss replaces the entry in its key's home slot instead of taking more memory (the
  /// CP8 64k layer: 1.4 % more simulations than an unbounded table, 106 MB instead of
  /// 400 MB in all).
  static constexpr size_t kMaxSparseSlots = size_t{1} << 22;
  std::vector<Entry> sparse_;
  int64_t stored_ = 0;  ///< entries in sparse_
  int64_t simulations_ = 0;
};

}  // namespace dhelix
