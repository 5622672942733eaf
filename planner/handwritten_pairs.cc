#include "planner/handwritten_pairs.h"

#include <algorithm>
#include <string>

#include "lib/error.h"
#include "lib/op_catalogue.h"

namespace dhelix {
namespace {

// Forward nodes in run order, and backward nodes in theirs (the backward walks the layer
// from its end): the rank of a node along its strand.
int forward_rank(LayerNode node) {
  switch (node) {
    case LayerNode::kAttention:
      return 0;
    case LayerNode::kDispatch:
      return 1;
    case LayerNode::kMlp:
      return 2;
    case LayerNode::kCombine:
      return 3;
  }
  return 0;
}

constexpr LayerNode kForwardNodes[] = {LayerNode::kAttention, LayerNode::kDispatch, LayerNode::kMlp,
                                       LayerNode::kCombine};
constexpr LayerNode kBackwardNodes[] = {LayerNode::kCombine, LayerNode::kMlp, LayerNode::kDispatch,
                                        LayerNode::kAttention};

int backward_rank(LayerNode node) {
  for (int r = 0; r < 4; ++r) {
    if (kBackwardNodes[r] == node) return r;
  }
  return 0;
}

// Forward: every op as early as its inputs allow (an op after an all-to-all joins the node
// that follows it). Sources are attention.
std::vector<LayerNode> forward_nodes(const StrandGraph& g, int64_t dispatch, int64_t combine) {
  std::vector<LayerNode> node(static_cast<size_t>(g.size()), LayerNode::kAttention);
  for (int64_t i = 0; i < g.size(); ++i) {  // indices are topological (strand_graph.h)
    if (i == dispatch || i == combine) {
      node[static_cast<size_t>(i)] = i == dispatch ? LayerNode::kDispatch : LayerNode::kCombine;
      continue;
    }
    int rank = 0;
    for (int64_t p : g.op(i).predecessors) {
      const int after = p == dispatch  ? forward_rank(LayerNode::kMlp)
                        : p == combine ? forward_rank(LayerNode::kCombine)
                                       : forward_rank(node[static_cast<size_t>(p)]);
      rank = std::max(rank, after);
    }
    node[static_cast<size_t>(i)] = kForwardNodes[rank];
  }
  return node;
}

// Backward: every op but the weight gradients as late as its consumers allow (an op
// before an all-to-all joins the node before it; sinks are attention), then each weight
// gradient with the latest node among its inputs.
std::vector<LayerNode> backward_nodes(const StrandGraph& g, int64_t combine, int64_t dispatch,
                                      const std::vector<bool>& weight) {
  const size_t n = static_cast<size_t>(g.size());
  std::vector<LayerNode> node(n, LayerNode::kAttention);
  for (int64_t i = g.size() - 1; i >= 0; --i) {
    if (i == combine || i == dispatch) {
      node[static_cast<size_t>(i)] = i == combine ? LayerNode::kCombine : LayerNode::kDispatch;
      continue;
    }
    if (weight[static_cast<size_t>(i)]) continue;
    int rank = 3;
    OpMask successors = g.successor_mask(i);
    while (successors != 0) {
      const int64_t s = __builtin_ctzll(successors);
      successors &= successors - 1;
      if (weight[static_cast<size_t>(s)]) continue;  // placed after their inputs below
      const int before = s == combine    ? backward_rank(LayerNode::kCombine)
                         : s == dispatch ? backward_rank(LayerNode::kMlp)
                                         : backward_rank(node[static_cast<size_t>(s)]);
      rank = std::min(rank, before);
    }
    node[static_cast<size_t>(i)] = kBackwardNodes[rank];
  }
  for (int64_t i = 0; i < g.size(); ++i) {
    if (!weight[static_cast<size_t>(i)] || i == combine || i == dispatch) continue;
    int rank = 0;
    for (int64_t p : g.op(i).predecessors) {
      const int after = p == combine    ? backward_rank(LayerNode::kMlp)
                        : p == dispatch ? backward_rank(LayerNode::kAttention)
                                        : backward_rank(node[static_cast<size_t>(p)]);
      rank = std::max(rank, after);
    }
    node[static_cast<size_t>(i)] = kBackwardNodes[rank];
  }
  return node;
}

int64_t index_of(const StrandGraph& g, const std::string& id) { return g.find(id); }

// One block of an order: the forward nodes and the backward parts it runs. A backward part
// is a node's input-gradient work (weight = false) or its weight-gradient work (true).
struct BackwardPart {
  LayerNode node;
  bool weight;
};
struct Phase {
  std::vector<LayerNode> forward;
  std::vector<BackwardPart> backward;
};

std::vector<Phase> phases(HandwrittenOrder order) {
  using N = LayerNode;
  const bool w_with_dispatch = order != HandwrittenOrder::kMegatronA2a;
  Phase second{{N::kDispatch}, {{N::kMlp, false}}};
  Phase third{{N::kMlp}, {{N::kDispatch, false}}};
  (w_with_dispatch ? third : second).backward.push_back({N::kMlp, true});
  return {
      Phase{{N::kAttention}, {{N::kCombine, false}, {N::kCombine, true}}}, second, third,
      Phase{{N::kCombine}, {{N::kDispatch, true}, {N::kAttention, false}, {N::kAttention, true}}}};
}

OpMask forward_mask(const NodeAssignment& nodes, const std::vector<LayerNode>& wanted) {
  OpMask mask = 0;
  for (size_t i = 0; i < nodes.forward.size(); ++i) {
    if (std::find(wanted.begin(), wanted.end(), nodes.forward[i]) != wanted.end()) {
      mask |= OpMask{1} << i;
    }
  }
  return mask;
}

OpMask backward_mask(const NodeAssignment& nodes, const std::vector<BackwardPart>& wanted) {
  OpMask mask = 0;
  for (size_t i = 0; i < nodes.backward.size(); ++i) {
    for (const BackwardPart& part : wanted) {
      if (nodes.backward[i] == part.node && nodes.backward_weight[i] == part.weight) {
        mask |= OpMask{1} << i;
      }
    }
  }
  return mask;
}

void add_block(const BlockCostModel& model, OpMask forward, OpMask backward, PairingResult& out) {
  if (forward == 0 && backward == 0) return;
  PairingBlock block;
  block.forward_ops = forward;
  block.backward_ops = backward;
  block.start_us = out.total_time_us;
  block.simulation = model.simulate(forward, backward);
  block.time_us = block.simulation.time_us;
  out.total_time_us += block.time_us;
  out.blocks.push_back(std::move(block));
}

}  // namespace

NodeAssignment node_assignment(const StrandGraph& forward, const StrandGraph& backward,
                               int64_t forward_dispatch, int64_t forward_combine,
                               int64_t backward_combine, int64_t backward_dispatch,
                               const std::vector<bool>& backward_weight) {
  DHELIX_CHECK(static_cast<int64_t>(backward_weight.size()) == backward.size());
  const bool any = forward_dispatch >= 0 || forward_combine >= 0 || backward_combine >= 0 ||
                   backward_dispatch >= 0;
  const bool all = forward_dispatch >= 0 && forward_combine >= 0 && backward_combine >= 0 &&
                   backward_dispatch >= 0;
  DHELIX_CHECK(any == all);
  NodeAssignment out;
  out.has_all_to_all = all;
  out.forward = forward_nodes(forward, forward_dispatch, forward_combine);
  out.backward = backward_nodes(backward, backward_combine, backward_dispatch, backward_weight);
  out.backward_weight = backward_weight;
  return out;
}

NodeAssignment node_assignment(const LayerDag& forward, const LayerDag& backward) {
  const auto no_time = [](const Op&) { return 0.0; };
  const StrandGraph f = from_layer_dag(forward, no_time);
  const StrandGraph b = from_layer_dag(backward, no_time);
  std::vector<bool> weight;
  for (const StrandOp& op : b.ops()) {
    weight.push_back(backward_work(backward.op(*backward.find(op.id))) ==
                     BackwardWork::kWeightGradient);
  }
  int64_t fd = index_of(f, "fwd.dispatch_a2a"), fc = index_of(f, "fwd.combine_a2a");
  int64_t bc = index_of(b, "bwd.combine_a2a"), bd = index_of(b, "bwd.dispatch_a2a");
  if (fd < 0 || fc < 0 || bc < 0 || bd < 0) fd = fc = bc = bd = -1;  // dense, or ep = 1
  return node_assignment(f, b, fd, fc, bc, bd, weight);
}

PairingResult handwritten_pairing(const BlockCostModel& model, const NodeAssignment& nodes,
                                  HandwrittenOrder order) {
  DHELIX_CHECK(static_cast<int64_t>(nodes.forward.size()) == model.forward().size());
  DHELIX_CHECK(static_cast<int64_t>(nodes.backward.size()) == model.backward().size());
  PairingResult out;
  if (!nodes.has_all_to_all) {
    add_block(model, model.forward().all_ops(), 0, out);
    add_block(model, 0, model.backward().all_ops(), out);
    return out;
  }
  OpMask forward_done = 0, backward_done = 0;
  for (const Phase& phase : phases(order)) {
    const OpMask f = forward_mask(nodes, phase.forward) & ~forward_done;
    const OpMask b = backward_mask(nodes, phase.backward) & ~backward_done;
    forward_done |= f;
    backward_done |= b;
    // Each block's ops must find their inputs in earlier blocks or in the block itself.
    DHELIX_CHECK(model.forward().is_downset(forward_done));
    DHELIX_CHECK(model.backward().is_downset(backward_done));
    add_block(model, f, b, out);
  }
  DHELIX_CHECK(forward_done == model.forward().all_ops());
  DHELIX_CHECK(backward_done == model.backward().all_ops());
  return out;
}

}  // namespace dhelix
