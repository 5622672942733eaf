// Tasks -> instructions: the lowering of a stage's task list into one rank's program (see
// lib/plan/rank_program.h). Pipeline transfers are lib/plan/pipeline_transfers.h's job,
// barriers and positions lib/plan/program_builder.h's.

#include "lib/plan/rank_program.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <map>
#include <unordered_map>
#include <utility>

#include "lib/error.h"
#include "lib/placement.h"
#include "lib/plan/pipeline_transfers.h"
#include "lib/plan/plan_blocks.h"
#include "lib/plan/program_builder.h"
#include "lib/plan/rank_dags.h"

namespace dhelix {
namespace {

// One op of a template block, resolved against the layer DAGs once per block.
struct ResolvedTiming {
  int64_t window_layer = 0;  // k of "L<k>."
  bool backward = false;
  int64_t index = 0;  // in the strand's layer DAG
};

class Lowering {
 public:
  Lowering(const Plan& plan, const JobSpec& job, const RankLoweringInput& input,
           ExecutionMode mode);
  RankProgram run();

 private:
  Instruction from_op(const DagView& view, int64_t index, int64_t micro_batch, int64_t layer) const;
  int64_t& produced(int64_t micro_batch, int64_t layer, const DagView& view, int64_t index);
  const std::vector<ResolvedTiming>& resolve(const PlanBlock& block);

  void lower_task(const PlanTask& task);
  void lower_si_blocks(const PlanTask& task);
  void lower_forward_part(const PlanTaskPart& part);
  void lower_backward_part(const PlanTaskPart& part);
  void claim_backward_share(const PlanTaskPart& part, int64_t layer);
  void check_weights_ran();
  void lower_head_loss(int64_t micro_batch);

  void emit_layer_op(bool backward, int64_t index, int64_t micro_batch, int64_t layer,
                     bool beside = false);
  // FSDP prefetch across SI blocks (see the file comment of rank_program.h).
  struct Prefetch {
    std::vector<int64_t> forward, backward;  // the layer ops the pairing's blocks leave out
    // Per strand (0 forward, 1 backward): the task's layers whose gathers are issued, and
    // whether the next SI task's first layer's are.
    std::array<int64_t, 2> reached{};
    std::array<bool, 2> next_task_first{};
    std::vector<std::pair<int64_t, int64_t>> scatters;  // (layer, backward op) not yet issued
  };
  std::vector<int64_t> left_out(const DagView& view, const std::vector<PlanOp>& records) const;
  void issue_gathers(const PlanTask& task, bool backward, int64_t j);
  void note_scatters(const PlanTask& task, int64_t j);
  void issue_ready_scatters(int64_t micro_batch, bool all);
  Prefetch prefetch_;
  void emit_extra_op(bool backward, int64_t index, int64_t micro_batch);
  std::vector<int64_t> predecessor_deps(const DagView& view, int64_t index, int64_t micro_batch,
                                        int64_t layer);

  const Plan& plan_;
  const PlanStage& stage_;
  const PlanPairing& pairing_;
  int64_t num_layers_ = 0;
  ProgramBuilder program_;
  PipelineTransfers transfers_;
  const RankDags& dags_;
  std::unordered_map<const PlanBlock*, std::vector<ResolvedTiming>> resolved_;
  // The instruction that produced each (micro-batch, layer + 1, DAG slot); -1: not yet.
  std::vector<int64_t> produced_;
  // Per (micro-batch, layer): which share of its backward has run, and the task of its I.
  struct BackwardRun {
    bool whole = false, input = false, weight = false;
    int64_t input_task = -1;
  };
  std::map<std::pair<int64_t, int64_t>, BackwardRun> backward_runs_;
  int64_t task_index_ = -1;
};

// Placement first: a rank outside the job is refused before anything reads the plan.
Placement checked_placement(const JobSpec& job, int64_t rank) {
  Placement placement(job.parallel, job.cluster.gpus_per_node);
  if (rank < 0 || rank >= placement.world_size()) {
    throw Error(ErrorCode::kInvalidInput,
                fmt::format("plan: rank {} does not exist: the plan's job has {} ranks", rank,
                            placement.world_size()));
  }
  return placement;
}

// The index in plan.stages of the (last) stage numbered `pp`, which must list `rank`.
size_t find_stage(const Plan& plan, int64_t pp, int64_t rank) {
  std::optional<size_t> found;
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    if (plan.stages[s].stage == pp) found = s;
  }
  if (!found) {
    throw Error(ErrorCode::kInvalidInput,
                fmt::format("plan: stage -1 task -1: no stage {} for rank {}", pp, rank));
  }
  const PlanStage& stage = plan.stages[*found];
  if (std::find(stage.ranks.begin(), stage.ranks.end(), rank) == stage.ranks.end()) {
    throw Error(
        ErrorCode::kInvalidInput,
        fmt::format("plan: stage {} task -1: rank {} is not among the stage's ranks", pp, rank));
  }
  if (stage.pairing < 0 || stage.pairing >= static_cast<int64_t>(plan.pairings.size())) {
    throw Error(ErrorCode::kInvalidInput,
                fmt::format("plan: stage {} task -1: pairing {} does not exist ({} pairings)", pp,
                            stage.pairing, plan.pairings.size()));
  }
  return *found;
}

Lowering::Lowering(const Plan& plan, const JobSpec& job, const RankLoweringInput& input,
                   ExecutionMode mode)
    : plan_(plan),
      stage_(plan.stages[input.stage_index()]),
      pairing_(plan.pairings[static_cast<size_t>(stage_.pairing)]),
      num_layers_(job.model.num_layers),
      program_(-1, stage_.stage, mode),
      transfers_(plan, job, program_),
      dags_(input.dags()) {
  const int64_t micro_batches = std::max<int64_t>(plan_.num_micro_batches, 0);
  produced_.assign(static_cast<size_t>(micro_batches * (num_layers_ + 1) * dags_.slots), -1);
  prefetch_.forward = left_out(dags_.layer_forward, pairing_.forward_ops);
  prefetch_.backward = left_out(dags_.layer_backward, pairing_.backward_ops);
}

int64_t& Lowering::produced(int64_t micro_batch, int64_t layer, const DagView& view,
                            int64_t index) {
  if (micro_batch < 0 || micro_batch >= plan_.num_micro_batches) {
    program_.fail(
        fmt::format("micro-batch {} is outside 0..{}", micro_batch, plan_.num_micro_batches - 1));
  }
  const int64_t row = micro_batch * (num_layers_ + 1) + (layer + 1);
  return produced_[static_cast<size_t>(row * dags_.slots + view.slot_offset + index)];
}

const std::vector<ResolvedTiming>& Lowering::resolve(const PlanBlock& block) {
  auto [it, inserted] = resolved_.try_emplace(&block);
  if (!inserted) return it->second;
  for (const PlanOpTiming& timing : block.timings) {
    const auto [k, id] = split_window_op_id(timing.op);
    const bool backward = timing.strand == Pass::kBackward;
    const auto index = (backward ? dags_.layer_backward : dags_.layer_forward).find(id);
    if (!index)
      program_.fail(fmt::format("block op '{}' is not in this job's layer DAG", timing.op));
    it->second.push_back({k, backward, *index});
  }
  return it->second;
}

Instruction Lowering::from_op(const DagView& view, int64_t index, int64_t micro_batch,
                              int64_t layer) const {
  const LoweredOp& op = view.ops[static_cast<size_t>(index)];
  Instruction out;
  const bool comm = is_communication(op.kind);
  out.kind = comm ? InstructionKind::kCollective : InstructionKind::kCompute;
  out.op = dags_.id(view, index);
  out.layer = layer;
  out.micro_batch = micro_batch;
  out.stream = op.stream;
  if (comm) {
    out.group = op.group;
    out.collective = op.kind;
    out.bytes = op.comm_bytes;
  }
  return out;
}

// ----- tasks ----------------------------------------------------------------------------

RankProgram Lowering::run() {
  for (const PlanTask& task : stage_.tasks) {
    program_.begin_task(task.index);
    task_index_ = task.index;
    lower_task(task);
  }
  check_weights_ran();
  RankProgram program = program_.take();
  program.op_ids = dags_.op_ids;
  return program;
}

void Lowering::lower_task(const PlanTask& task) {
  if (task.kind == TaskKind::kHeadLoss) {
    if (!stage_.head_loss) program_.fail("a head_loss task on a stage without the head");
    lower_head_loss(task.head_loss_micro_batch);
    return;
  }
  // The reader refuses these too; a plan built in memory (or by another writer) meets them
  // here, so that no program runs a part of a backward the rules do not allow.
  if (task.forward && task.forward->work != BackwardShare::kWhole) {
    program_.fail("a forward part runs whole; only a backward part may be split");
  }
  if (task.backward && task.backward->work != BackwardShare::kWhole &&
      task.kind != TaskKind::kBackward) {
    program_.fail(
        fmt::format("a {} part inside a {} task: only a task of kind backward may "
                    "split its backward; an SI block's backward runs whole",
                    backward_share_name(task.backward->work), task_kind_name(task.kind)));
  }
  if (task.kind == TaskKind::kSiBlock && program_.mode() == ExecutionMode::kCoExecuted) {
    lower_si_blocks(task);
    return;
  }
  if (task.forward) lower_forward_part(*task.forward);
  if (task.backward) lower_backward_part(*task.backward);
}

void Lowering::lower_forward_part(const PlanTaskPart& part) {
  if (stage_.embedding && part.layers.first == 0) {
    for (int64_t i : dags_.embedding_forward_order) emit_extra_op(false, i, part.micro_batch);
  }
  for (int64_t j = 0; j < part.layers.count; ++j) {
    const int64_t layer = strand_layer(part, false, j);
    for (int64_t i : dags_.layer_forward.order) emit_layer_op(false, i, part.micro_batch, layer);
  }
}

// A split backward (part.work input or weight) emits the layers' ops in the same order as a
// whole one, I without the weight-gradient GEMMs, W only those; the embedding's backward
// belongs to I (the next stage down waits for nothing of it, but it is no weight GEMM).
void Lowering::lower_backward_part(const PlanTaskPart& part) {
  const DagView& view = dags_.layer_backward;
  for (int64_t j = 0; j < part.layers.count; ++j) {
    const int64_t layer = strand_layer(part, true, j);
    claim_backward_share(part, layer);
    for (int64_t i : view.order) {
      const bool weight = view.ops[static_cast<size_t>(i)].weight_gradient;
      if ((part.work == BackwardShare::kInput && weight) ||
          (part.work == BackwardShare::kWeight && !weight)) {
        continue;
      }
      emit_layer_op(true, i, part.micro_batch, layer);
    }
  }
  if (part.work == BackwardShare::kWeight) return;
  if (stage_.embedding && part.layers.first == 0) {
    for (int64_t i : dags_.embedding_backward_order) emit_extra_op(true, i, part.micro_batch);
  }
}

// The split rules (docs/plan.md, "Split backward"): per micro-batch and layer the backward
// runs once, whole or as one input part I and then one weight part W, never both ways.
void Lowering::claim_backward_share(const PlanTaskPart& part, int64_t layer) {
  BackwardRun& run = backward_runs_[{part.micro_batch, layer}];
  const std::string what = fmt::format("backward of micro-batch {} chunk {} (layer {})",
                                       part.micro_batch, chunk_side_name(part.chunk), layer);
  const bool split = run.input || run.weight;
  switch (part.work) {
    case BackwardShare::kWhole:
      if (split) {
        program_.fail(
            fmt::format("{}: a whole backward after its {} part: a backward runs "
                        "whole or split into input (I) and weight (W), not both",
                        what, run.weight ? "weight" : "input"));
      }
      if (run.whole) program_.fail(fmt::format("{}: the whole backward runs twice", what));
      run.whole = true;
      return;
    case BackwardShare::kInput:
      if (run.whole) {
        program_.fail(
            fmt::format("{}: an input part (I) after the whole backward: a backward "
                        "runs whole or split into input (I) and weight (W), not both",
                        what));
      }
      if (run.input) program_.fail(fmt::format("{}: the input part (I) runs twice", what));
      run.input = true;
      run.input_task = task_index_;
      return;
    case BackwardShare::kWeight:
      if (run.whole) {
        program_.fail(
            fmt::format("{}: a weight part (W) after the whole backward: a backward "
                        "runs whole or split into input (I) and weight (W), not both",
                        what));
      }
      if (!run.input) {
        program_.fail(
            fmt::format("{}: the weight part (W) has no earlier input part (I) on "
                        "the stage: a W reads what its I computed",
                        what));
      }
      if (run.weight) program_.fail(fmt::format("{}: the weight part (W) runs twice", what));
      run.weight = true;
      return;
  }
}

void Lowering::check_weights_ran() {
  for (const auto& [key, run] : backward_runs_) {
    if (!run.input || run.weight) continue;
    program_.fail_at(run.input_task,
                     fmt::format("backward of micro-batch {} layer {}: the input part (I) has no "
                                 "weight part (W) later on the stage: its weights would get no "
                                 "gradient",
                                 key.first, key.second));
  }
}

void Lowering::lower_head_loss(int64_t micro_batch) {
  for (int64_t i : dags_.head_forward_order) emit_extra_op(false, i, micro_batch);
  for (int64_t i : dags_.head_backward_order) emit_extra_op(true, i, micro_batch);
}

// An SI block pairs min(nf, nb) layers of its forward and backward parts, block by block;
// the other |nf - nb| layers of the longer part (the folded stage 0 of an uneven split,
// docs/pipeline.md) then run alone, continuing that part's walk, as the simulator times
// the block (planner/pipeline_simulator.h, "Uneven stages").
void Lowering::lower_si_blocks(const PlanTask& task) {
  if (!task.forward || !task.backward) {
    program_.fail("an SI block task needs a forward and a backward part");
  }
  const PlanTaskPart& forward = *task.forward;
  const PlanTaskPart& backward = *task.backward;
  const int64_t pairs = std::min(forward.layers.count, backward.layers.count);
  if (stage_.embedding && forward.layers.first == 0) {
    for (int64_t i : dags_.embedding_forward_order) emit_extra_op(false, i, forward.micro_batch);
  }
  for (int64_t j = 0; j < backward.layers.count; ++j) {
    claim_backward_share(backward, strand_layer(backward, true, j));
  }
  int64_t block = 0;
  const std::array<bool, 2> carried = prefetch_.next_task_first;
  const PlanTask* next = next_si_block_task(stage_, task);
  prefetch_.reached = {};
  prefetch_.next_task_first = {};
  prefetch_.scatters.clear();
  // Issues strand s's gathers (and notes the backward's scatters) up to its layer `up_to`.
  const auto reach = [&](size_t s, int64_t up_to) {
    while (prefetch_.reached[s] <= std::min(up_to, pairs - 1)) {
      const int64_t j = prefetch_.reached[s]++;
      if (j > 0 || !carried[s]) issue_gathers(task, s == 1, j);
      if (s == 1) note_scatters(task, j);
    }
  };
  for (const PlacedBlocks& placed : si_block_sequence(pairing_, pairs)) {
    for (const PlanBlock& template_block : *placed.blocks) {
      program_.begin_block(block++);
      for (const ResolvedTiming& timing : resolve(template_block)) {
        const PlanTaskPart& part = timing.backward ? backward : forward;
        const int64_t local = placed.first_local_layer + timing.window_layer;
        const size_t strand = timing.backward ? 1 : 0;
        // The task's first op issues both strands' first layers' gathers (unless the task
        // before issued them); a strand's layer's first op its next layer's, its last
        // layer's first op the next SI task's first layer's: two layers of each strand
        // gathered at once, as planner/memory_model.h counts (a strand that lags holds no
        // more than one ahead).
        reach(0, 0);
        reach(1, 0);
        reach(strand, local + 1);
        if (local == pairs - 1 && next != nullptr && !prefetch_.next_task_first[strand]) {
          issue_gathers(*next, timing.backward, 0);
          prefetch_.next_task_first[strand] = true;
        }
        emit_layer_op(timing.backward, timing.index, part.micro_batch,
                      strand_layer(part, timing.backward, local));
      }
      issue_ready_scatters(backward.micro_batch, false);
    }
  }
  program_.begin_block(-1);
  issue_ready_scatters(backward.micro_batch, true);
  for (int64_t j = pairs; j < forward.layers.count; ++j) {
    const int64_t layer = strand_layer(forward, false, j);
    for (int64_t i : dags_.layer_forward.order) emit_layer_op(false, i, forward.micro_batch, layer);
  }
  for (int64_t j = pairs; j < backward.layers.count; ++j) {
    const int64_t layer = strand_layer(backward, true, j);
    for (int64_t i : dags_.layer_backward.order) {
      emit_layer_op(true, i, backward.micro_batch, layer);
    }
  }
  if (stage_.embedding && backward.layers.first == 0) {
    for (int64_t i : dags_.embedding_backward_order) emit_extra_op(true, i, backward.micro_batch);
  }
}

// ----- FSDP prefetch across SI blocks ---------------------------------------------------

// The ops of `view` that no record of the pairing names; only FSDP's gathers and gradient
// reduce-scatters may be left out (planner/fsdp_si_prefetch.h moves them out of the blocks).
std::vector<int64_t> Lowering::left_out(const DagView& view,
                                        const std::vector<PlanOp>& records) const {
  std::vector<int64_t> out;
  for (int64_t i = 0; i < view.size(); ++i) {
    const LoweredOp& op = view.ops[static_cast<size_t>(i)];
    const bool named = std::any_of(records.begin(), records.end(),
                                   [&op](const PlanOp& r) { return r.id == op.id; });
    if (named) continue;
    const bool scatter = op.kind == OpKind::kReduceScatter && op.group == ParallelDim::kDp;
    if (!op.parameters_only && !scatter) {
      program_.fail(
          fmt::format("{} is in no record of pairing {}: only FSDP's parameter "
                      "gathers and gradient reduce-scatters may be left out",
                      op.id, stage_.pairing));
    }
    out.push_back(i);
  }
  return out;
}

// The left-out gathers of the task's strand's `j`-th layer, beside the block: no later
// barrier waits for them, only their readers (and their stream's order) do.
void Lowering::issue_gathers(const PlanTask& task, bool backward, int64_t j) {
  const PlanTaskPart& part = backward ? *task.backward : *task.forward;
  const DagView& view = backward ? dags_.layer_backward : dags_.layer_forward;
  const int64_t layer = strand_layer(part, backward, j);
  for (int64_t i : backward ? prefetch_.backward : prefetch_.forward) {
    if (view.ops[static_cast<size_t>(i)].parameters_only) {
      emit_layer_op(backward, i, part.micro_batch, layer, true);
    }
  }
}

// The left-out reduce-scatters of the backward strand's `j`-th layer, issued once their
// gradients are complete (issue_ready_scatters).
void Lowering::note_scatters(const PlanTask& task, int64_t j) {
  const int64_t layer = strand_layer(*task.backward, true, j);
  for (int64_t i : prefetch_.backward) {
    if (!dags_.layer_backward.ops[static_cast<size_t>(i)].parameters_only) {
      prefetch_.scatters.emplace_back(layer, i);
    }
  }
}

// The left-out reduce-scatters whose gradients are complete (`all`: every one left, after the
// blocks), beside the next block.
void Lowering::issue_ready_scatters(int64_t micro_batch, bool all) {
  std::vector<std::pair<int64_t, int64_t>> waiting;
  for (const auto& [layer, index] : prefetch_.scatters) {
    const std::vector<int64_t>& preds =
        dags_.layer_backward.predecessors[static_cast<size_t>(index)];
    const int64_t scattered_layer = layer;  // a structured binding is no lambda capture in C++17
    const bool ready = std::all_of(preds.begin(), preds.end(), [&](int64_t p) {
      return produced(micro_batch, scattered_layer, dags_.layer_backward, p) >= 0;
    });
    if (ready || all) {
      emit_layer_op(true, index, micro_batch, layer, true);
    } else {
      waiting.emplace_back(layer, index);
    }
  }
  prefetch_.scatters = std::move(waiting);
}

// ----- ops and their dependencies -------------------------------------------------------

std::vector<int64_t> Lowering::predecessor_deps(const DagView& view, int64_t index,
                                                int64_t micro_batch, int64_t layer) {
  std::vector<int64_t> deps;
  const std::vector<int64_t>& predecessors = view.predecessors[static_cast<size_t>(index)];
  deps.reserve(predecessors.size() + kStreamClassNames.names.size() + 2);
  for (int64_t p : predecessors) {
    const int64_t producer = produced(micro_batch, layer, view, p);
    if (producer < 0) {
      program_.fail(fmt::format("{} runs before its input {} (layer {}, micro-batch {})",
                                view.ops[static_cast<size_t>(index)].id,
                                view.ops[static_cast<size_t>(p)].id, layer, micro_batch));
    }
    deps.push_back(producer);
  }
  return deps;
}

// An op that reads the layer's input (forward) or its output's gradient (backward): one
// with no predecessor but FSDP's parameter gathers, which read only the parameter shard and
// so wait for nothing of the pipeline themselves.
bool first_layer_op(const DagView& view, int64_t index) {
  if (view.ops[static_cast<size_t>(index)].parameters_only) return false;
  const std::vector<int64_t>& predecessors = view.predecessors[static_cast<size_t>(index)];
  return std::all_of(predecessors.begin(), predecessors.end(), [&view](int64_t p) {
    return view.ops[static_cast<size_t>(p)].parameters_only;
  });
}

void Lowering::emit_layer_op(bool backward, int64_t index, int64_t micro_batch, int64_t layer,
                             bool beside) {
  if (layer < 0 || layer >= num_layers_ || transfers_.owner_of_layer(layer) != stage_.stage) {
    program_.fail(fmt::format("layer {} is not held by this stage", layer));
  }
  const DagView& view = backward ? dags_.layer_backward : dags_.layer_forward;
  if (produced(micro_batch, layer, view, index) >= 0) {
    program_.fail(fmt::format("{} of layer {} micro-batch {} runs twice",
                              view.ops[static_cast<size_t>(index)].id, layer, micro_batch));
  }
  Instruction instruction = from_op(view, index, micro_batch, layer);
  instruction.deps = predecessor_deps(view, index, micro_batch, layer);
  if (first_layer_op(view, index)) {
    if (!backward) {
      instruction.deps.push_back(transfers_.need_input(micro_batch, layer));
    } else {
      instruction.deps.push_back(transfers_.need_gradient(micro_batch, layer));
      const int64_t forward =
          produced(micro_batch, layer, dags_.layer_forward, dags_.layer_forward_output);
      if (forward < 0) {
        program_.fail(fmt::format("the backward of layer {} micro-batch {} runs before its forward",
                                  layer, micro_batch));
      }
      instruction.deps.push_back(forward);
    }
  }
  const int64_t at =
      beside ? program_.push_beside(std::move(instruction)) : program_.push(std::move(instruction));
  produced(micro_batch, layer, view, index) = at;
  if (index != (backward ? dags_.layer_backward_output : dags_.layer_forward_output)) return;
  if (backward) {
    transfers_.produced_gradient(at, micro_batch, layer - 1);
  } else {
    transfers_.produced_input(at, micro_batch, layer + 1);
  }
}

void Lowering::emit_extra_op(bool backward, int64_t index, int64_t micro_batch) {
  const DagView& view = backward ? dags_.extras_backward : dags_.extras_forward;
  const bool embedding = view.ops[static_cast<size_t>(index)].part == OpPart::kEmbedding;
  Instruction instruction = from_op(view, index, micro_batch, -1);
  instruction.deps = predecessor_deps(view, index, micro_batch, -1);
  if (view.predecessors[static_cast<size_t>(index)].empty()) {
    if (!backward && !embedding) {
      instruction.deps.push_back(transfers_.need_input(micro_batch, num_layers_));
    } else if (backward && embedding) {
      instruction.deps.push_back(transfers_.need_gradient(micro_batch, -1));
    } else if (backward) {
      const int64_t loss =
          produced(micro_batch, -1, dags_.extras_forward, dags_.head_forward_output);
      if (loss < 0) {
        program_.fail(fmt::format("the loss backward of micro-batch {} runs before its forward",
                                  micro_batch));
      }
      instruction.deps.push_back(loss);
    }
  }
  const int64_t at = program_.push(std::move(instruction));
  produced(micro_batch, -1, view, index) = at;
  if (!backward && embedding && index == dags_.embedding_forward_output) {
    transfers_.produced_input(at, micro_batch, 0);
  }
  if (backward && !embedding && index == dags_.head_backward_output) {
    transfers_.produced_gradient(at, micro_batch, num_layers_ - 1);
  }
}

}  // namespace

RankLoweringInput::RankLoweringInput(const Plan& plan, const JobSpec& job, int64_t rank) {
  const Placement placement = checked_placement(job, rank);
  stage_index_ = find_stage(plan, placement.coordinates(rank).pp, rank);
  stage_owners(plan, job);  // refuses a plan whose stages do not hold every layer
  dags_ = std::make_shared<const RankDags>(job, rank, plan.stages[stage_index_]);
}

bool RankLoweringInput::operator==(const RankLoweringInput& other) const {
  return stage_index_ == other.stage_index_ && (dags_ == other.dags_ || *dags_ == *other.dags_);
}

RankProgram lower_stage_program(const Plan& plan, const JobSpec& job,
                                const RankLoweringInput& input, ExecutionMode mode) {
  return Lowering(plan, job, input, mode).run();
}

RankProgram relabel_stage_program(RankProgram program, const Placement& placement, int64_t rank) {
  program.rank = rank;
  const RankCoordinates coordinates = placement.coordinates(rank);
  for (Instruction& instruction : program.instructions) {
    if (instruction.kind != InstructionKind::kSend && instruction.kind != InstructionKind::kRecv) {
      continue;
    }
    RankCoordinates peer = coordinates;
    peer.pp = instruction.peer_stage;
    instruction.peer = placement.rank_of(peer);
  }
  return program;
}

RankProgram lower_rank_program(const Plan& plan, const JobSpec& job, int64_t rank,
                               ExecutionMode mode) {
  const RankLoweringInput input(plan, job, rank);
  return relabel_stage_program(lower_stage_program(plan, job, input, mode),
                               Placement(job.parallel, job.cluster.gpus_per_node), rank);
}

}  // namespace dhelix
