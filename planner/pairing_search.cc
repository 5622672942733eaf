#include "planner/pairing_search.h"

#include <algorithm>
#include <array>
#include <limits>
#include <string>

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
  const int64_t nf = lf.size(), nb = lb.size();
  if (nf * nb > options.max_states) {
    throw Error(ErrorCode::kUnsupported,
                "pairing search needs " + std::to_string(nf) + " x " + std::to_string(nb) +
                    " states, more than the limit of " + std::to_string(options.max_states));
  }
  PairingResult result;
  result.forward_alone_blocks = single_strand(cache, lf, Strand::kForward, options);
  result.backward_alone_blocks = single_strand(cache, lb, Strand::kBackward, options);
  result.forward_alone_us = total_time_us(result.forward_alone_blocks);
  result.backward_alone_us = total_time_us(result.backward_alone_blocks);
  result.sequential_time_us = result.forward_alone_us + result.backward_alone_us;
  PairingStats& stats = result.stats;
  stats.forward_downsets = nf;
  stats.backward_downsets = nb;
  stats.states = nf * nb;

  std::array<double, kNumStreams> total_load{};
  for (int s = 0; s < kNumStreams; ++s)
    total_load[s] = lf.load_us[nf - 1][s] + lb.load_us[nb - 1][s];
  auto remaining_bound = [&](int64_t i, int64_t j) {
    double bound = std::max(lf.remaining_path_us[i], lb.remaining_path_us[j]);
    for (int s = 0; s < kNumStreams; ++s) {
      bound = std::max(bound, total_load[s] - lf.load_us[i][s] - lb.load_us[j][s]);
    }
    return bound;
  };

  const int64_t last = nf * nb - 1;
  std::vector<double> value(nf * nb, kInfinity);
  std::vector<int64_t> parent(nf * nb, -1);
  value[0] = 0;
  // The strands one after the other is a plan of this lattice: the first incumbent.
  double upper = options.prune ? result.sequential_time_us : kInfinity;
  // Subsets precede supersets in both downset lists, so (i, j) in lexicographic order
  // visits every state after all states that can reach it.
  for (int64_t i = 0; i < nf; ++i) {
    for (int64_t j = 0; j < nb; ++j) {
      const int64_t state = i * nb + j;
      const double t = value[state];
      if (t == kInfinity || state == last) continue;
      if (options.prune && t + remaining_bound(i, j) > upper * (1 + kPruneSlack)) continue;
      ++stats.states_expanded;
      for (const Step& sf : lf.steps[i]) {
        for (const Step& sb : lb.steps[j]) {
          if (sf.diff == 0 && sb.diff == 0) continue;
          ++stats.transitions;
          const int64_t target = sf.target * nb + sb.target;
          if (options.prune) {
            double block_bound = std::max(sf.path_us, sb.path_us);
            for (int s = 0; s < kNumStreams; ++s) {
              block_bound = std::max(block_bound, sf.load_us[s] + sb.load_us[s]);
            }
            if (t + block_bound >= value[target] * (1 + kPruneSlack) ||
                t + block_bound + remaining_bound(sf.target, sb.target) >
                    upper * (1 + kPruneSlack)) {
              ++stats.transitions_pruned;
              continue;
            }
          }
          const double candidate = t + cache.cost_us(sf.diff, sb.diff);
          if (candidate < value[target]) {
            value[target] = candidate;
            parent[target] = state;
            if (target == last) upper = std::min(upper, candidate);
          }
        }
      }
    }
  }
  DHELIX_CHECK_MSG(value[last] < kInfinity, "pairing search reached no complete plan");
  stats.block_simulations = cache.simulations();

  std::vector<std::pair<OpMask, OpMask>> chain;
  for (int64_t s = last; s > 0; s = parent[s]) {
    const int64_t p = parent[s];
    chain.emplace_back(lf.downsets[s / nb] & ~lf.downsets[p / nb],
                       lb.downsets[s % nb] & ~lb.downsets[p % nb]);
  }
  std::reverse(chain.begin(), chain.end());
  result.blocks = blocks_from_chain(model, chain);
  result.total_time_us = value[last];
  return result;
}

}  // namespace dhelix
