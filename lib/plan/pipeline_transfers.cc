#include "lib/plan/pipeline_transfers.h"

#include <fmt/format.h>

#include <string>

#include "lib/dtype.h"
#include "lib/error.h"
#include "lib/plan/transfer_tags.h"

namespace dhelix {

PipelineTransfers::PipelineTransfers(const Plan& plan, const JobSpec& job,
                                     const Placement& placement, const RankCoordinates& coordinates,
                                     ProgramBuilder& program)
    : placement_(placement),
      coordinates_(coordinates),
      program_(program),
      num_layers_(job.model.num_layers) {
  layer_owner_.assign(static_cast<size_t>(num_layers_), -1);
  for (const PlanStage& stage : plan.stages) {
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
  const ParallelSpec& p = job.parallel;
  const int64_t tokens = p.micro_batch_size * p.seq_length / p.cp;
  boundary_bytes_ =
      (p.sp ? tokens / p.tp : tokens) * job.model.hidden_size * dtype_bytes(job.model.dtype);
}

int64_t PipelineTransfers::peer_rank(int64_t stage) const {
  RankCoordinates peer = coordinates_;
  peer.pp = stage;
  return placement_.rank_of(peer);
}

int64_t PipelineTransfers::need_input(int64_t micro_batch, int64_t layer) {
  auto it = input_of_.find({micro_batch, layer});
  if (it != input_of_.end()) return it->second;
  const int64_t from = layer == 0 ? embedding_stage_ : owner_of_layer(layer - 1);
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
  const int64_t from = layer == num_layers_ - 1 ? head_stage_ : owner_of_layer(layer + 1);
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
  instruction.peer = peer_rank(other_stage);
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
  const int64_t consumer = layer == num_layers_ ? head_stage_ : owner_of_layer(layer);
  if (consumer != program_.stage()) send(producer, micro_batch, layer, false, consumer);
}

void PipelineTransfers::produced_gradient(int64_t producer, int64_t micro_batch, int64_t layer) {
  gradient_of_[{micro_batch, layer}] = producer;
  const int64_t consumer = layer < 0 ? embedding_stage_ : owner_of_layer(layer);
  if (consumer != program_.stage()) send(producer, micro_batch, layer, true, consumer);
}

}  // namespace dhelix
