#include "planner/layer_baselines.h"

#include <algorithm>
#include <unordered_map>
#include <utility>

namespace dhelix {
namespace {

// Ancestor sets of every op of the DAG, by position in `order` (a topological order):
// ancestors[i] holds the positions of every op that precedes order[i].
std::vector<std::vector<bool>> ancestors_by_position(const LayerDag& dag,
                                                     const std::vector<int64_t>& order) {
  const auto n = static_cast<int64_t>(order.size());
  std::unordered_map<int64_t, int64_t> position;
  for (int64_t i = 0; i < n; ++i) position[order[static_cast<size_t>(i)]] = i;
  std::vector<std::vector<bool>> ancestors(static_cast<size_t>(n),
                                           std::vector<bool>(static_cast<size_t>(n), false));
  for (int64_t i = 0; i < n; ++i) {
    std::vector<bool>& mine = ancestors[static_cast<size_t>(i)];
    for (const int64_t p : dag.predecessors(order[static_cast<size_t>(i)])) {
      const int64_t j = position.at(p);
      mine[static_cast<size_t>(j)] = true;
      const std::vector<bool>& theirs = ancestors[static_cast<size_t>(j)];
      for (int64_t k = 0; k < j; ++k) {
        if (theirs[static_cast<size_t>(k)]) mine[static_cast<size_t>(k)] = true;
      }
    }
  }
  return ancestors;
}

// How good a cut before position p (pieces [start, p) and [p, ...)) is: 2 for a separator,
// 1 when only sinks break it, 0 otherwise (the rules of single_strand_schedule).
int cut_quality(const LayerDag& dag, const std::vector<int64_t>& order,
                const std::vector<std::vector<bool>>& ancestors, int64_t start, int64_t p) {
  const auto n = static_cast<int64_t>(order.size());
  const std::vector<bool>& before = ancestors[static_cast<size_t>(p)];
  bool only_sinks_break = true;
  bool separator = true;
  for (int64_t k = start; k < p; ++k) {
    if (before[static_cast<size_t>(k)]) continue;
    separator = false;
    if (!dag.successors(order[static_cast<size_t>(k)]).empty()) only_sinks_break = false;
  }
  for (int64_t k = p + 1; k < n && separator; ++k) {
    if (!ancestors[static_cast<size_t>(k)][static_cast<size_t>(p)]) separator = false;
  }
  return separator ? 2 : only_sinks_break ? 1 : 0;
}

// The piece of `order` between positions [begin, end) as a StrandGraph; predecessors in
// earlier pieces count as done.
StrandGraph piece_graph(const LayerDag& dag, const std::vector<int64_t>& order, int64_t begin,
                        int64_t end, const std::function<double(const Op&)>& solo_time_us) {
  StrandGraph graph;
  std::unordered_map<int64_t, int64_t> local;
  for (int64_t i = begin; i < end; ++i) {
    const int64_t v = order[static_cast<size_t>(i)];
    const Op& op = dag.op(v);
    const double time_us = checked_solo_time_us(op, solo_time_us);
    std::vector<int64_t> preds;
    for (const int64_t p : dag.predecessors(v)) {
      if (const auto it = local.find(p); it != local.end()) preds.push_back(it->second);
    }
    std::sort(preds.begin(), preds.end());
    local[v] = graph.add_op(op.id, op.stream, time_us, std::move(preds), op.signature());
  }
  return graph;
}

}  // namespace

PairingResult round_robin_pairing(const BlockCostModel& model) {
  const int64_t nf = model.forward().size();
  const int64_t nb = model.backward().size();
  // Issue ranks f0 b0 f1 b1 ...: forward op i is combined op i, backward op j is nf + j.
  std::vector<int64_t> issue_rank(static_cast<size_t>(nf + nb));
  for (int64_t i = 0; i < nf; ++i) issue_rank[i] = 2 * i;
  for (int64_t j = 0; j < nb; ++j) issue_rank[nf + j] = 2 * j + 1;
  PairingResult result;
  PairingBlock block;
  block.forward_ops = model.forward().all_ops();
  block.backward_ops = model.backward().all_ops();
  block.simulation = model.simulate_in_order(block.forward_ops, block.backward_ops, issue_rank);
  block.time_us = block.simulation.time_us;
  result.total_time_us = block.time_us;
  result.blocks.push_back(std::move(block));
  result.stats.block_simulations = 1;
  result.forward_alone_blocks = search_single_strand(model, Strand::kForward);
  result.backward_alone_blocks = search_single_strand(model, Strand::kBackward);
  result.forward_alone_us = total_time_us(result.forward_alone_blocks);
  result.backward_alone_us = total_time_us(result.backward_alone_blocks);
  result.sequential_time_us = result.forward_alone_us + result.backward_alone_us;
  return result;
}

SingleStrandSchedule single_strand_schedule(const LayerDag& dag,
                                            const std::function<double(const Op&)>& solo_time_us,
                                            const CoRunModel& co_run, Strand strand,
                                            const PairingOptions& options, PairingMemo* memo) {
  const std::vector<int64_t> order = dag.topological_order();
  const auto n = static_cast<int64_t>(order.size());
  const std::vector<std::vector<bool>> ancestors = ancestors_by_position(dag, order);
  SingleStrandSchedule schedule;
  int64_t start = 0;
  while (start < n) {
    int64_t end = n;
    if (n - start > kMaxStrandOps) {
      end = start + kMaxStrandOps;
      int best = 0;
      for (int64_t p = start + kMaxStrandOps; p > start; --p) {
        const int quality = cut_quality(dag, order, ancestors, start, p);
        if (quality > best) {
          best = quality;
          end = p;
        }
        if (best == 2) break;
      }
      schedule.exact = schedule.exact && best == 2;
    }
    schedule.pieces.push_back(piece_graph(dag, order, start, end, solo_time_us));
    start = end;
  }
  const StrandGraph empty;
  for (const StrandGraph& piece : schedule.pieces) {
    const bool forward = strand == Strand::kForward;
    const BlockCostModel model(forward ? piece : empty, forward ? empty : piece, co_run);
    if (memo == nullptr) {
      schedule.blocks.push_back(search_single_strand(model, strand, options));
    } else {
      // The memo keeps PairingResults: a single-strand schedule travels in `blocks`.
      const std::string key =
          pairing_memo_key(forward ? MemoSearch::kForwardAlone : MemoSearch::kBackwardAlone,
                           forward ? piece : empty, forward ? empty : piece, 1, options);
      schedule.blocks.push_back(memo->find_or_search(key,
                                                     [&] {
                                                       PairingResult alone;
                                                       alone.blocks = search_single_strand(
                                                           model, strand, options);
                                                       return alone;
                                                     })
                                    .blocks);
    }
    schedule.piece_time_us.push_back(total_time_us(schedule.blocks.back()));
    schedule.total_time_us += schedule.piece_time_us.back();
  }
  return schedule;
}

}  // namespace dhelix
