#pragma once
// The cost P(F, B) of a block: forward ops F (a set of the forward strand's ops) and
// backward ops B (a set of the backward strand's ops) co-run from a common start until a
// barrier after the last of them ends. P(F, {}) and P({}, B) are a strand alone.
//
// The model (docs/planner.md has the full statement):
// - Three resources, one per StreamClass. A stream runs at most one op at a time, so two
//   compute ops (of either strand) serialise, two ops of the same comm stream serialise,
//   and ops of different streams overlap, within one strand too ("self-overlap").
// - An op may start when its predecessors inside the block have finished; predecessors
//   outside the block belong to earlier blocks (the search only builds blocks whose op
//   sets are differences of downsets, so they have).
// - List scheduling: whenever a stream is idle it starts its ready op of highest
//   priority: the longest solo-time path from the op to the block's end (ops of both
//   strands compete on one list), ties to the backward strand (its path is usually the
//   critical one), then to the lower index. Starting an op never waits on purpose.
// - Rates: while several ops run, op a progresses at the product over the other running
//   ops b of CoRunModel::rate(a, b) (1 when alone); rates are constant between events
//   (a start or a finish), so the simulation jumps from event to event exactly.
// - Launch interval (optional, planner/block_launch.h): in a block holding ops of BOTH
//   strands (a paired segment) a host-synchronised runtime launches one op every
//   g = `paired_block_gap_us` after the barrier, the compute ops first: the k-th compute op
//   to run (from 0) starts no earlier than g · (k + 1), the j-th collective to start no
//   earlier than g · (1 + the block's compute ops + j). 0 (the default) for runtimes that
//   enqueue every block ahead of time.
// Consequence the search relies on: P depends on the two op SETS only, not on any order
// given for them, so every segmentation of every topological order is a chain of
// downsets and a DP over downset pairs covers them all.

#include <array>
#include <cstdint>
#include <limits>
#include <vector>

#include "planner/co_run_bound.h"
#include "planner/co_run_model.h"
#include "planner/strand_graph.h"

namespace dhelix {

/// When one op of a block ran, relative to the block's start.
struct OpTiming {
  Strand strand = Strand::kForward;
  int64_t op = 0;        ///< index in its strand's graph
  double start_us = 0;   ///< from the block's start
  double finish_us = 0;  ///< from the block's start, >= start_us
};

/// A simulated block: its time (the last finish, 0 for an empty block) and per-op timings
/// in the order the ops started (ties: backward first, then index).
struct BlockSimulation {
  double time_us = 0;
  std::vector<OpTiming> ops;
};

/// One strand's side of a block, prepared once per op set and shared by every block that
/// holds that set (the search meets each set in many blocks): the ops, those of them ready
/// at the block's start per stream (no predecessor inside the set), and a pointer to each
/// op's list-scheduling priority, indexed by the op's index in its strand (entries outside
/// `ops` are never read).
struct BlockSide {
  OpMask ops = 0;
  std::array<OpMask, 3> ready{};    ///< by StreamClass
  std::array<double, 3> load_us{};  ///< solo work per StreamClass, in us
  const double* priority = nullptr;
};

/// Shift symmetry of a window of identical layers (chunk_pairing.h): shifting a strand's op
/// set by whole layers (period = ops per layer) leaves every block cost unchanged, because
/// the ops, their edges and their rates repeat layer after layer. BlockCostModel verifies
/// the repetition exactly before it uses it; 0 = no symmetry.
struct LayerPeriods {
  int64_t forward_ops = 0;   ///< ops per forward layer
  int64_t backward_ops = 0;  ///< ops per backward layer
};

/// Binds both strands and a co-run model; precomputes the pairwise rate matrix and flat
/// per-op arrays once so that a block costs one allocation-free event simulation.
class BlockCostModel {
 public:
  /// The graphs and the model must outlive this object. Rates are read once, here;
  /// DHELIX_CHECKs that each lies in (0, 1] (then clamps to kMinCoRunRate) and that
  /// `paired_block_gap_us` (the launch interval of a paired block, see above) is >= 0.
  BlockCostModel(const StrandGraph& forward, const StrandGraph& backward, const CoRunModel& model,
                 LayerPeriods periods = {}, double paired_block_gap_us = 0);

  /// The launch interval every block with ops of both strands starts with, us.
  double paired_block_gap_us() const { return paired_gap_us_; }

  const StrandGraph& forward() const { return *forward_; }
  const StrandGraph& backward() const { return *backward_; }
  const StrandGraph& graph(Strand strand) const;

  /// P(F, B) in us. Only the sets matter (see above). F and B need not be downsets: a
  /// predecessor outside the block counts as finished before it.
  double cost_us(OpMask forward_ops, OpMask backward_ops) const;
  /// The same cost from prepared sides (prepare_side).
  double cost_us(const BlockSide& forward, const BlockSide& backward) const;
  /// give_up_us for "simulate to the end".
  static constexpr double kNoGiveUp = std::numeric_limits<double>::infinity();
  /// What the search calls: P, or, as soon as the simulation proves P >= give_up_us (the
  /// time simulated so far plus load_bound() of the work left), that lower bound instead,
  /// with `*exact` false. Either way a result >= give_up_us means P >= give_up_us (up to
  /// rounding, relative 1e-12), and a result below it is P itself.
  double bounded_cost_us(const BlockSide& forward, const BlockSide& backward, double give_up_us,
                         bool* exact) const;
  /// The slow-down aware lower bound on any block's time from its loads (co_run_bound.h),
  /// built from this model's rates.
  const CoRunLoadBound& load_bound() const { return load_bound_; }
  /// The side of op set `ops` of `strand`; writes the priorities of its ops to
  /// `priority[i]` (an array of graph(strand).size() doubles that must outlive the side).
  BlockSide prepare_side(Strand strand, OpMask ops, double* priority) const;
  /// The representative of `ops` under the verified layer symmetry: the set shifted down
  /// by as many whole layers as its lowest op allows (blocks of equal representatives, on
  /// both sides, cost exactly the same). `ops` itself without symmetry.
  OpMask canonical(Strand strand, OpMask ops) const {
    const int64_t period = period_[strand == Strand::kForward ? 0 : 1];
    if (period == 0 || ops == 0) return ops;
    return ops >> (__builtin_ctzll(ops) / period * period);
  }
  /// The same simulation, with every op's start and finish.
  BlockSimulation simulate(OpMask forward_ops, OpMask backward_ops) const;
  /// The block run as a framework without a planner runs it: every stream executes its
  /// ops strictly in `issue_rank` order (a CUDA stream is a FIFO: an op whose inputs are
  /// not ready holds up the ops queued behind it), instead of picking its best ready op.
  /// `issue_rank[u]` ranks combined op u (forward op i is u = i, backward op j is
  /// u = forward().size() + j); ranks must respect each strand's dependencies. Used for
  /// baselines (layer_baselines.h); the search never uses it.
  BlockSimulation simulate_in_order(OpMask forward_ops, OpMask backward_ops,
                                    const std::vector<int64_t>& issue_rank) const;
  /// Rate of op a (of strand sa) while op b (of strand sb) runs, as read from the model.
  double pair_rate(Strand sa, int64_t a, Strand sb, int64_t b) const;
  /// R[s][o]: the largest rate of an op of stream s beside an op of stream o != s, over
  /// every pair of ops of both strands with non-zero solo times (0 where there is none);
  /// an upper bound on any op's rate in any block (co_run_bound.h). R[s][s] = 1.
  std::array<std::array<double, 3>, 3> stream_pair_max_rates() const;

 private:
  /// The event simulation; `issue_rank` null: list scheduling by priority, else in order.
  /// Stops early (`*exact` false) once P >= give_up_us is proven (see bounded_cost_us).
  double run(const BlockSide& forward, const BlockSide& backward, const int64_t* issue_rank,
             BlockSimulation* out, double give_up_us = kNoGiveUp, bool* exact = nullptr) const;

  /// run() for one mode (issue_rank given) and with or without the early stop.
  template <bool kInOrder, bool kMayGiveUp>
  double run_as(const BlockSide& forward, const BlockSide& backward, const int64_t* issue_rank,
                BlockSimulation* out, double give_up_us, bool* exact) const;

  /// Whether shifting each strand by its period leaves ops, edges and rates unchanged.
  bool is_periodic(LayerPeriods periods) const;

  const StrandGraph* forward_;
  const StrandGraph* backward_;
  int64_t num_forward_ = 0;    ///< combined op u: forward op i is u = i, backward op j is
  int64_t num_ops_ = 0;        ///< u = num_forward_ + j
  std::vector<double> rates_;  ///< num_ops_ x num_ops_, row = the slowed op
  // Flat copies of the graphs (by combined op): the simulation reads nothing else.
  std::vector<double> solo_us_;
  std::vector<int> stream_;
  std::vector<OpMask> successors_;    ///< within the op's own strand
  std::vector<OpMask> predecessors_;  ///< within the op's own strand
  std::array<int64_t, 2> period_{};   ///< verified LayerPeriods, 0 = none
  CoRunLoadBound load_bound_;         ///< from stream_pair_max_rates()
  double paired_gap_us_ = 0;          ///< launch interval of a paired block
};

/// P memoized by the two masks (open addressing; the search asks for the same block from
/// many state pairs, e.g. whenever a movable sink outside the block may or may not be done).
class BlockCostCache {
 public:
  explicit BlockCostCache(const BlockCostModel& model);
  const BlockCostModel& model() const { return *model_; }
  /// P(forward_ops, backward_ops) in us, simulated on the first request only.
  double cost_us(OpMask forward_ops, OpMask backward_ops);
  /// Distinct blocks simulated so far.
  int64_t simulations() const { return size_; }

 private:
  struct Entry {
    OpMask forward_ops = 0;
    OpMask backward_ops = 0;
    double cost_us = -1;  ///< < 0: empty slot
  };
  void grow();

  const BlockCostModel* model_;
  std::vector<Entry> entries_;
  int64_t size_ = 0;
};

}  // namespace dhelix
