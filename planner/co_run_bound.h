#pragma once
// A lower bound on a block's time from its solo work per stream that counts slow-downs.
//
// The plain bound (docs/planner.md, pruning 1) says a block lasts at least its busiest
// stream's solo work. It ignores that work on two streams at once is slowed: a GEMM
// beside an all-gather progresses at 0.88, so either the all-gather's time is exposed or
// the GEMM gets longer. The search's choices differ by about 1 % while slow-downs are
// 5-12 % of a block, so the plain bound prunes little. This one keeps the slow-downs.
//
// The argument. Let rho(s, S) be an upper bound on the rate of any op of stream s while
// the streams S (s in S) are busy: the product over o in S \ {s} of R(s, o), R(s, o) the
// largest co-run rate of an op of stream s beside an op of stream o over every op pair of
// both strands (ops of zero solo time left out: they run for no time). In a block of time
// T let y_S be the time during which exactly the streams S are busy; then
//     T >= sum over S of y_S,        W_s <= sum over S containing s of rho(s, S) y_S
// (W_s the block's solo work on stream s). For any lambda >= 0 with
//     sum over s in S of lambda_s rho(s, S) <= 1      for every non-empty S,
// weak LP duality gives T >= sum_s lambda_s W_s. The best such bound is the maximum over
// the vertices of that polytope, which depend on the rates only: they are enumerated once
// (`CoRunLoadBound`), and a block's bound is a few dot products. The unit vectors are
// vertices, so the bound is never below the plain one.
//
// Worked case: two streams, R(compute, comm) = 0.88, R(comm, compute) = 0.90. Vertices
// (1, 0), (0, 1) and lambda = (1, (1 - 0.88) / 0.90) = (1, 0.1333): a block of 100 us of
// compute and 30 us of comm lasts at least 100 + 0.1333 * 30 = 104 us (hiding the comm
// costs the GEMM 12 % of the 33.3 us they overlap; exposing it costs its 30 us).
//
// The same bound holds for the rest of a plan (the sum over its blocks of each block's
// bound is at least the bound of the summed work, by the same lambda), so the search uses
// it for pruning 2 too; it is consistent (bound(rest before a block) <= bound(block) +
// bound(rest after it)).

#include <algorithm>
#include <array>
#include <vector>

namespace dhelix {

/// The lower bound above for one set of rates (BlockCostModel builds one from its ops).
class CoRunLoadBound {
 public:
  /// No slow-downs known: the plain bound (the largest load).
  CoRunLoadBound();
  /// From the stream pair maxima R[s][o] (BlockCostModel::stream_pair_max_rates), each in
  /// [0, 1]; R[s][s] is ignored.
  explicit CoRunLoadBound(const std::array<std::array<double, 3>, 3>& stream_pair_rate);

  /// A lower bound in us on the time of any block (or sequence of blocks) whose solo work
  /// per StreamClass is `load_us`; >= the largest entry.
  double bound_us(const std::array<double, 3>& load_us) const {
    // Two vertices per step (the simulation asks after every event: this was 15 % of the
    // search). Each lane computes what the scalar loop did, (l0 x0 + l1 x1) + l2 x2, and
    // the maximum of the same values does not depend on the order it is taken in; the
    // final max with +0.0 returns +0.0 when no product is positive, as the loop did.
    const Lanes x0 = {load_us[0], load_us[0]};
    const Lanes x1 = {load_us[1], load_us[1]};
    const Lanes x2 = {load_us[2], load_us[2]};
    Lanes best = lanes_[0][0] * x0 + lanes_[0][1] * x1 + lanes_[0][2] * x2;
    for (int p = 1; p < pairs_; ++p) {
      const Lanes v = lanes_[p][0] * x0 + lanes_[p][1] * x1 + lanes_[p][2] * x2;
      best = v > best ? v : best;
    }
    return std::max(0.0, std::max(best[0], best[1]));
  }
  /// The dual vertices used, for tests and docs.
  std::vector<std::array<double, 3>> vertices() const {
    return {vertices_.begin(), vertices_.begin() + count_};
  }

 private:
  /// At most 8 vertices are kept: the polytope has 10 facets in 3 dimensions, and in
  /// practice 3-5 vertices are not dominated. Extra ones are dropped (a weaker bound).
  static constexpr int kMaxVertices = 8;
  std::array<std::array<double, 3>, kMaxVertices> vertices_{};
  int count_ = 0;
  /// The vertices two by two, by coordinate: lanes_[p][s] = (vertex 2p, vertex 2p + 1)'s
  /// entry s; a missing odd vertex is zero (its product, +-0, never exceeds the result).
  using Lanes = double __attribute__((vector_size(16)));
  std::array<std::array<Lanes, 3>, kMaxVertices / 2> lanes_{};
  int pairs_ = 0;
  void fill_lanes();
};

}  // namespace dhelix
