#include "planner/pairing_search.h"

#include <algorithm>
#include <array>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "lib/error.h"

namespace dhelix {

namespace {

constexpr int kNumStreams = 3;
constexpr double kInfinity = std::numeric_limits<double>::infinity();
// Bounds are sums of solo times and costs are simulated sums of steps: they may disagree
// by rounding. A bound prunes only when it exceeds the incumbent by this relative margin,
// so nothing within rounding of the optimum is ever pruned.
constexpr double kPruneSlack = 1e-10;

// One move of one strand from a downset to a superset (itself included: diff = 0).
struct Step {
  int64_t target = 0;
  OpMask diff = 0;
  std::array<double, kNumStreams> load_us{};  // solo work per stream inside diff
  double path_us = 0;                         // longest solo-time path inside diff
};

// One strand's downsets with what the bounds need.
struct Lattice {
  std::vector<OpMask> downsets;
  std::vector<std::array<double, kNumStreams>> load_us;  // solo work per stream inside
  std::vector<double> remaining_path_us;  // longest path through ops outside the downset
  std::vector<std::vector<Step>> steps;   // per downset: itself first, then supersets
  int64_t size() const { return static_cast<int64_t>(downsets.size()); }
};

void collect_downsets(const StrandGraph& graph, int64_t index, OpMask mask, int64_t max_count,
                      std::vector<OpMask>* out) {
  if (index == graph.size()) {
    if (static_cast<int64_t>(out->size()) >= max_count) {
      throw Error(ErrorCode::kUnsupported,
                  "a strand has more than " + std::to_string(max_count) +
                      " downsets (too many independent ops) for the exact pairing search");
    }
    out->push_back(mask);
    return;
  }
  collect_downsets(graph, index + 1, mask, max_count, out);
  if ((graph.predecessor_mask(index) & ~mask) == 0) {
    collect_downsets(graph, index + 1, mask | (OpMask{1} << index), max_count, out);
  }
}

std::array<double, kNumStreams> stream_loads(const StrandGraph& graph, OpMask mask) {
  std::array<double, kNumStreams> load{};
  for (OpMask m = mask; m != 0; m &= m - 1) {
    const StrandOp& op = graph.op(__builtin_ctzll(m));
    load[static_cast<int>(op.stream)] += op.solo_time_us;
  }
  return load;
}

double longest_path_within(const StrandGraph& graph, OpMask mask) {
  std::array<double, kMaxStrandOps> tail{};
  double longest = 0;
  for (int64_t i = graph.size() - 1; i >= 0; --i) {
    if (((mask >> i) & 1) == 0) continue;
    double next = 0;
    for (OpMask s = graph.successor_mask(i) & mask; s != 0; s &= s - 1) {
      next = std::max(next, tail[__builtin_ctzll(s)]);
    }
    tail[i] = graph.op(i).solo_time_us + next;
    longest = std::max(longest, tail[i]);
  }
  return longest;
}

Lattice build_lattice(const StrandGraph& graph, const PairingOptions& options) {
  Lattice lattice;
  lattice.downsets = enumerate_downsets(graph, options.max_downsets);
  const int64_t n = lattice.size();
  lattice.load_us.reserve(n);
  lattice.remaining_path_us.reserve(n);
  lattice.steps.resize(n);
  for (OpMask d : lattice.downsets) {
    lattice.load_us.push_back(stream_loads(graph, d));
    double remaining = 0;  // the complement is an upset: its longest path starts anywhere in it
    for (OpMask m = graph.all_ops() & ~d; m != 0; m &= m - 1) {
      remaining = std::max(remaining, graph.tail_time_us()[__builtin_ctzll(m)]);
    }
    lattice.remaining_path_us.push_back(remaining);
  }
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = i; j < n; ++j) {
      const OpMask from = lattice.downsets[i];
      const OpMask to = lattice.downsets[j];
      if ((from & ~to) != 0) continue;
      const OpMask diff = to & ~from;
      if (options.max_segment_ops > 0 && mask_size(diff) > options.max_segment_ops) continue;
      Step step;
      step.target = j;
      step.diff = diff;
      for (int s = 0; s < kNumStreams; ++s) {
        step.load_us[s] = lattice.load_us[j][s] - lattice.load_us[i][s];
      }
      step.path_us = longest_path_within(graph, diff);
      lattice.steps[i].push_back(step);
    }
  }
  return lattice;
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

std::vector<PairingBlock> single_strand(BlockCostCache& cache, const Lattice& lattice,
                                        Strand strand, const PairingOptions& options) {
  const int64_t n = lattice.size();
  std::vector<double> value(n, kInfinity);
  std::vector<int64_t> parent(n, -1);
  value[0] = 0;
  for (int64_t i = 0; i < n; ++i) {
    for (const Step& step : lattice.steps[i]) {
      if (step.diff == 0) continue;
      const double lower =
          std::max(*std::max_element(step.load_us.begin(), step.load_us.end()), step.path_us);
      if (options.prune && value[i] + lower >= value[step.target] * (1 + kPruneSlack)) continue;
      const double cost =
          strand == Strand::kForward ? cache.cost_us(step.diff, 0) : cache.cost_us(0, step.diff);
      if (value[i] + cost < value[step.target]) {
        value[step.target] = value[i] + cost;
        parent[step.target] = i;
      }
    }
  }
  std::vector<std::pair<OpMask, OpMask>> chain;
  for (int64_t s = n - 1; s > 0; s = parent[s]) {
    const OpMask diff = lattice.downsets[s] & ~lattice.downsets[parent[s]];
    chain.push_back(strand == Strand::kForward ? std::pair{diff, OpMask{0}}
                                               : std::pair{OpMask{0}, diff});
  }
  std::reverse(chain.begin(), chain.end());
  return blocks_from_chain(cache.model(), chain);
}

// The joint DP's table of |downsets(F)| x |downsets(B)| values must stay within memory
// the caller agreed to spend; past the limit the exact search is not the tool.
void check_state_limit(int64_t nf, int64_t nb, const PairingOptions& options) {
  if (nf * nb > options.max_states) {
    throw Error(ErrorCode::kUnsupported,
                "pairing search needs " + std::to_string(nf) + " x " + std::to_string(nb) +
                    " states, more than the limit of " + std::to_string(options.max_states));
  }
}

// The strands alone are both the baseline the report compares against and, summed, the
// first incumbent of the joint search.
void solve_strands_alone(BlockCostCache& cache, const Lattice& lf, const Lattice& lb,
                         const PairingOptions& options, PairingResult* result) {
  result->forward_alone_blocks = single_strand(cache, lf, Strand::kForward, options);
  result->backward_alone_blocks = single_strand(cache, lb, Strand::kBackward, options);
  result->forward_alone_us = total_time_us(result->forward_alone_blocks);
  result->backward_alone_us = total_time_us(result->backward_alone_blocks);
  result->sequential_time_us = result->forward_alone_us + result->backward_alone_us;
  result->stats.forward_downsets = lf.size();
  result->stats.backward_downsets = lb.size();
  result->stats.states = lf.size() * lb.size();
}

// Pruning 1 (pairing_search.h): rates are <= 1, so a block lasts at least its busiest
// stream's solo work and its longest solo path on either side.
double block_lower_bound_us(const Step& sf, const Step& sb) {
  double bound = std::max(sf.path_us, sb.path_us);
  for (int s = 0; s < kNumStreams; ++s) bound = std::max(bound, sf.load_us[s] + sb.load_us[s]);
  return bound;
}

// The DP over downset pairs (pairing_search.h). State (i, j), forward downset i with
// backward downset j, is stored at i * nb + j. A class because the relaxation of one
// transition reads the lattices, the table and the incumbent, and updates the latter two.
class JointSearch {
 public:
  JointSearch(BlockCostCache& cache, const Lattice& lf, const Lattice& lb,
              const PairingOptions& options, PairingStats* stats)
      : cache_(cache),
        lf_(lf),
        lb_(lb),
        options_(options),
        stats_(*stats),
        nb_(lb.size()),
        last_(lf.size() * lb.size() - 1),
        value_(lf.size() * lb.size(), kInfinity),
        parent_(lf.size() * lb.size(), -1) {
    value_[0] = 0;
    for (int s = 0; s < kNumStreams; ++s) {
      total_load_us_[s] = lf.load_us[lf.size() - 1][s] + lb.load_us[nb_ - 1][s];
    }
  }

  // `upper_us` is the first incumbent (the strands one after the other: a plan of this
  // lattice), or infinity without pruning.
  void run(double upper_us) {
    upper_us_ = upper_us;
    // Subsets precede supersets in both downset lists, so (i, j) in lexicographic order
    // visits every state after all states that can reach it.
    for (int64_t i = 0; i < lf_.size(); ++i) {
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
  // Pruning 2: after state (i, j) every stream still owes its remaining solo work and
  // each strand its longest remaining path.
  double remaining_bound_us(int64_t i, int64_t j) const {
    double bound = std::max(lf_.remaining_path_us[i], lb_.remaining_path_us[j]);
    for (int s = 0; s < kNumStreams; ++s) {
      bound = std::max(bound, total_load_us_[s] - lf_.load_us[i][s] - lb_.load_us[j][s]);
    }
    return bound;
  }

  // Every transition from state (i, j), reached at time t: one block per pair of steps,
  // except the pair that moves neither strand.
  void expand(int64_t i, int64_t j, double t) {
    ++stats_.states_expanded;
    const int64_t state = i * nb_ + j;
    for (const Step& sf : lf_.steps[i]) {
      for (const Step& sb : lb_.steps[j]) {
        if (sf.diff == 0 && sb.diff == 0) continue;
        ++stats_.transitions;
        relax(state, t, sf, sb);
      }
    }
  }

  // Pruning 3 before simulating: the block cannot improve its target, or no plan through
  // it can beat the incumbent. Then the usual DP relaxation.
  void relax(int64_t state, double t, const Step& sf, const Step& sb) {
    const int64_t target = sf.target * nb_ + sb.target;
    if (options_.prune) {
      const double block_bound = block_lower_bound_us(sf, sb);
      if (t + block_bound >= value_[target] * (1 + kPruneSlack) ||
          t + block_bound + remaining_bound_us(sf.target, sb.target) >
              upper_us_ * (1 + kPruneSlack)) {
        ++stats_.transitions_pruned;
        return;
      }
    }
    const double candidate = t + cache_.cost_us(sf.diff, sb.diff);
    if (candidate < value_[target]) {
      value_[target] = candidate;
      parent_[target] = state;
      if (target == last_) upper_us_ = std::min(upper_us_, candidate);
    }
  }

  BlockCostCache& cache_;
  const Lattice& lf_;
  const Lattice& lb_;
  const PairingOptions& options_;
  PairingStats& stats_;
  const int64_t nb_;
  const int64_t last_;
  std::vector<double> value_;    // best known time from ({}, {}) to each state
  std::vector<int64_t> parent_;  // the state that value_ came from; -1 when unreached
  std::array<double, kNumStreams> total_load_us_{};  // both strands' solo work per stream
  double upper_us_ = kInfinity;  // the best complete plan known (branch and bound)
};

}  // namespace

double total_time_us(const std::vector<PairingBlock>& blocks) {
  double total = 0;
  for (const PairingBlock& b : blocks) total += b.time_us;
  return total;
}

std::vector<OpMask> enumerate_downsets(const StrandGraph& graph, int64_t max_count) {
  std::vector<OpMask> out;
  collect_downsets(graph, 0, 0, max_count, &out);
  std::sort(out.begin(), out.end(), [](OpMask a, OpMask b) {
    const int64_t sa = mask_size(a), sb = mask_size(b);
    return sa != sb ? sa < sb : a < b;
  });
  return out;
}

std::vector<PairingBlock> search_single_strand(const BlockCostModel& model, Strand strand,
                                               const PairingOptions& options) {
  BlockCostCache cache(model);
  return single_strand(cache, build_lattice(model.graph(strand), options), strand, options);
}

double resimulate_total_us(const BlockCostModel& model, const std::vector<PairingBlock>& blocks) {
  double total = 0;
  for (const PairingBlock& b : blocks) total += model.cost_us(b.forward_ops, b.backward_ops);
  return total;
}

PairingResult search_pairing(const BlockCostModel& model, const PairingOptions& options) {
  BlockCostCache cache(model);
  const Lattice lf = build_lattice(model.forward(), options);
  const Lattice lb = build_lattice(model.backward(), options);
  check_state_limit(lf.size(), lb.size(), options);
  PairingResult result;
  // Both alone first: their sum seeds the branch and bound, and their blocks warm the cache.
  solve_strands_alone(cache, lf, lb, options, &result);
  JointSearch search(cache, lf, lb, options, &result.stats);
  search.run(options.prune ? result.sequential_time_us : kInfinity);
  result.stats.block_simulations = cache.simulations();
  result.blocks = blocks_from_chain(model, search.chain());
  result.total_time_us = search.optimum_us();
  return result;
}

}  // namespace dhelix
