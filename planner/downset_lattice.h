#pragma once
// The data the pairing search (pairing_search.h) walks: one strand's downsets, every move
// from a downset to a superset ("step"), and the distinct op sets those moves run
// ("pieces"), each prepared once for the block simulation (the memo of block costs by
// piece pair is piece_cost_table.h).
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
#include <cstdint>
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

/// The moves from every downset of `lattice` to a superset whose difference holds at most
/// `max_segment_ops` ops (0 = any), counted without storing them; cap + 1 once past `cap`.
int64_t count_lattice_steps(const BlockCostModel& model, const Lattice& lattice,
                            int64_t max_segment_ops, int64_t cap);

/// Adds the steps (within options.max_segment_ops) and their pieces. Throws
/// Error(kUnsupported) when the steps would exceed options.max_steps, before storing them.
void build_lattice_steps(const BlockCostModel& model, const PairingOptions& options,
                         Lattice* lattice);

}  // namespace dhelix
