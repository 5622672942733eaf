#include "planner/pairing_search.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "lib/error.h"
#include "planner/downset_lattice.h"
#include "planner/piece_cost_table.h"

namespace dhelix {

namespace {

constexpr int kNumStreams = 3;
constexpr double kInfinity = std::numeric_limits<double>::infinity();
// Bounds are sums of solo times and costs are simulated sums of steps: they may disagree
// by rounding. A bound prunes only when it exceeds the incumbent by this relative margin,
// so nothing within rounding of the optimum is ever pruned.
constexpr double kPruneSlack = 1e-10;

// Solo work per stream inside a step's difference: the two downsets' loads subtracted.
std::array<double, kNumStreams> step_load_us(const Lattice& lattice, int64_t from, int64_t to) {
  std::array<double, kNumStreams> load{};
  for (int s = 0; s < kNumStreams; ++s) load[s] = lattice.load_us[to][s] - lattice.load_us[from][s];
  return load;
}

// What the bounds read of one step, gathered once per expanded state.
struct StepBound {
  int64_t target = 0;
  int64_t piece = 0;
  std::array<double, kNumStreams> load_us{};  // solo work per stream inside the difference
  double path_us = 0;                         // longest solo-time path inside it
};

void gather_steps(const Lattice& lattice, int64_t from, std::vector<StepBound>* out) {
  out->clear();
  for (int64_t k = lattice.step_begin[from]; k < lattice.step_begin[from + 1]; ++k) {
    const LatticeStep& step = lattice.steps[static_cast<size_t>(k)];
    out->push_back(StepBound{step.target, step.piece, step_load_us(lattice, from, step.target),
                             lattice.piece_path_us[static_cast<size_t>(step.piece)]});
  }
}

// Turns a parent chain into blocks with timings.
std::vector<PairingBlock> blocks_from_chain(const BlockCostModel& model,
                                            const std::vector<std::pair<OpMask, OpMask>>& chain) {
  std::vector<PairingBlock> blocks;
  double start_us = 0;
  for (const auto& [forward_ops, backward_ops] : chain) {
    PairingBlock block;
    block.forward_ops = forward_ops;
    block.backward_ops = backward_ops;
    block.start_us = start_us;
    block.simulation = model.simulate(forward_ops, backward_ops);
    block.time_us = block.simulation.time_us;
    start_us += block.time_us;
    blocks.push_back(std::move(block));
  }
  return blocks;
}

std::vector<PairingBlock> single_strand(PieceCostTable& table, const BlockCostModel& model,
                                        const Lattice& lattice, const Lattice& other,
                                        const PairingOptions& options) {
  const int64_t n = lattice.size();
  const bool forward = lattice.strand == Strand::kForward;
  std::vector<double> value(n, kInfinity);
  std::vector<int64_t> parent(n, -1);
  value[0] = 0;
  std::vector<StepBound> steps;
  for (int64_t i = 0; i < n; ++i) {
    gather_steps(lattice, i, &steps);
    for (const StepBound& step : steps) {
      if (step.target == i) continue;  // the empty difference
      const double lower =
          std::max(*std::max_element(step.load_us.begin(), step.load_us.end()), step.path_us);
      if (options.prune && value[i] + lower >= value[step.target] * (1 + kPruneSlack)) continue;
      const double cost = forward ? table.cost_us(step.piece, other.empty_piece())
                                  : table.cost_us(other.empty_piece(), step.piece);
      if (value[i] + cost < value[step.target]) {
        value[step.target] = value[i] + cost;
        parent[step.target] = i;
      }
    }
  }
  std::vector<std::pair<OpMask, OpMask>> chain;
  for (int64_t s = n - 1; s > 0; s = parent[s]) {
    const OpMask diff = lattice.downsets[s] & ~lattice.downsets[parent[s]];
    chain.push_back(forward ? std::pair{diff, OpMask{0}} : std::pair{OpMask{0}, diff});
  }
  std::reverse(chain.begin(), chain.end());
  return blocks_from_chain(model, chain);
}

// The joint DP's table of |downsets(F)| x |downsets(B)| values must stay within memory
// the caller agreed to spend; past the limit the exact search is not the tool.
void check_state_limit(int64_t nf, int64_t nb, const PairingOptions& options) {
  // Parents are stored as 32-bit state numbers.
  const int64_t limit = std::min<int64_t>(options.max_states, std::numeric_limits<int32_t>::max());
  if (nf * nb > limit) {
    throw Error(ErrorCode::kUnsupported,
                "exact pairing search refused: it needs " + std::to_string(nf) + " x " +
                    std::to_string(nb) +
                    " states (forward x backward downsets), more than the limit of " +
                    std::to_string(limit) + " (too many ops with no order between them)");
  }
}

// The options with the widest segments, from the requested bound down, whose block pairs
// stay within the work budget and whose steps within max_steps (pairing_search.h, 5.). With
// none, the options as asked: building the steps refuses them as before.
PairingOptions within_work_budget(const BlockCostModel& model, const Lattice& lf, const Lattice& lb,
                                  PairingOptions options) {
  if (options.max_block_pairs <= 0) return options;
  // A strand of n downsets has at most n (n + 1) / 2 moves (pairs of a downset and a
  // superset): when those fit, nothing needs counting (most layers).
  const auto most_moves = [](const Lattice& l) {
    return static_cast<double>(l.size()) * static_cast<double>(l.size() + 1) / 2;
  };
  if (most_moves(lf) <= static_cast<double>(options.max_steps) &&
      most_moves(lb) <= static_cast<double>(options.max_steps) &&
      most_moves(lf) * most_moves(lb) <= static_cast<double>(options.max_block_pairs)) {
    return options;
  }
  const int64_t requested = options.max_segment_ops;
  for (int64_t bound : {requested, int64_t{24}, int64_t{16}, int64_t{12}, int64_t{8}, int64_t{6},
                        int64_t{4}, int64_t{3}, int64_t{2}, int64_t{1}}) {
    if (bound != requested && requested > 0 && bound >= requested) continue;  // only tighter
    const int64_t forward = count_lattice_steps(model, lf, bound, options.max_steps);
    const int64_t backward = count_lattice_steps(model, lb, bound, options.max_steps);
    if (forward <= options.max_steps && backward <= options.max_steps &&
        static_cast<double>(forward) * static_cast<double>(backward) <=
            static_cast<double>(options.max_block_pairs)) {
      options.max_segment_ops = bound;
      return options;
    }
  }
  return options;
}

// The strands alone are both the baseline the report compares against and, summed, the
// first incumbent of the joint search.
void solve_strands_alone(PieceCostTable& table, const BlockCostModel& model, const Lattice& lf,
                         const Lattice& lb, const PairingOptions& options, PairingResult* result) {
  result->forward_alone_blocks = single_strand(table, model, lf, lb, options);
  result->backward_alone_blocks = single_strand(table, model, lb, lf, options);
  result->forward_alone_us = total_time_us(result->forward_alone_blocks);
  result->backward_alone_us = total_time_us(result->backward_alone_blocks);
  result->sequential_time_us = result->forward_alone_us + result->backward_alone_us;
  result->stats.forward_downsets = lf.size();
  result->stats.backward_downsets = lb.size();
  result->stats.states = lf.size() * lb.size();
}

// Pruning 1 (pairing_search.h): rates are <= 1, so a block lasts at least its busiest
// stream's solo work and its longest solo path on either side.
// Pruning 1 (pairing_search.h), in two steps since most transitions fail the first:
// rates are <= 1, so a block lasts at least its longest solo path on either side and its
// busiest stream's solo work (`plain_block_bound_us`), and at least the slow-down aware
// bound of its loads (`block_lower_bound_us`, never below the plain one).
inline double plain_block_bound_us(const StepBound& sf, const StepBound& sb) {
  double bound = std::max(sf.path_us, sb.path_us);
  for (int s = 0; s < kNumStreams; ++s) bound = std::max(bound, sf.load_us[s] + sb.load_us[s]);
  return bound;
}

double block_lower_bound_us(const CoRunLoadBound& load_bound, const StepBound& sf,
                            const StepBound& sb) {
  std::array<double, kNumStreams> load;
  for (int s = 0; s < kNumStreams; ++s) load[s] = sf.load_us[s] + sb.load_us[s];
  return std::max(std::max(sf.path_us, sb.path_us), load_bound.bound_us(load));
}

// The DP over downset pairs (pairing_search.h). State (i, j), forward downset i with
// backward downset j, is stored at i * nb + j. A class because the relaxation of one
// transition reads the lattices, the table and the incumbent, and updates the latter two.
class JointSearch {
 public:
  JointSearch(PieceCostTable& table, const CoRunLoadBound& load_bound, const Lattice& lf,
              const Lattice& lb, const PairingOptions& options, PairingStats* stats)
      : table_(table),
        load_bound_(load_bound),
        lf_(lf),
        lb_(lb),
        options_(options),
        stats_(*stats),
        nb_(lb.size()),
        last_(lf.size() * lb.size() - 1),
        bounded_(options.max_segment_ops == 0),
        value_(lf.size() * lb.size(), kInfinity),
        parent_(lf.size() * lb.size(), -1) {
    value_[0] = 0;
    if (static_cast<int64_t>(lb.steps.size()) <= kMaxGatheredSteps) {
      all_backward_steps_.reserve(lb.steps.size());
      for (int64_t j = 0; j < nb_; ++j) {
        gather_steps(lb, j, &backward_steps_);
        all_backward_steps_.insert(all_backward_steps_.end(), backward_steps_.begin(),
                                   backward_steps_.end());
      }
    }
    for (int s = 0; s < kNumStreams; ++s) {
      total_load_us_[s] = lf.load_us[lf.size() - 1][s] + lb.load_us[nb_ - 1][s];
    }
    if (last_ + 1 <= kMaxTabledStates) {
      remaining_.resize(static_cast<size_t>(last_ + 1));
      plain_remaining_.resize(static_cast<size_t>(last_ + 1));
      for (int64_t i = 0; i < lf.size(); ++i) {
        for (int64_t j = 0; j < nb_; ++j) {
          remaining_[i * nb_ + j] = compute_remaining_bound_us(i, j);
          plain_remaining_[i * nb_ + j] = compute_plain_remaining_bound_us(i, j);
        }
      }
    }
  }

  // `upper_us` is the first incumbent (the strands one after the other: a plan of this
  // lattice), or infinity without pruning.
  void run(double upper_us) {
    upper_us_ = upper_us;
    // Subsets precede supersets in both downset lists, so (i, j) in lexicographic order
    // visits every state after all states that can reach it.
    for (int64_t i = 0; i < lf_.size(); ++i) {
      gather_steps(lf_, i, &forward_steps_);
      for (int64_t j = 0; j < nb_; ++j) {
        const int64_t state = i * nb_ + j;
        const double t = value_[state];
        if (t == kInfinity || state == last_) continue;
        if (options_.prune && t + remaining_bound_us(i, j) > upper_us_ * (1 + kPruneSlack)) {
          continue;
        }
        expand(i, j, t);
      }
    }
    DHELIX_CHECK_MSG(value_[last_] < kInfinity, "pairing search reached no complete plan");
  }

  double optimum_us() const { return value_[last_]; }

  // The optimal plan's blocks, first to last, as (forward ops, backward ops).
  std::vector<std::pair<OpMask, OpMask>> chain() const {
    std::vector<std::pair<OpMask, OpMask>> blocks;
    for (int64_t s = last_; s > 0; s = parent_[s]) {
      const int64_t p = parent_[s];
      blocks.emplace_back(lf_.downsets[s / nb_] & ~lf_.downsets[p / nb_],
                          lb_.downsets[s % nb_] & ~lb_.downsets[p % nb_]);
    }
    std::reverse(blocks.begin(), blocks.end());
    return blocks;
  }

 private:
  // Pruning 2 from the tables when there are, else computed (the same function).
  double remaining_bound_us(int64_t i, int64_t j) const {
    return remaining_.empty() ? compute_remaining_bound_us(i, j) : remaining_[i * nb_ + j];
  }
  double plain_remaining_bound_us(int64_t i, int64_t j) const {
    return plain_remaining_.empty() ? compute_plain_remaining_bound_us(i, j)
                                    : plain_remaining_[i * nb_ + j];
  }
  // Pruning 2: after state (i, j) every stream still owes its remaining solo work and
  // each strand its longest remaining path.
  double compute_remaining_bound_us(int64_t i, int64_t j) const {
    return std::max(std::max(lf_.remaining_path_us[i], lb_.remaining_path_us[j]),
                    load_bound_.bound_us(remaining_load_us(i, j)));
  }
  // The same without slow-downs: the longest remaining path and the busiest stream's work.
  double compute_plain_remaining_bound_us(int64_t i, int64_t j) const {
    const std::array<double, kNumStreams> load = remaining_load_us(i, j);
    return std::max(std::max(lf_.remaining_path_us[i], lb_.remaining_path_us[j]),
                    std::max(std::max(load[0], load[1]), load[2]));
  }
  std::array<double, kNumStreams> remaining_load_us(int64_t i, int64_t j) const {
    std::array<double, kNumStreams> load;
    for (int s = 0; s < kNumStreams; ++s) {
      load[s] = total_load_us_[s] - lf_.load_us[i][s] - lb_.load_us[j][s];
    }
    return load;
  }

  // Every transition from state (i, j), reached at time t: one block per pair of steps,
  // except the pair that moves neither strand (the first step of each is the empty one).
  void expand(int64_t i, int64_t j, double t) {
    ++stats_.states_expanded;
    const int64_t state = i * nb_ + j;
    const StepBound* first = nullptr;
    const StepBound* end = nullptr;
    if (!all_backward_steps_.empty()) {
      first = all_backward_steps_.data() + lb_.step_begin[j];
      end = all_backward_steps_.data() + lb_.step_begin[j + 1];
    } else {
      gather_steps(lb_, j, &backward_steps_);
      first = backward_steps_.data();
      end = first + backward_steps_.size();
    }
    for (const StepBound& sf : forward_steps_) {
      for (const StepBound* sb_at = first; sb_at != end; ++sb_at) {
        const StepBound& sb = *sb_at;
        if (sf.target == i && sb.target == j) continue;
        ++stats_.transitions;
        if (bounded_) {
          relax<true>(state, t, sf, sb);
        } else {
          relax<false>(state, t, sf, sb);
        }
      }
    }
  }

  // Pruning 3 before simulating: the block cannot improve its target, or no plan through
  // it can beat the incumbent. The same two tests, on the block's simulated time instead
  // of its bound, give the cost past which the simulation may stop (pruning 4). Then the
  // usual DP relaxation.
  template <bool kBounded>
  void relax(int64_t state, double t, const StepBound& sf, const StepBound& sb) {
    const int64_t target = sf.target * nb_ + sb.target;
    double give_up_us = BlockCostModel::kNoGiveUp;
    if (options_.prune) {
      const double limit_us = value_[target] * (1 + kPruneSlack);
      const double upper_limit_us = upper_us_ * (1 + kPruneSlack);
      if (!kBounded) {
        const double block_bound = plain_block_bound_us(sf, sb);
        if (t + block_bound >= limit_us ||
            t + block_bound + plain_remaining_bound_us(sf.target, sb.target) > upper_limit_us) {
          ++stats_.transitions_pruned;
          return;
        }
      } else {
        if (t + plain_block_bound_us(sf, sb) >= limit_us) {
          ++stats_.transitions_pruned;
          return;
        }
        const double block_bound = block_lower_bound_us(load_bound_, sf, sb);
        if (t + block_bound >= limit_us ||
            t + block_bound + plain_remaining_bound_us(sf.target, sb.target) > upper_limit_us) {
          ++stats_.transitions_pruned;
          return;
        }
        const double remaining = remaining_bound_us(sf.target, sb.target);
        if (t + block_bound + remaining > upper_limit_us) {
          ++stats_.transitions_pruned;
          return;
        }
        // Past it, t + P >= value_[target] (1 + slack) or t + P + remaining > upper_us_ (1 +
        // slack): the tests above with P for the bound. The margin below keeps rounding in
        // this subtraction on the side of simulating.
        // nextafter: a block that exactly ties the incumbent must still be simulated to the
        // end, or with an incumbent of 0 us (a profile of zero times) every block is given
        // up at once and the search reaches no plan.
        give_up_us = std::nextafter(
            std::min(limit_us - t, upper_limit_us - remaining - t) * (1 + kPruneSlack), kInfinity);
      }
    }
    const double cost = table_.cost_us(sf.piece, sb.piece, give_up_us);
    if (kBounded && cost >= give_up_us) {
      ++stats_.transitions_given_up;
      return;
    }
    const double candidate = t + cost;
    if (candidate < value_[target]) {
      value_[target] = candidate;
      parent_[target] = static_cast<int32_t>(state);
      if (target == last_) upper_us_ = std::min(upper_us_, candidate);
    }
  }

  PieceCostTable& table_;
  const CoRunLoadBound& load_bound_;
  const Lattice& lf_;
  const Lattice& lb_;
  const PairingOptions& options_;
  PairingStats& stats_;
  const int64_t nb_;
  const int64_t last_;
  // Pruning 4 and the slow-down aware bound per transition: they pay in the per-layer
  // search (unbounded segments: large blocks, 1.2x) and cost in the windows (segments of
  // at most 8 ops: small blocks, whose simulations are cheap; 1.4x slower with them).
  const bool bounded_;
  // Pruning 2's two bounds of every state, computed once instead of once per transition
  // into it (each state is the target of hundreds), while the tables stay small (16
  // bytes a state); empty past kMaxTabledStates.
  static constexpr int64_t kMaxTabledStates = int64_t{1} << 20;
  std::vector<double> remaining_;
  std::vector<double> plain_remaining_;
  std::vector<double> value_;    // best known time from ({}, {}) to each state
  std::vector<int32_t> parent_;  // the state that value_ came from; -1 when unreached
  std::array<double, kNumStreams> total_load_us_{};  // both strands' solo work per stream
  double upper_us_ = kInfinity;            // the best complete plan known (branch and bound)
  std::vector<StepBound> forward_steps_;   // of the forward downset being expanded
  std::vector<StepBound> backward_steps_;  // of the backward downset being expanded
  // Every backward downset's steps, gathered once instead of once per forward downset (the
  // inner loop of run() meets each of them |downsets(F)| times), indexed like lb_.steps;
  // empty past kMaxGatheredSteps (48 bytes each), where they are gathered per state.
  static constexpr int64_t kMaxGatheredSteps = int64_t{1} << 18;
  std::vector<StepBound> all_backward_steps_;
};

// A lattice of the other strand that holds only the empty piece (single-strand searches).
Lattice empty_lattice(Strand strand) {
  Lattice lattice;
  lattice.strand = strand;
  lattice.downsets = {0};
  lattice.pieces = {0};
  lattice.piece_path_us = {0};
  return lattice;
}

}  // namespace

double total_time_us(const std::vector<PairingBlock>& blocks) {
  double total = 0;
  for (const PairingBlock& b : blocks) total += b.time_us;
  return total;
}

std::vector<PairingBlock> search_single_strand(const BlockCostModel& model, Strand strand,
                                               const PairingOptions& options) {
  Lattice lattice = lattice_downsets(model, strand, options);
  build_lattice_steps(model, options, &lattice);
  const Lattice other =
      empty_lattice(strand == Strand::kForward ? Strand::kBackward : Strand::kForward);
  PieceCostTable table(model, strand == Strand::kForward ? lattice : other,
                       strand == Strand::kForward ? other : lattice);
  return single_strand(table, model, lattice, other, options);
}

double resimulate_total_us(const BlockCostModel& model, const std::vector<PairingBlock>& blocks) {
  double total = 0;
  for (const PairingBlock& b : blocks) total += model.cost_us(b.forward_ops, b.backward_ops);
  return total;
}

namespace {

// The strands alone as asked, when the work budget bounded the joint search's segments:
// Megatron-LM's layer times come from them (planner/layer_costs.h) and must not depend on
// dhelix's budget. A single strand's search is linear in its moves, so it needs no budget;
// a strand past the step limit keeps the bounded figures.
void unbound_strands_alone(const BlockCostModel& model, const PairingOptions& requested,
                           PairingResult* result) {
  std::vector<PairingBlock> forward, backward;
  try {
    forward = search_single_strand(model, Strand::kForward, requested);
    backward = search_single_strand(model, Strand::kBackward, requested);
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kUnsupported) throw;
    return;
  }
  result->forward_alone_blocks = std::move(forward);
  result->backward_alone_blocks = std::move(backward);
  result->forward_alone_us = total_time_us(result->forward_alone_blocks);
  result->backward_alone_us = total_time_us(result->backward_alone_blocks);
  result->sequential_time_us = result->forward_alone_us + result->backward_alone_us;
}

}  // namespace

PairingResult search_pairing(const BlockCostModel& model, const PairingOptions& requested) {
  // Counts first, storage after: a strand too wide for the exact search is refused before
  // its steps or the state table are allocated.
  Lattice lf = lattice_downsets(model, Strand::kForward, requested);
  Lattice lb = lattice_downsets(model, Strand::kBackward, requested);
  check_state_limit(lf.size(), lb.size(), requested);
  const PairingOptions options = within_work_budget(model, lf, lb, requested);
  build_lattice_steps(model, options, &lf);
  build_lattice_steps(model, options, &lb);
  PieceCostTable table(model, lf, lb);
  PairingResult result;
  // Both alone first: their sum seeds the branch and bound, and their blocks warm the memo.
  solve_strands_alone(table, model, lf, lb, options, &result);
  JointSearch search(table, model.load_bound(), lf, lb, options, &result.stats);
  search.run(options.prune ? result.sequential_time_us : kInfinity);
  result.stats.block_simulations = table.simulations();
  result.blocks = blocks_from_chain(model, search.chain());
  result.total_time_us = search.optimum_us();
  result.segment_bound = options.max_segment_ops;
  if (options.max_segment_ops != requested.max_segment_ops) {
    unbound_strands_alone(model, requested, &result);
  }
  return result;
}

}  // namespace dhelix
