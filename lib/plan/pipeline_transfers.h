#pragma once
// The pipeline transfers of one rank's program, for the lowering (lib/plan/rank_program.h):
// which stage holds each layer, the embedding and the head; which instruction produced
// the residual entering a layer (or the gradient of a layer's output) for a micro-batch;
// and the sends and receives between stages, paired by their tags
// (lib/plan/transfer_tags.h). When a layer's input lives on another stage, a receive is
// emitted right before its first consumer; when this stage produces a boundary another
// stage consumes, a send follows the producer at once. A transfer names its peer's stage
// (Instruction::peer_stage), not its rank: the program is the same for every rank of the
// stage, and relabel_stage_program (lib/plan/rank_program.h) fills in the peer rank.
// Internal to lib/plan/.

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "lib/job_spec.h"
#include "lib/plan/plan.h"
#include "lib/plan/program_builder.h"

namespace dhelix {

/// Which stage holds each layer, the embedding and the head.
struct StageOwners {
  std::vector<int64_t> layer_owner;  ///< by layer
  int64_t embedding_stage = -1;
  int64_t head_stage = -1;
};

/// Throws Error(kInvalidInput) when a stage holds a layer outside the model, no stage
/// holds some layer, or none holds the embedding or the head.
StageOwners stage_owners(const Plan& plan, const JobSpec& job);

class PipelineTransfers {
 public:
  /// Throws as stage_owners does.
  PipelineTransfers(const Plan& plan, const JobSpec& job, ProgramBuilder& program);

  /// The stage that holds `layer` (0 <= layer < num_layers).
  int64_t owner_of_layer(int64_t layer) const {
    return owners_.layer_owner[static_cast<size_t>(layer)];
  }

  /// The instruction that produced the residual entering `layer` (num_layers: the head's
  /// input) for `micro_batch`, receiving it first when another stage produces it.
  int64_t need_input(int64_t micro_batch, int64_t layer);
  /// The same for the gradient of `layer`'s output (num_layers - 1: from the head).
  int64_t need_gradient(int64_t micro_batch, int64_t layer);

  /// `producer` made the residual entering `layer`; sent on when another stage needs it.
  void produced_input(int64_t producer, int64_t micro_batch, int64_t layer);
  /// `producer` made the gradient of `layer`'s output (-1: the embedding's).
  void produced_gradient(int64_t producer, int64_t micro_batch, int64_t layer);

 private:
  using Boundary = std::pair<int64_t, int64_t>;  // micro-batch, layer

  Instruction transfer(InstructionKind kind, int64_t micro_batch, int64_t layer, bool gradient,
                       int64_t other_stage) const;
  int64_t receive(int64_t micro_batch, int64_t layer, bool gradient, int64_t from_stage);
  void send(int64_t producer, int64_t micro_batch, int64_t layer, bool gradient, int64_t to_stage);

  ProgramBuilder& program_;
  int64_t num_layers_ = 0;
  int64_t boundary_bytes_ = 0;
  StageOwners owners_;
  std::map<Boundary, int64_t> input_of_;     // producer of residual(mb, layer)
  std::map<Boundary, int64_t> gradient_of_;  // producer of residual_grad(mb, layer)
};

}  // namespace dhelix
