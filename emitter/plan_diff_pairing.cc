// The pairing part of diff_plans: stages, and the SI block templates matched by op content.
//
// Matching runs in two passes over one block list (layer, window or remainder) of A and B:
//   1. exact: each block of A takes the first unclaimed block of B with the same forward and
//      backward op lists -> kSame, or kRetimed when its time differs;
//   2. overlap: each block of A left takes the unclaimed block of B sharing the most ops
//      (ties: the lower index) -> kChanged, with the ops that moved in and out.
// Blocks of A still unclaimed were removed, blocks of B still unclaimed were added.
// E.g. A = [{f1,b1}, {f2,b2}], B = [{f2,b2}, {f1,b3}]: {f2,b2} is the same block (A1 = B0),
// {f1,b1} -> {f1,b3} changed (+b3, -b1).

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "emitter/plan_diff_internal.h"

namespace dhelix::diff_detail {
namespace {

std::set<std::string> block_ops(const PlanBlock& block) {
  std::set<std::string> ops(block.forward_ops.begin(), block.forward_ops.end());
  ops.insert(block.backward_ops.begin(), block.backward_ops.end());
  return ops;
}

std::vector<std::string> difference(const std::set<std::string>& from,
                                    const std::set<std::string>& minus) {
  std::vector<std::string> out;
  std::set_difference(from.begin(), from.end(), minus.begin(), minus.end(),
                      std::back_inserter(out));
  return out;
}

int64_t shared_ops(const std::set<std::string>& x, const std::set<std::string>& y) {
  int64_t count = 0;
  for (const std::string& op : x) count += y.count(op) > 0 ? 1 : 0;
  return count;
}

BlockDiff matched(const std::string& list, const std::vector<PlanBlock>& a,
                  const std::vector<PlanBlock>& b, size_t i, size_t j) {
  BlockDiff out;
  out.list = list;
  out.index_a = static_cast<int64_t>(i);
  out.index_b = static_cast<int64_t>(j);
  out.time_a_us = a[i].time_us;
  out.time_b_us = b[j].time_us;
  return out;
}

// Appends the diffs of one block list (see the file comment) in A's order, then added ones.
void diff_block_list(const std::string& list, const std::vector<PlanBlock>& a,
                     const std::vector<PlanBlock>& b, double tolerance,
                     std::vector<BlockDiff>& out) {
  std::vector<int64_t> match(a.size(), -1);
  std::vector<bool> claimed(b.size(), false);
  for (size_t i = 0; i < a.size(); ++i) {
    for (size_t j = 0; j < b.size(); ++j) {
      if (claimed[j] || a[i].forward_ops != b[j].forward_ops ||
          a[i].backward_ops != b[j].backward_ops) {
        continue;
      }
      match[i] = static_cast<int64_t>(j);
      claimed[j] = true;
      break;
    }
  }
  std::vector<bool> exact(a.size());
  for (size_t i = 0; i < a.size(); ++i) exact[i] = match[i] >= 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (match[i] >= 0) continue;
    const std::set<std::string> ops_a = block_ops(a[i]);
    int64_t best = -1, best_shared = 0;
    for (size_t j = 0; j < b.size(); ++j) {
      if (claimed[j]) continue;
      const int64_t shared = shared_ops(ops_a, block_ops(b[j]));
      if (shared > best_shared) best = static_cast<int64_t>(j), best_shared = shared;
    }
    if (best >= 0) match[i] = best, claimed[static_cast<size_t>(best)] = true;
  }
  for (size_t i = 0; i < a.size(); ++i) {
    if (match[i] < 0) {
      BlockDiff removed;
      removed.list = list;
      removed.index_a = static_cast<int64_t>(i);
      removed.status = BlockStatus::kRemoved;
      removed.time_a_us = a[i].time_us;
      removed.ops_removed = difference(block_ops(a[i]), {});
      out.push_back(std::move(removed));
      continue;
    }
    const size_t j = static_cast<size_t>(match[i]);
    BlockDiff diff = matched(list, a, b, i, j);
    if (exact[i]) {
      diff.status = numbers_differ(a[i].time_us, b[j].time_us, tolerance) ? BlockStatus::kRetimed
                                                                          : BlockStatus::kSame;
    } else {
      diff.status = BlockStatus::kChanged;
      diff.ops_added = difference(block_ops(b[j]), block_ops(a[i]));
      diff.ops_removed = difference(block_ops(a[i]), block_ops(b[j]));
    }
    out.push_back(std::move(diff));
  }
  for (size_t j = 0; j < b.size(); ++j) {
    if (claimed[j]) continue;
    BlockDiff added;
    added.list = list;
    added.index_b = static_cast<int64_t>(j);
    added.status = BlockStatus::kAdded;
    added.time_b_us = b[j].time_us;
    added.ops_added = difference(block_ops(b[j]), {});
    out.push_back(std::move(added));
  }
}

void add_field(std::vector<FieldChange>& out, std::string field, const OrderedJson& a,
               const OrderedJson& b) {
  if (a != b) out.push_back({std::move(field), a.dump(), b.dump()});
}

int64_t ops_retimed(const std::vector<PlanOp>& a, const std::vector<PlanOp>& b, double tolerance) {
  std::map<std::string, double> solo_b;
  for (const PlanOp& op : b) solo_b[op.id] = op.solo_us;
  int64_t count = 0;
  for (const PlanOp& op : a) {
    const auto it = solo_b.find(op.id);
    if (it != solo_b.end() && numbers_differ(op.solo_us, it->second, tolerance)) ++count;
  }
  return count;
}

PairingDiff diff_pairing(const PlanPairing& a, const PlanPairing& b, double tolerance) {
  PairingDiff out;
  add_field(out.fields, "scope", kPairingScopeNames.name(a.scope),
            kPairingScopeNames.name(b.scope));
  add_field(out.fields, "chunk_layers", a.chunk_layers, b.chunk_layers);
  add_field(out.fields, "window_layers", a.window_layers, b.window_layers);
  add_field(out.fields, "layer_segment_bound", a.layer_segment_bound, b.layer_segment_bound);
  add_field(out.fields, "window_segment_bound", a.window_segment_bound, b.window_segment_bound);
  const std::vector<std::pair<std::string, std::pair<double, double>>> times = {
      {"layer_scope_us", {a.layer_scope_us, b.layer_scope_us}},
      {"chunk_scope_us", {a.chunk_scope_us, b.chunk_scope_us}},
      {"sequential_us", {a.sequential_us, b.sequential_us}},
      {"layer_pair_us", {a.layer_pair_us, b.layer_pair_us}},
  };
  for (const auto& [field, values] : times) {
    out.times.push_back(number_change(field, values.first, values.second, tolerance));
  }
  diff_block_list("layer", a.layer_blocks, b.layer_blocks, tolerance, out.blocks);
  diff_block_list("window", a.window_blocks, b.window_blocks, tolerance, out.blocks);
  diff_block_list("remainder", a.remainder_blocks, b.remainder_blocks, tolerance, out.blocks);
  out.ops_retimed = ops_retimed(a.forward_ops, b.forward_ops, tolerance) +
                    ops_retimed(a.backward_ops, b.backward_ops, tolerance);
  return out;
}

OrderedJson range_json(const PlanLayerRange& range) {
  return OrderedJson{{"first", range.first}, {"count", range.count}};
}

OrderedJson ranges_json(const std::vector<PlanLayerRange>& ranges) {
  OrderedJson out = OrderedJson::array();
  for (const PlanLayerRange& range : ranges) out.push_back(range_json(range));
  return out;
}

void diff_stage(const PlanStage& a, const PlanStage& b, std::vector<FieldChange>& out) {
  const std::string prefix = "stage." + std::to_string(a.stage) + ".";
  add_field(out, prefix + "ranks", static_cast<int64_t>(a.ranks.size()),
            static_cast<int64_t>(b.ranks.size()));
  add_field(out, prefix + "down_layers", range_json(a.down_layers), range_json(b.down_layers));
  add_field(out, prefix + "up_layers", range_json(a.up_layers), range_json(b.up_layers));
  add_field(out, prefix + "model_chunks", ranges_json(a.model_chunks),
            ranges_json(b.model_chunks));  // interleaved stages'; [] on every other shape
  add_field(out, prefix + "embedding", a.embedding, b.embedding);
  add_field(out, prefix + "head_loss", a.head_loss, b.head_loss);
  add_field(out, prefix + "tasks", static_cast<int64_t>(a.tasks.size()),
            static_cast<int64_t>(b.tasks.size()));
}

bool valid_pairing(const Plan& plan, const PlanStage& stage) {
  return stage.pairing >= 0 && stage.pairing < static_cast<int64_t>(plan.pairings.size());
}

}  // namespace

PairingSection diff_pairing_section(const Plan& a, const Plan& b, double relative_tolerance) {
  PairingSection out;
  out.stages_a = static_cast<int64_t>(a.stages.size());
  out.stages_b = static_cast<int64_t>(b.stages.size());
  // (pairing of A, pairing of B) -> index in out.pairings, so shared templates appear once.
  std::map<std::pair<int64_t, int64_t>, size_t> seen;
  const size_t common = std::min(a.stages.size(), b.stages.size());
  for (size_t s = 0; s < common; ++s) {
    const PlanStage& stage_a = a.stages[s];
    const PlanStage& stage_b = b.stages[s];
    diff_stage(stage_a, stage_b, out.stage_fields);
    if (!valid_pairing(a, stage_a) || !valid_pairing(b, stage_b)) continue;
    const std::pair<int64_t, int64_t> key{stage_a.pairing, stage_b.pairing};
    const auto it = seen.find(key);
    if (it != seen.end()) {
      out.pairings[it->second].stages.push_back(static_cast<int64_t>(s));
      continue;
    }
    PairingDiff diff =
        diff_pairing(a.pairings[static_cast<size_t>(key.first)],
                     b.pairings[static_cast<size_t>(key.second)], relative_tolerance);
    diff.stages = {static_cast<int64_t>(s)};
    diff.pairing_a = key.first;
    diff.pairing_b = key.second;
    seen.emplace(key, out.pairings.size());
    out.pairings.push_back(std::move(diff));
  }
  return out;
}

}  // namespace dhelix::diff_detail
