#include "planner/strand_graph.h"

#include <algorithm>
#include <utility>

#include "lib/error.h"

namespace dhelix {

const char* strand_name(Strand strand) {
  switch (strand) {
    case Strand::kForward:
      return "fwd";
    case Strand::kBackward:
      return "bwd";
  }
  return "?";
}

int64_t StrandGraph::add_op(std::string id, StreamClass stream, double solo_time_us,
                            std::vector<int64_t> predecessors, std::string cost_key,
                            bool fsdp_collective) {
  const int64_t index = size();
  DHELIX_CHECK_MSG(index < kMaxStrandOps, "a strand holds at most 64 ops");
  DHELIX_CHECK_MSG(find(id) < 0, "duplicate op id " + id);
  DHELIX_CHECK(solo_time_us >= 0);
  std::sort(predecessors.begin(), predecessors.end());
  predecessors.erase(std::unique(predecessors.begin(), predecessors.end()), predecessors.end());
  OpMask pred_mask = 0;
  for (int64_t p : predecessors) {
    DHELIX_CHECK_MSG(p >= 0 && p < index, "predecessor must be an earlier op: " + id);
    pred_mask |= OpMask{1} << p;
    successor_masks_[p] |= OpMask{1} << index;
  }
  StrandOp op;
  op.cost_key = cost_key.empty() ? id : std::move(cost_key);
  op.id = std::move(id);
  op.stream = stream;
  op.solo_time_us = solo_time_us;
  op.predecessors = std::move(predecessors);
  op.fsdp_collective = fsdp_collective;
  ops_.push_back(std::move(op));
  predecessor_masks_.push_back(pred_mask);
  successor_masks_.push_back(0);

  // Tails change only for the new op's ancestors; recompute all (graphs are tiny).
  tail_time_us_.assign(ops_.size(), 0.0);
  for (int64_t i = size() - 1; i >= 0; --i) {
    double longest_successor = 0;
    for (OpMask s = successor_masks_[i]; s != 0; s &= s - 1) {
      longest_successor = std::max(longest_successor, tail_time_us_[__builtin_ctzll(s)]);
    }
    tail_time_us_[i] = ops_[i].solo_time_us + longest_successor;
  }
  return index;
}

int64_t StrandGraph::find(const std::string& id) const {
  for (int64_t i = 0; i < size(); ++i) {
    if (ops_[i].id == id) return i;
  }
  return -1;
}

OpMask StrandGraph::all_ops() const {
  return size() == kMaxStrandOps ? ~OpMask{0} : (OpMask{1} << size()) - 1;
}

OpMask StrandGraph::stream_mask(StreamClass stream) const {
  OpMask mask = 0;
  for (int64_t i = 0; i < size(); ++i) {
    if (ops_[i].stream == stream) mask |= OpMask{1} << i;
  }
  return mask;
}

bool StrandGraph::is_downset(OpMask mask) const {
  if ((mask & ~all_ops()) != 0) return false;
  for (OpMask m = mask; m != 0; m &= m - 1) {
    if ((predecessor_masks_[__builtin_ctzll(m)] & ~mask) != 0) return false;
  }
  return true;
}

double StrandGraph::solo_time_sum_us(OpMask mask) const {
  double sum = 0;
  for (OpMask m = mask; m != 0; m &= m - 1) sum += ops_[__builtin_ctzll(m)].solo_time_us;
  return sum;
}

StrandGraph concatenate_layers(const std::vector<StrandGraph>& layers) {
  StrandGraph out;
  std::vector<int64_t> previous_sinks;
  for (size_t k = 0; k < layers.size(); ++k) {
    const StrandGraph& layer = layers[k];
    const int64_t base = out.size();
    DHELIX_CHECK_MSG(base + layer.size() <= kMaxStrandOps, "concatenated layers exceed 64 ops");
    std::vector<int64_t> sinks;
    OpMask fsdp = 0;  // what a sink may still have after it
    for (int64_t i = 0; i < layer.size(); ++i) {
      if (layer.op(i).fsdp_collective) fsdp |= OpMask{1} << i;
    }
    for (int64_t i = 0; i < layer.size(); ++i) {
      const StrandOp& op = layer.op(i);
      std::vector<int64_t> preds;
      for (int64_t p : op.predecessors) preds.push_back(base + p);
      // The layer's first ops (no predecessor but FSDP's parameter gathers) follow the
      // previous layer's sinks; a gather follows nothing, a reduce-scatter holds up nothing.
      const bool first = !op.fsdp_collective &&
                         std::all_of(op.predecessors.begin(), op.predecessors.end(),
                                     [&layer](int64_t p) { return layer.op(p).fsdp_collective; });
      if (first) preds.insert(preds.end(), previous_sinks.begin(), previous_sinks.end());
      out.add_op("L" + std::to_string(k) + "." + op.id, op.stream, op.solo_time_us,
                 std::move(preds), op.cost_key, op.fsdp_collective);
      if (!op.fsdp_collective && (layer.successor_mask(i) & ~fsdp) == 0) sinks.push_back(base + i);
    }
    previous_sinks = std::move(sinks);
  }
  return out;
}

}  // namespace dhelix
