#include "lib/rank_program.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <map>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "lib/dag_builder.h"
#include "lib/dtype.h"
#include "lib/error.h"
#include "lib/placement.h"
#include "lib/plan_blocks.h"

namespace dhelix {
namespace {

// The embedding's ops and the head's ops share the stage-extras DAGs as separate parts.
bool is_embedding_op(const std::string& id) { return id.find("embedding") != std::string::npos; }

using PartFilter = std::function<bool(const std::string&)>;

// The op of a DAG (part) whose result leaves it: the one sink that is not a movable sink
// (a weight gradient nothing waits for). -1 for an empty part.
int64_t output_op(const LayerDag& dag, const PartFilter& in_part) {
  int64_t found = -1;
  for (int64_t i = 0; i < dag.size(); ++i) {
    const Op& op = dag.op(i);
    if (!in_part(op.id) || op.movable_sink || !dag.successors(i).empty()) continue;
    DHELIX_CHECK(found < 0);  // the DAG builder gives every part one output
    found = i;
  }
  return found;
}

const PartFilter kAll = [](const std::string&) { return true; };
const PartFilter kEmbedding = [](const std::string& id) { return is_embedding_op(id); };
const PartFilter kHead = [](const std::string& id) { return !is_embedding_op(id); };

// One DAG as lowering reads it, many times per micro-batch and layer: its predecessor lists
// and topological order computed once, and where its ops start in the table of producers.
struct DagView {
  const LayerDag* dag = nullptr;
  int64_t slot_offset = 0;
  std::vector<std::vector<int64_t>> predecessors;
  std::vector<int64_t> order;

  DagView() = default;
  DagView(const LayerDag& d, int64_t offset) : dag(&d), slot_offset(offset) {
    for (int64_t i = 0; i < d.size(); ++i) predecessors.push_back(d.predecessors(i));
    order = d.topological_order();
  }
  std::vector<int64_t> ordered(const PartFilter& in_part) const {
    std::vector<int64_t> out;
    for (int64_t i : order) {
      if (in_part(dag->op(i).id)) out.push_back(i);
    }
    return out;
  }
};

// One op of a template block, resolved against the layer DAGs once per block.
struct ResolvedTiming {
  int64_t window_layer = 0;  // k of "L<k>."
  bool backward = false;
  int64_t index = 0;  // in the strand's layer DAG
};

class Lowering {
 public:
  Lowering(const Plan& plan, const JobSpec& job, int64_t rank, ExecutionMode mode);
  RankProgram run();

 private:
  using Boundary = std::pair<int64_t, int64_t>;  // micro-batch, layer

  [[noreturn]] void fail(const std::string& what) const;
  void find_stage(int64_t rank);
  void map_layer_owners();
  int64_t owner_of_layer(int64_t layer) const;
  int64_t peer_rank(int64_t stage) const;

  void start_barrier();
  int64_t push(Instruction instruction);
  Instruction from_op(const Op& op, int64_t micro_batch, int64_t layer) const;

  void prepare_dags();
  int64_t& produced(int64_t micro_batch, int64_t layer, const DagView& view, int64_t index);
  const std::vector<ResolvedTiming>& resolve(const PlanBlock& block);

  void lower_task(const PlanTask& task);
  void lower_si_blocks(const PlanTask& task);
  void lower_forward_part(const PlanTaskPart& part);
  void lower_backward_part(const PlanTaskPart& part);
  void lower_head_loss(int64_t micro_batch);

  void emit_layer_op(bool backward, int64_t index, int64_t micro_batch, int64_t layer);
  void emit_extra_op(bool backward, int64_t index, int64_t micro_batch);
  std::vector<int64_t> predecessor_deps(const DagView& view, int64_t index, int64_t micro_batch,
                                        int64_t layer);
  int64_t need_input(int64_t micro_batch, int64_t layer);
  int64_t need_gradient(int64_t micro_batch, int64_t layer);
  Instruction transfer(InstructionKind kind, int64_t micro_batch, int64_t layer, bool gradient,
                       int64_t other_stage) const;
  int64_t receive(int64_t micro_batch, int64_t layer, bool gradient, int64_t from_stage);
  void send(int64_t producer, int64_t micro_batch, int64_t layer, bool gradient, int64_t to_stage);
  void produced_input(int64_t producer, int64_t micro_batch, int64_t layer);
  void produced_gradient(int64_t producer, int64_t micro_batch, int64_t layer);

  const Plan& plan_;
  ExecutionMode mode_;
  Placement placement_;
  RankCoordinates coordinates_;
  const PlanStage* stage_ = nullptr;
  const PlanPairing* pairing_ = nullptr;
  LayerDags layer_;
  LayerDags extras_;
  int64_t num_layers_ = 0;
  std::vector<int64_t> layer_owner_;
  int64_t embedding_stage_ = -1;
  int64_t head_stage_ = -1;
  int64_t boundary_bytes_ = 0;

  DagView layer_forward_, layer_backward_, extras_forward_, extras_backward_;
  int64_t layer_forward_output_ = -1, layer_backward_output_ = -1;
  int64_t embedding_forward_output_ = -1, head_forward_output_ = -1, head_backward_output_ = -1;
  std::vector<int64_t> embedding_forward_order_, embedding_backward_order_;
  std::vector<int64_t> head_forward_order_, head_backward_order_;
  int64_t slots_ = 0;  // ops of all four DAGs: the producer table's row width
  std::unordered_map<const PlanBlock*, std::vector<ResolvedTiming>> resolved_;

  RankProgram program_;
  // The instruction that produced each (micro-batch, layer + 1, DAG slot); -1: not yet.
  std::vector<int64_t> produced_;
  std::map<Boundary, int64_t> input_of_;     // producer of residual(mb, layer)
  std::map<Boundary, int64_t> gradient_of_;  // producer of residual_grad(mb, layer)
  std::map<std::string, int64_t> last_on_stream_;
  std::vector<int64_t> barrier_;
  int64_t task_ = -1;
  int64_t block_ = -1;
  std::string where_;  // the op being lowered, for messages
};

Lowering::Lowering(const Plan& plan, const JobSpec& job, int64_t rank, ExecutionMode mode)
    : plan_(plan),
      mode_(mode),
      placement_(job.parallel, job.cluster.gpus_per_node),
      num_layers_(job.model.num_layers) {
  if (rank < 0 || rank >= placement_.world_size()) {
    throw Error(ErrorCode::kInvalidInput,
                fmt::format("plan: rank {} does not exist: the plan's job has {} ranks", rank,
                            placement_.world_size()));
  }
  coordinates_ = placement_.coordinates(rank);
  find_stage(rank);
  map_layer_owners();
  layer_ = build_layer_dags(job, rank);
  extras_ = build_stage_extras(job, rank, stage_->embedding, stage_->head_loss);
  prepare_dags();
  const ParallelSpec& p = job.parallel;
  const int64_t tokens = p.micro_batch_size * p.seq_length / p.cp;
  boundary_bytes_ =
      (p.sp ? tokens / p.tp : tokens) * job.model.hidden_size * dtype_bytes(job.model.dtype);
  program_.rank = rank;
  program_.stage = stage_->stage;
  program_.mode = mode;
}

void Lowering::fail(const std::string& what) const {
  throw Error(ErrorCode::kInvalidInput,
              fmt::format("plan: stage {} task {}{}: {}", stage_ ? stage_->stage : -1, task_,
                          block_ >= 0 ? fmt::format(" block {}", block_) : "", what));
}

void Lowering::find_stage(int64_t rank) {
  for (const PlanStage& stage : plan_.stages) {
    if (stage.stage == coordinates_.pp) stage_ = &stage;
  }
  if (stage_ == nullptr) fail(fmt::format("no stage {} for rank {}", coordinates_.pp, rank));
  if (std::find(stage_->ranks.begin(), stage_->ranks.end(), rank) == stage_->ranks.end()) {
    fail(fmt::format("rank {} is not among the stage's ranks", rank));
  }
  if (stage_->pairing < 0 || stage_->pairing >= static_cast<int64_t>(plan_.pairings.size())) {
    fail(fmt::format("pairing {} does not exist ({} pairings)", stage_->pairing,
                     plan_.pairings.size()));
  }
  pairing_ = &plan_.pairings[static_cast<size_t>(stage_->pairing)];
}

void Lowering::map_layer_owners() {
  layer_owner_.assign(static_cast<size_t>(num_layers_), -1);
  for (const PlanStage& stage : plan_.stages) {
    for (const PlanLayerRange& range : {stage.down_layers, stage.up_layers}) {
      for (int64_t l = range.first; l < range.first + range.count; ++l) {
        if (l < 0 || l >= num_layers_) {
          throw Error(ErrorCode::kInvalidInput,
                      fmt::format("plan: stage {} holds layer {}, outside 0..{}", stage.stage, l,
                                  num_layers_ - 1));
        }
        layer_owner_[static_cast<size_t>(l)] = stage.stage;
      }
    }
    if (stage.embedding) embedding_stage_ = stage.stage;
    if (stage.head_loss) head_stage_ = stage.stage;
  }
  for (int64_t l = 0; l < num_layers_; ++l) {
    if (layer_owner_[static_cast<size_t>(l)] < 0) {
      throw Error(ErrorCode::kInvalidInput, fmt::format("plan: no stage holds layer {}", l));
    }
  }
  if (embedding_stage_ < 0 || head_stage_ < 0) {
    throw Error(ErrorCode::kInvalidInput,
                "plan: no stage holds the embedding or no stage holds the head and loss");
  }
}

int64_t Lowering::owner_of_layer(int64_t layer) const {
  return layer_owner_[static_cast<size_t>(layer)];
}

int64_t Lowering::peer_rank(int64_t stage) const {
  RankCoordinates peer = coordinates_;
  peer.pp = stage;
  return placement_.rank_of(peer);
}

void Lowering::prepare_dags() {
  layer_forward_ = DagView(layer_.forward, 0);
  layer_backward_ = DagView(layer_.backward, layer_.forward.size());
  extras_forward_ = DagView(extras_.forward, layer_.forward.size() + layer_.backward.size());
  extras_backward_ =
      DagView(extras_.backward, extras_forward_.slot_offset + extras_.forward.size());
  slots_ = extras_backward_.slot_offset + extras_.backward.size();
  layer_forward_output_ = output_op(layer_.forward, kAll);
  layer_backward_output_ = output_op(layer_.backward, kAll);
  embedding_forward_output_ = output_op(extras_.forward, kEmbedding);
  head_forward_output_ = output_op(extras_.forward, kHead);
  head_backward_output_ = output_op(extras_.backward, kHead);
  embedding_forward_order_ = extras_forward_.ordered(kEmbedding);
  embedding_backward_order_ = extras_backward_.ordered(kEmbedding);
  head_forward_order_ = extras_forward_.ordered(kHead);
  head_backward_order_ = extras_backward_.ordered(kHead);
  const int64_t micro_batches = std::max<int64_t>(plan_.num_micro_batches, 0);
  produced_.assign(static_cast<size_t>(micro_batches * (num_layers_ + 1) * slots_), -1);
}

int64_t& Lowering::produced(int64_t micro_batch, int64_t layer, const DagView& view,
                            int64_t index) {
  if (micro_batch < 0 || micro_batch >= plan_.num_micro_batches) {
    fail(fmt::format("micro-batch {} is outside 0..{}", micro_batch, plan_.num_micro_batches - 1));
  }
  const int64_t row = micro_batch * (num_layers_ + 1) + (layer + 1);
  return produced_[static_cast<size_t>(row * slots_ + view.slot_offset + index)];
}

const std::vector<ResolvedTiming>& Lowering::resolve(const PlanBlock& block) {
  auto [it, inserted] = resolved_.try_emplace(&block);
  if (!inserted) return it->second;
  for (const PlanOpTiming& timing : block.timings) {
    const auto [k, id] = split_window_op_id(timing.op);
    const bool backward = timing.strand == "bwd";
    const auto index = (backward ? layer_.backward : layer_.forward).find(id);
    if (!index) fail(fmt::format("block op '{}' is not in this job's layer DAG", timing.op));
    it->second.push_back({k, backward, *index});
  }
  return it->second;
}

// ----- instructions and barriers ----------------------------------------------------------

void Lowering::start_barrier() {
  barrier_.clear();
  for (const auto& [stream, index] : last_on_stream_) barrier_.push_back(index);
}

int64_t Lowering::push(Instruction instruction) {
  const int64_t index = static_cast<int64_t>(program_.instructions.size());
  std::vector<int64_t>& deps = instruction.deps;
  if (mode_ == ExecutionMode::kSequential) {
    if (index > 0) deps.push_back(index - 1);
  } else {
    deps.insert(deps.end(), barrier_.begin(), barrier_.end());
  }
  std::sort(deps.begin(), deps.end());
  deps.erase(std::unique(deps.begin(), deps.end()), deps.end());
  instruction.task = task_;
  instruction.block = block_;
  last_on_stream_[instruction.stream] = index;
  program_.instructions.push_back(std::move(instruction));
  return index;
}

Instruction Lowering::from_op(const Op& op, int64_t micro_batch, int64_t layer) const {
  Instruction out;
  const bool comm = is_communication(op.kind);
  out.kind = comm ? InstructionKind::kCollective : InstructionKind::kCompute;
  out.op = op.id;
  out.layer = layer;
  out.micro_batch = micro_batch;
  out.stream = stream_class_name(op.stream);
  if (comm) {
    out.group = parallel_dim_name(op.group);
    out.collective = op_kind_name(op.kind);
    out.bytes = op.comm_bytes;
  }
  return out;
}

// ----- tasks ----------------------------------------------------------------------------

RankProgram Lowering::run() {
  for (const PlanTask& task : stage_->tasks) {
    task_ = task.index;
    block_ = -1;
    start_barrier();
    lower_task(task);
  }
  return std::move(program_);
}

void Lowering::lower_task(const PlanTask& task) {
  if (task.kind == "head_loss") {
    if (!stage_->head_loss) fail("a head_loss task on a stage without the head");
    lower_head_loss(task.head_loss_micro_batch);
    return;
  }
  if (task.kind == "si_block" && mode_ == ExecutionMode::kCoExecuted) {
    lower_si_blocks(task);
    return;
  }
  if (task.kind != "si_block" && task.kind != "forward" && task.kind != "backward") {
    fail(fmt::format("unknown task kind '{}'", task.kind));
  }
  if (task.has_forward) lower_forward_part(task.forward);
  if (task.has_backward) lower_backward_part(task.backward);
}

void Lowering::lower_forward_part(const PlanTaskPart& part) {
  const bool embedding = stage_->embedding && part.layers.first == 0;
  if (embedding) {
    for (int64_t i : embedding_forward_order_) emit_extra_op(false, i, part.micro_batch);
  }
  for (int64_t j = 0; j < part.layers.count; ++j) {
    const int64_t layer = strand_layer(part, false, j);
    for (int64_t i : layer_forward_.order) emit_layer_op(false, i, part.micro_batch, layer);
  }
}

void Lowering::lower_backward_part(const PlanTaskPart& part) {
  for (int64_t j = 0; j < part.layers.count; ++j) {
    const int64_t layer = strand_layer(part, true, j);
    for (int64_t i : layer_backward_.order) emit_layer_op(true, i, part.micro_batch, layer);
  }
  if (stage_->embedding && part.layers.first == 0) {
    for (int64_t i : embedding_backward_order_) emit_extra_op(true, i, part.micro_batch);
  }
}

void Lowering::lower_head_loss(int64_t micro_batch) {
  for (int64_t i : head_forward_order_) emit_extra_op(false, i, micro_batch);
  for (int64_t i : head_backward_order_) emit_extra_op(true, i, micro_batch);
}

void Lowering::lower_si_blocks(const PlanTask& task) {
  if (!task.has_forward || !task.has_backward ||
      task.forward.layers.count != task.backward.layers.count) {
    fail("an SI block task needs a forward and a backward part over as many layers");
  }
  if (stage_->embedding && task.forward.layers.first == 0) {
    for (int64_t i : embedding_forward_order_) emit_extra_op(false, i, task.forward.micro_batch);
  }
  int64_t block = 0;
  for (const PlacedBlocks& placed : si_block_sequence(*pairing_, task.forward.layers.count)) {
    for (const PlanBlock& template_block : *placed.blocks) {
      block_ = block++;
      start_barrier();
      for (const ResolvedTiming& timing : resolve(template_block)) {
        const PlanTaskPart& part = timing.backward ? task.backward : task.forward;
        const int64_t layer =
            strand_layer(part, timing.backward, placed.first_local_layer + timing.window_layer);
        emit_layer_op(timing.backward, timing.index, part.micro_batch, layer);
      }
    }
  }
  block_ = -1;
  start_barrier();
  if (stage_->embedding && task.backward.layers.first == 0) {
    for (int64_t i : embedding_backward_order_) emit_extra_op(true, i, task.backward.micro_batch);
  }
}

// ----- ops and their dependencies -------------------------------------------------------

std::vector<int64_t> Lowering::predecessor_deps(const DagView& view, int64_t index,
                                                int64_t micro_batch, int64_t layer) {
  std::vector<int64_t> deps;
  for (int64_t p : view.predecessors[static_cast<size_t>(index)]) {
    const int64_t producer = produced(micro_batch, layer, view, p);
    if (producer < 0) {
      fail(fmt::format("{} runs before its input {} (layer {}, micro-batch {})",
                       view.dag->op(index).id, view.dag->op(p).id, layer, micro_batch));
    }
    deps.push_back(producer);
  }
  return deps;
}

void Lowering::emit_layer_op(bool backward, int64_t index, int64_t micro_batch, int64_t layer) {
  if (layer < 0 || layer >= num_layers_ || owner_of_layer(layer) != stage_->stage) {
    fail(fmt::format("layer {} is not held by this stage", layer));
  }
  const DagView& view = backward ? layer_backward_ : layer_forward_;
  const Op& op = view.dag->op(index);
  if (produced(micro_batch, layer, view, index) >= 0) {
    fail(fmt::format("{} of layer {} micro-batch {} runs twice", op.id, layer, micro_batch));
  }
  Instruction instruction = from_op(op, micro_batch, layer);
  instruction.deps = predecessor_deps(view, index, micro_batch, layer);
  if (view.predecessors[static_cast<size_t>(index)].empty()) {
    if (!backward) {
      instruction.deps.push_back(need_input(micro_batch, layer));
    } else {
      instruction.deps.push_back(need_gradient(micro_batch, layer));
      const int64_t forward = produced(micro_batch, layer, layer_forward_, layer_forward_output_);
      if (forward < 0) {
        fail(fmt::format("the backward of layer {} micro-batch {} runs before its forward", layer,
                         micro_batch));
      }
      instruction.deps.push_back(forward);
    }
  }
  const int64_t at = push(std::move(instruction));
  produced(micro_batch, layer, view, index) = at;
  if (index != (backward ? layer_backward_output_ : layer_forward_output_)) return;
  if (backward) {
    produced_gradient(at, micro_batch, layer - 1);
  } else {
    produced_input(at, micro_batch, layer + 1);
  }
}

void Lowering::emit_extra_op(bool backward, int64_t index, int64_t micro_batch) {
  const DagView& view = backward ? extras_backward_ : extras_forward_;
  const Op& op = view.dag->op(index);
  const bool embedding = is_embedding_op(op.id);
  Instruction instruction = from_op(op, micro_batch, -1);
  instruction.deps = predecessor_deps(view, index, micro_batch, -1);
  if (view.predecessors[static_cast<size_t>(index)].empty()) {
    if (!backward && !embedding) {
      instruction.deps.push_back(need_input(micro_batch, num_layers_));
    } else if (backward && embedding) {
      instruction.deps.push_back(need_gradient(micro_batch, -1));
    } else if (backward) {
      const int64_t loss = produced(micro_batch, -1, extras_forward_, head_forward_output_);
      if (loss < 0) {
        fail(fmt::format("the loss backward of micro-batch {} runs before its forward",
                         micro_batch));
      }
      instruction.deps.push_back(loss);
    }
  }
  const int64_t at = push(std::move(instruction));
  produced(micro_batch, -1, view, index) = at;
  if (!backward && embedding && index == embedding_forward_output_) {
    produced_input(at, micro_batch, 0);
  }
  if (backward && !embedding && index == head_backward_output_) {
    produced_gradient(at, micro_batch, num_layers_ - 1);
  }
}

// ----- pipeline transfers ---------------------------------------------------------------

int64_t Lowering::need_input(int64_t micro_batch, int64_t layer) {
  auto it = input_of_.find({micro_batch, layer});
  if (it != input_of_.end()) return it->second;
  const int64_t from = layer == 0 ? embedding_stage_ : owner_of_layer(layer - 1);
  if (from == stage_->stage) {
    fail(fmt::format("layer {}'s input for micro-batch {} is used before it is produced",
                     layer == num_layers_ ? std::string("the head") : std::to_string(layer),
                     micro_batch));
  }
  return receive(micro_batch, layer, false, from);
}

int64_t Lowering::need_gradient(int64_t micro_batch, int64_t layer) {
  auto it = gradient_of_.find({micro_batch, layer});
  if (it != gradient_of_.end()) return it->second;
  const int64_t from = layer == num_layers_ - 1 ? head_stage_ : owner_of_layer(layer + 1);
  if (from == stage_->stage) {
    fail(
        fmt::format("the gradient of layer {}'s output for micro-batch {} is used before it is "
                    "produced",
                    layer, micro_batch));
  }
  return receive(micro_batch, layer, true, from);
}

Instruction Lowering::transfer(InstructionKind kind, int64_t micro_batch, int64_t layer,
                               bool gradient, int64_t other_stage) const {
  Instruction instruction;
  instruction.kind = kind;
  instruction.op = gradient ? "p2p.gradient" : "p2p.activation";
  instruction.layer = layer;
  instruction.micro_batch = micro_batch;
  instruction.stream = "cross_comm";
  instruction.group = "pp";
  instruction.bytes = boundary_bytes_;
  instruction.peer = peer_rank(other_stage);
  instruction.tag = transfer_tag(micro_batch, layer, gradient, num_layers_);
  instruction.gradient = gradient;
  return instruction;
}

int64_t Lowering::receive(int64_t micro_batch, int64_t layer, bool gradient, int64_t from_stage) {
  const int64_t at =
      push(transfer(InstructionKind::kRecv, micro_batch, layer, gradient, from_stage));
  (gradient ? gradient_of_ : input_of_)[{micro_batch, layer}] = at;
  return at;
}

void Lowering::send(int64_t producer, int64_t micro_batch, int64_t layer, bool gradient,
                    int64_t to_stage) {
  Instruction instruction =
      transfer(InstructionKind::kSend, micro_batch, layer, gradient, to_stage);
  instruction.deps = {producer};
  push(std::move(instruction));
}

void Lowering::produced_input(int64_t producer, int64_t micro_batch, int64_t layer) {
  input_of_[{micro_batch, layer}] = producer;
  const int64_t consumer = layer == num_layers_ ? head_stage_ : owner_of_layer(layer);
  if (consumer != stage_->stage) send(producer, micro_batch, layer, false, consumer);
}

void Lowering::produced_gradient(int64_t producer, int64_t micro_batch, int64_t layer) {
  gradient_of_[{micro_batch, layer}] = producer;
  const int64_t consumer = layer < 0 ? embedding_stage_ : owner_of_layer(layer);
  if (consumer != stage_->stage) send(producer, micro_batch, layer, true, consumer);
}

}  // namespace

const char* execution_mode_name(ExecutionMode mode) {
  return mode == ExecutionMode::kCoExecuted ? "co-executed" : "sequential";
}

const char* instruction_kind_name(InstructionKind kind) {
  switch (kind) {
    case InstructionKind::kCompute:
      return "compute";
    case InstructionKind::kCollective:
      return "collective";
    case InstructionKind::kSend:
      return "send";
    case InstructionKind::kRecv:
      return "recv";
  }
  return "?";
}

RankProgram lower_rank_program(const Plan& plan, const JobSpec& job, int64_t rank,
                               ExecutionMode mode) {
  return Lowering(plan, job, rank, mode).run();
}

int64_t transfer_tag(int64_t micro_batch, int64_t layer, bool gradient, int64_t num_layers) {
  return (micro_batch * (num_layers + 2) + (layer + 1)) * 2 + (gradient ? 1 : 0);
}

TransferTagFields decode_transfer_tag(int64_t tag, int64_t num_layers) {
  DHELIX_CHECK(tag >= 0 && num_layers > 0);
  const int64_t boundary = tag / 2;
  return {.micro_batch = boundary / (num_layers + 2),
          .layer = boundary % (num_layers + 2) - 1,
          .gradient = tag % 2 == 1};
}

std::string describe_transfer_tag(int64_t tag, int64_t num_layers) {
  const TransferTagFields f = decode_transfer_tag(tag, num_layers);
  std::string what;
  if (f.gradient) {
    what = f.layer < 0 ? "gradient of the embedding's output"
                       : fmt::format("gradient of layer {}'s output", f.layer);
  } else {
    what = f.layer >= num_layers ? "activation into the head"
                                 : fmt::format("activation into layer {}", f.layer);
  }
  return fmt::format("micro-batch {}, {}", f.micro_batch, what);
}

std::string describe_instruction(const Plan& plan, const RankProgram& program,
                                 const Instruction& instruction) {
  std::string task = fmt::format("task {}", instruction.task);
  for (const PlanStage& stage : plan.stages) {
    if (stage.stage != program.stage) continue;
    for (const PlanTask& t : stage.tasks) {
      if (t.index == instruction.task) task += fmt::format(" ({})", t.label);
    }
  }
  const std::string block =
      instruction.block >= 0 ? fmt::format(" block {}", instruction.block) : "";
  const std::string layer =
      instruction.layer >= 0 ? fmt::format(", layer {}", instruction.layer) : "";
  return fmt::format("rank {} stage {} {}{}: {}{}, micro-batch {}", program.rank, program.stage,
                     task, block, instruction.op, layer, instruction.micro_batch);
}

}  // namespace dhelix
