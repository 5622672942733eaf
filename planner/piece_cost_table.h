#pragma once
// The memo of block costs by piece pair (downset_lattice.h numbers each strand's distinct
// differences of downsets, "pieces"): the pairing search asks for the same block from many
// state pairs and at many thresholds, and every answer must be the one simulation's P.
//
// Layout, and why. The search walks forward downsets in its outer loop and backward ones
// in its inner loop, so while one forward downset is expanded the requests fall into the
// few rows of its steps' forward pieces, each row holding every backward piece. A table
// stored row by row (forward piece major) keeps those rows in cache; a hash table spreads
// the same requests over its whole size. Measured on the Llama-3-70B H100 CP8 layer (1276
// x 6763 pieces): the hash table of 4M slots (64 MB) took 31 % of the search in cache
// misses. The dense table is allocated zeroed by the operating system (calloc of a large
// block maps zero pages on first touch), so rows never asked for cost no memory, and the
// entry encoding makes all-zero bits mean "nothing known yet".
//
// Entries (one double): sign bit set: P exact, the value negated (-0.0 is P = 0); sign bit
// clear: a lower bound on P proved by a simulation given up early (+0.0: none known). A
// request that cares about costs below give_up_us is answered by a bound at or above it;
// one that needs more simulates the block to the end the second time (so no block is
// simulated more than twice).
//
// Past kMaxDenseEntries (256 MB of address space) the table is a hash table of at most
// kMaxSparseSlots slots that, when full, replaces the entry in a key's home slot: a cache,
// whose misses only cost simulations again, never a different answer.

#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <vector>

#include "planner/downset_lattice.h"
#include "planner/segment_cost.h"

namespace dhelix {

/// Block costs by (forward piece, backward piece), each simulated on its first request.
class PieceCostTable {
 public:
  /// `max_dense_entries`: past it the hash table (tests pass 0 to exercise it).
  PieceCostTable(const BlockCostModel& model, const Lattice& forward, const Lattice& backward,
                 int64_t max_dense_entries = kMaxDenseEntries);
  /// P(forward piece, backward piece) in us when it is below give_up_us; otherwise P or a
  /// lower bound on it, either >= give_up_us.
  double cost_us(int64_t forward_piece, int64_t backward_piece,
                 double give_up_us = BlockCostModel::kNoGiveUp) {
    const uint64_t key = static_cast<uint64_t>(forward_piece * num_backward_ + backward_piece);
    if (dense_ != nullptr) {
      double& slot = dense_.get()[key];
      if (std::signbit(slot)) return -slot;
      if (slot >= give_up_us) return slot;
      // A block stopped early once is simulated to the end the second time.
      slot = simulate(forward_piece, backward_piece,
                      slot == 0 ? give_up_us : BlockCostModel::kNoGiveUp);
      return std::abs(slot);
    }
    return sparse_cost_us(key, forward_piece, backward_piece, give_up_us);
  }
  /// Blocks simulated so far (given up early or not; a block simulated again counts again).
  int64_t simulations() const { return simulations_; }
  /// Whether the table is dense (for tests of both layouts).
  bool dense() const { return dense_ != nullptr; }

  /// Most entries of the dense table (8 bytes each, committed only where touched). The
  /// Llama-3-70B H100 CP8 layer with full recompute needs between 16M and 32M: dense, its
  /// search slice (--cp 8 --tp 8 --mbs 1) takes 9.4 s of CPU instead of 13.1 s, at a peak
  /// of 169 MB instead of 155 MB for the whole dhelix-plan run.
  static constexpr int64_t kMaxDenseEntries = int64_t{1} << 25;

 private:
  /// An entry as above: -P, or a lower bound when given up.
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
  struct FreeDeleter {
    void operator()(double* p) const { std::free(p); }
  };
  std::unique_ptr<double, FreeDeleter> dense_;  ///< calloc'ed, forward piece major
  struct Entry {
    uint64_t key = ~uint64_t{0};  ///< all ones: empty slot
    double cost_us = 0;           ///< an entry as above
  };
  /// The hash table's largest size (64 MB); see the file comment.
  static constexpr size_t kMaxSparseSlots = size_t{1} << 22;
  std::vector<Entry> sparse_;
  int64_t stored_ = 0;  ///< entries in sparse_
  int64_t simulations_ = 0;
};

}  // namespace dhelix
