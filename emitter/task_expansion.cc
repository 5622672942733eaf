#include "emitter/task_expansion.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <map>
#include <tuple>

#include "lib/error.h"
#include "lib/plan/plan_blocks.h"

namespace dhelix {
namespace {

// Below this a task's time beyond its layers is rounding (the plan keeps 3 decimals).
constexpr double kExtraEpsilonUs = 0.01;

std::string task_pointer(const PlanStage& stage, const PlanTask& task) {
  return fmt::format("stage {} task {} ({})", stage.stage, task.index, task.label);
}

// Looks up op ids of one pairing.
class OpIndex {
 public:
  explicit OpIndex(const PlanPairing& pairing) {
    for (const auto* ops : {&pairing.forward_ops, &pairing.backward_ops}) {
      for (const PlanOp& op : *ops) ops_.emplace(op.id, &op);
    }
  }
  const PlanOp& at(const std::string& id, const std::string& where) const {
    auto it = ops_.find(id);
    if (it == ops_.end()) {
      throw Error(
          ErrorCode::kInvalidInput,
          fmt::format("plan: {}: block timing names op '{}', which the pairing lacks", where, id));
    }
    return *it->second;
  }

 private:
  std::map<std::string, const PlanOp*> ops_;
};

double expand_layers_alone(const PlanPairing& pairing, const PlanTaskPart& part, bool backward,
                           int64_t first, double start_us, double budget_us,
                           std::vector<ExpandedOp>& out);

// Lays out an SI block task from `start_us`; returns the time it takes: its blocks over
// min(nf, nb) layer pairs, then the longer part's other layers alone at solo times (the
// lowering's order, lib/plan/rank_program.cc).
double expand_si_block(const PlanPairing& pairing, const OpIndex& index, const PlanStage& stage,
                       const PlanTask& task, double start_us, std::vector<ExpandedOp>& out) {
  const PlanTaskPart forward = task.forward.value_or(PlanTaskPart{});
  const PlanTaskPart backward_part = task.backward.value_or(PlanTaskPart{});
  const int64_t pairs = std::min(forward.layers.count, backward_part.layers.count);
  double block_start_us = start_us;
  for (const PlacedBlocks& placed : si_block_sequence(pairing, pairs)) {
    const char* blocks = placed.blocks == &pairing.layer_blocks    ? "layer"
                         : placed.blocks == &pairing.window_blocks ? "window"
                                                                   : "remainder";
    int64_t block_index = 0;
    for (const PlanBlock& block : *placed.blocks) {
      for (const PlanOpTiming& timing : block.timings) {
        const auto [k, id] = split_window_op_id(timing.op);
        const PlanOp& op = index.at(id, task_pointer(stage, task));
        const bool backward = timing.strand == Pass::kBackward;
        const PlanTaskPart& part = backward ? backward_part : forward;
        out.push_back({.name = id,
                       .strand = timing.strand,
                       .stream = op.stream,
                       .group = op.group,
                       .micro_batch = part.micro_batch,
                       .layer = strand_layer(part, backward, placed.first_local_layer + k),
                       .block = block_index,
                       .blocks = blocks,
                       .start_us = block_start_us + timing.start_us,
                       .end_us = block_start_us + timing.finish_us,
                       .approximate = false});
      }
      block_start_us += block.time_us;
      ++block_index;
    }
  }
  const double unbounded = std::numeric_limits<double>::infinity();
  block_start_us +=
      expand_layers_alone(pairing, forward, false, pairs, block_start_us, unbounded, out);
  block_start_us +=
      expand_layers_alone(pairing, backward_part, true, pairs, block_start_us, unbounded, out);
  return block_start_us - start_us;
}

// Lays out layers [first, part.layers.count) of one strand's part back to back at solo
// times, squeezed into `budget_us`.
double expand_layers_alone(const PlanPairing& pairing, const PlanTaskPart& part, bool backward,
                           int64_t first, double start_us, double budget_us,
                           std::vector<ExpandedOp>& out) {
  const std::vector<PlanOp>& ops = backward ? pairing.backward_ops : pairing.forward_ops;
  double layer_us = 0;
  for (const PlanOp& op : ops) layer_us += op.solo_us;
  const double total_us = layer_us * static_cast<double>(part.layers.count - first);
  const double scale = total_us > budget_us && total_us > 0 ? budget_us / total_us : 1.0;
  double t = start_us;
  for (int64_t j = first; j < part.layers.count; ++j) {
    for (const PlanOp& op : ops) {
      const double end_us = t + op.solo_us * scale;
      out.push_back({.name = op.id,
                     .strand = backward ? Pass::kBackward : Pass::kForward,
                     .stream = op.stream,
                     .group = op.group,
                     .micro_batch = part.micro_batch,
                     .layer = strand_layer(part, backward, j),
                     .block = -1,
                     .blocks = "",
                     .start_us = t,
                     .end_us = end_us,
                     .approximate = true});
      t = end_us;
    }
  }
  return t - start_us;
}

// A strand-alone task: its part's layers back to back (expand_layers_alone).
double expand_alone(const PlanPairing& pairing, const PlanTask& task, double start_us,
                    double budget_us, std::vector<ExpandedOp>& out) {
  const bool backward = task.kind == TaskKind::kBackward;
  const PlanTaskPart part = (backward ? task.backward : task.forward).value_or(PlanTaskPart{});
  return expand_layers_alone(pairing, part, backward, 0, start_us, budget_us, out);
}

ExpandedOp extra_step(std::string name, int64_t micro_batch, double start_us, double end_us) {
  return {.name = std::move(name),
          .strand = std::nullopt,
          .stream = StreamClass::kCompute,
          .group = std::nullopt,
          .micro_batch = micro_batch,
          .layer = -1,
          .block = -1,
          .blocks = "",
          .start_us = start_us,
          .end_us = end_us,
          .approximate = false};
}

// The chunk holding layer 0: the down chunk, the whole stage, or model chunk 0.
bool first_chunk(const std::optional<PlanTaskPart>& part) {
  return part && (part->chunk == ChunkSide::kDown || part->chunk == ChunkSide::kWhole) &&
         part->model_chunk.value_or(0) == 0;
}

// Lays out the task's layers and its extra time (the embedding, see the file comment).
void expand_layers(const Plan& plan, const PlanStage& stage, const PlanTask& task,
                   std::vector<ExpandedOp>& out) {
  if (stage.pairing < 0 || stage.pairing >= static_cast<int64_t>(plan.pairings.size())) {
    throw Error(ErrorCode::kInvalidInput,
                fmt::format("plan: stage {}: pairing {} does not exist ({} pairings)", stage.stage,
                            stage.pairing, plan.pairings.size()));
  }
  const PlanPairing& pairing = plan.pairings[static_cast<size_t>(stage.pairing)];
  const double duration_us = task.end_us - task.start_us;
  const bool embedding_forward = stage.embedding && first_chunk(task.forward);
  const bool embedding_backward = stage.embedding && first_chunk(task.backward);
  // Measure the layers first, so that a forward embedding can go before them.
  std::vector<ExpandedOp> layers;
  const double layers_us = task.kind == TaskKind::kSiBlock
                               ? expand_si_block(pairing, OpIndex(pairing), stage, task, 0, layers)
                               : expand_alone(pairing, task, 0, duration_us, layers);
  const double extra_us = duration_us - layers_us;
  const bool extra_first = extra_us > kExtraEpsilonUs && embedding_forward;
  const double shift_us = task.start_us + (extra_first ? extra_us : 0);
  for (ExpandedOp& op : layers) {
    op.start_us += shift_us;
    op.end_us += shift_us;
    out.push_back(std::move(op));
  }
  if (extra_us <= kExtraEpsilonUs) return;
  if (extra_first) {
    out.push_back(extra_step("embedding.fwd", task.forward->micro_batch, task.start_us,
                             task.start_us + extra_us));
  } else {
    out.push_back(extra_step(embedding_backward ? "embedding.bwd" : "other",
                             embedding_backward ? task.backward->micro_batch : -1,
                             task.end_us - extra_us, task.end_us));
  }
}

}  // namespace

const char* stream_title(StreamClass stream) {
  switch (stream) {
    case StreamClass::kCompute:
      return "compute";
    case StreamClass::kLocalComm:
      return "local comm";
    case StreamClass::kCrossComm:
      return "cross comm";
  }
  return "?";
}

std::vector<ExpandedOp> expand_task(const Plan& plan, const PlanStage& stage,
                                    const PlanTask& task) {
  std::vector<ExpandedOp> out;
  if (task.kind == TaskKind::kHeadLoss) {
    out.push_back(extra_step("head_loss", task.head_loss_micro_batch, task.start_us, task.end_us));
    return out;
  }
  expand_layers(plan, stage, task, out);
  std::stable_sort(out.begin(), out.end(), [&](const ExpandedOp& a, const ExpandedOp& b) {
    return std::make_tuple(a.start_us, a.stream, a.name) <
           std::make_tuple(b.start_us, b.stream, b.name);
  });
  return out;
}

}  // namespace dhelix
