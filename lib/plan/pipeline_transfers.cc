#include "lib/plan/pipeline_transfers.h"

#include <fmt/format.h>

#include <string>

#include "lib/dtype.h"
#include "lib/error.h"
#include "lib/plan/transfer_tags.h"

namespace dhelix {

StageOwners stage_owners(const Plan& plan, const JobSpec& job) {
  const int64_t num_layers = job.model.num_layers;
  StageOwners owners;
  owners.layer_owner.assign(static_cast<size_t>(num_layers), -1);
  for (const PlanStage& stage : plan.stages) {
    for (const PlanLayerRange& range : stage.layer_ranges()) {
      for (int64_t l = range.first; l < range.first + range.count; ++l) {
        if (l < 0 || l >= num_layers) {
          throw Error(ErrorCode::kInvalidInput,
                      fmt::format("plan: stage {} holds layer {}, outside 0..{}", stage.stage, l,
                                  num_layers - 1));
        }
        owners.layer_owner[static_cast<size_t>(l)] = stage.stage;
      }
    }
    if (stage.embedding) owners.embedding_stage = stage.stage;
    if (stage.head_loss) owners.head_stage = stage.stage;
  }
  for (int64_t l = 0; l < num_layers; ++l) {
    if (owners.layer_owner[static_cast<size_t>(l)] < 0) {
      throw Error(ErrorCode::kInvalidInput, fmt::format("plan: no stage holds layer {}", l));
    }
  }
  if (owners.embedding_stage < 0 || owners.head_stage < 0) {
    throw Error(ErrorCode::kInvalidInput,
                "plan: no stage holds the embedding or no stage holds the head and loss");
  }
  return owners;
}

PipelineTransfers::PipelineTransfers(const Plan& plan, const JobSpec& job, ProgramBuilder& program)
    : program_(program), num_layers_(job.model.num_layers), owners_(stage_owners(plan, job)) {
  const ParallelSpec& p = job.parallel;
  const int64_t tokens = p.micro_batch_size * p.seq_length / p.cp;
  boundary_bytes_ =
      (p.sp ? tokens / p.tp : tokens) * job.model.hidden_size * dtype_bytes(job.model.dtype);
}

int64_t PipelineTransfers::need_input(int64_t micro_batch, int64_t layer) {
  auto it = input_of_.find({micro_batch, layer});
  if (it != input_of_.end()) return it->second;
  const int64_t from = layer == 0 ? owners_.embedding_stage : owner_of_layer(layer - 1);
  if (from == program_.stage()) {
    program_.fail(fmt::format(
        "layer {}'s input for micro-batch {} is used before it is produced",
        layer == num_layers_ ? std::string("the head") : std::to_string(layer), micro_batch));
  }
  return receive(micro_batch, layer, false, from);
}

int64_t PipelineTransfers::need_gradient(int64_t micro_batch, int64_t layer) {
  auto it = gradient_of_.find({micro_batch, layer});
  if (it != gradient_of_.end()) return it->second;
  const int64_t from = layer == num_layers_ - 1 ? owners_.head_stage : owner_of_layer(layer + 1);
  if (from == program_.stage()) {
    program_.fail(
        fmt::format("the gradient of layer {}'s output for micro-batch {} is used before it is "
                    "produced",
                    layer, micro_batch));
  }
  return receive(micro_batch, layer, true, from);
}

Instruction PipelineTransfers::transfer(InstructionKind kind, int64_t micro_batch, int64_t layer,
                                        bool gradient, int64_t other_stage) const {
  Instruction instruction;
  instruction.kind = kind;
  instruction.op = gradient ? "p2p.gradient" : "p2p.activation";
  instruction.layer = layer;
  instruction.micro_batch = micro_batch;
  instruction.stream = StreamClass::kCrossComm;
  instruction.group = ParallelDim::kPp;
  instruction.bytes = boundary_bytes_;
  instruction.peer_stage = other_stage;  // the peer rank: relabel_stage_program
  instruction.tag = transfer_tag(micro_batch, layer, gradient, num_layers_);
  instruction.gradient = gradient;
  return instruction;
}

int64_t PipelineTransfers::receive(int64_t micro_batch, int64_t layer, bool gradient,
                                   int64_t from_stage) {
  const int64_t at =
      program_.push(transfer(InstructionKind::kRecv, micro_batch, layer, gradient, from_stage));
  (gradient ? gradient_of_ : input_of_)[{micro_batch, layer}] = at;
  return at;
}

void PipelineTransfers::send(int64_t producer, int64_t micro_batch, int64_t layer, bool gradient,
                             int64_t to_stage) {
  Instruction instruction =
      transfer(InstructionKind::kSend, micro_batch, layer, gradient, to_stage);
  instruction.deps = {producer};
  program_.push(std::move(instruction));
}

void PipelineTransfers::produced_input(int64_t producer, int64_t micro_batch, int64_t layer) {
  input_of_[{micro_batch, layer}] = producer;
  const int64_t consumer = layer == num_layers_ ? owners_.head_stage : owner_of_layer(layer);
  if (consumer != program_.stage()) send(producer, micro_batch, layer, false, consumer);
}

void PipelineTransfers::produced_gradient(int64_t producer, int64_t micro_batch, int64_t layer) {
  gradient_of_[{micro_batch, layer}] = producer;
  const int64_t consumer = layer < 0 ? owners_.embedding_stage : owner_of_layer(layer);
  if (consumer != program_.stage()) send(producer, micro_batch, layer, true, consumer);
}

}  // namespace dhelix
