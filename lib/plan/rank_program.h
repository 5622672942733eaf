#pragma once
// A rank program: what one rank does in one training iteration of a plan, as an ordered
// list of instructions (compute ops, collectives, pipeline sends and receives) with the
// dependencies between them. It is the single reading of a plan that the runtime executes
// (runtime/exec/interpreter.h) and the plan checker verifies (dhelix-plan --check), so
// that what is checked is what runs.
//
// Lowering a stage's task list (lib/plan/plan.h), for the rank's stage:
//   * forward / backward task: each layer's ops in topological order of the layer DAG
//     (forward layers ascending, backward layers descending); a split backward (plan
//     format 1.3.0, "work") runs as an input part I, every backward op but the
//     weight-gradient GEMMs, and a later weight part W, only those, whose ops depend on the
//     I's instructions that made their inputs. Per micro-batch and layer a backward runs
//     once, whole or as one I and then one W (a W without its I, an I or a W twice, whole
//     and split together, an I without a W are refused);
//   * SI block task: the pairing's template blocks (lib/plan/plan_blocks.h), each block's ops
//     in the start order of its timings, the two strands' micro-batches and layers filled
//     in; a block ends in a barrier: every op of the next block depends on the last op of
//     each stream of this one (streams run in order, so that is every op of the block);
//     FSDP prefetch across SI blocks (planner/fsdp_si_prefetch.h): the layer DAG ops that
//     the pairing's op records leave out, which may only be FSDP's parameter gathers and
//     gradient reduce-scatters, are issued by rule, beside the blocks (no later block's
//     barrier waits for them; their readers and their stream's order do): per strand, the
//     gathers of the strand's layer j + 1 with the first op of its layer j, its layer 0's
//     before it, or, when the stage's previous layer task was an SI block task (head-loss
//     tasks between them do not count), with the first op of that task's strand's last
//     layer: two layers of each strand gathered at once, as planner/memory_model.h counts
//     (a rule per layer pair let the strand that lags keep more); a reduce-scatter after
//     the first block whose end completes its gradients, the rest after the last block. A
//     reader placed before its gather still fails as below;
//   * head_loss task: the final norm, head and loss forward, then their backward;
//   * the embedding forward runs before a forward part that starts at layer 0 on the
//     stage that holds the embedding, its backward after a backward part that ends there.
// Every task starts with the same barrier: tasks run one after the other, as the plan's
// timeline has them. Inside a task an op depends on its DAG predecessors (same layer and
// micro-batch), a layer's first ops on the op that produced the layer's input (the
// previous layer's output, the embedding, or a receive), and a backward layer also on its
// own forward.
//
// Pipeline transfers: when a layer's input (or output gradient) lives on another stage,
// a receive comes right before its first consumer and the producing stage sends right
// after the producer. The message is the residual stream of one micro-batch at one layer
// boundary; its tag encodes (micro-batch, boundary, direction), so a send and its receive
// agree without any order between them (lib/plan/transfer_tags.h).
//
// The lowering has three parts: this file's tasks -> instructions (lib/plan/rank_program.cc),
// the pipeline transfers and their tags (lib/plan/pipeline_transfers.h,
// lib/plan/transfer_tags.h), and the description of instructions for messages
// (lib/plan/rank_program_text.cc). lib/plan/program_builder.h appends instructions with
// their barriers.
//
// Ranks of one stage: a rank's program depends on the rank only through its stage, what
// the lowering reads of its DAGs (lib/plan/rank_dags.h: the rank's shapes are not read), and
// the world ranks of its transfers' peers. The lowering is therefore split so that this is
// true by construction: lower_stage_program sees a RankLoweringInput (stage and DAGs, no
// rank) and names each transfer's peer by its stage; relabel_stage_program then sets the
// rank and each peer (the rank with the same coordinates on the peer's stage).
// lower_rank_program is the two in a row, so ranks with equal inputs run programs that are
// equal but for `rank` and `peer`; the plan checker relies on it (lib/plan/plan_check.h).
//
// Sequential mode (the reference of dhelix-run --verify) lowers the same tasks in the same
// order, but runs an SI block's forward part to the end before its backward part, each
// layer in topological order, and chains every instruction to the one before it.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lib/job_spec.h"
#include "lib/placement.h"
#include "lib/plan/plan.h"
#include "lib/plan/transfer_tags.h"

namespace dhelix {

enum class ExecutionMode { kCoExecuted, kSequential };
inline constexpr EnumNames<ExecutionMode, 2> kExecutionModeNames{{"co-executed", "sequential"}};
/// "co-executed", "sequential".
constexpr const char* execution_mode_name(ExecutionMode mode) {
  return kExecutionModeNames.name(mode);
}

enum class InstructionKind { kCompute, kCollective, kSend, kRecv };
inline constexpr EnumNames<InstructionKind, 4> kInstructionKindNames{
    {"compute", "collective", "send", "recv"}};
/// "compute", "collective", "send", "recv".
constexpr const char* instruction_kind_name(InstructionKind kind) {
  return kInstructionKindNames.name(kind);
}

struct Instruction {
  InstructionKind kind = InstructionKind::kCompute;
  /// Layer DAG op id; "p2p.activation" / "p2p.gradient" for transfers. Points into the
  /// program's op_ids (or a literal): valid while a copy of its RankProgram lives.
  std::string_view op;
  int64_t layer = -1;       ///< absolute layer; -1 for the embedding, head and loss (see below)
  int64_t micro_batch = 0;  ///< 0-based within the iteration
  StreamClass stream = StreamClass::kCompute;
  std::optional<ParallelDim> group;  ///< collectives: their group; transfers: pp; compute: none
  std::optional<OpKind> collective;  ///< collectives: the op's kind (all_gather, ...)
  int64_t bytes = 0;                 ///< collectives: the op's comm_bytes; transfers: message bytes
  int64_t peer = -1;                 ///< transfers: world rank at the other end
  int64_t peer_stage = -1;           ///< transfers: the stage of `peer`
  int64_t tag = -1;                  ///< transfers: message tag (transfer_tag)
  /// Transfers: the buffer moved. Activation: the input of `layer` (the residual stream
  /// entering it; layer == num_layers is the head's input). Gradient: the gradient of
  /// `layer`'s output (layer == -1: of the embedding's output).
  bool gradient = false;
  int64_t task = -1;          ///< index in the stage's task list
  int64_t block = -1;         ///< SI block within the task; -1 outside SI blocks
  std::vector<int64_t> deps;  ///< earlier instructions of this program that must finish first
};

struct RankProgram {
  int64_t rank = 0;
  int64_t stage = 0;
  ExecutionMode mode = ExecutionMode::kCoExecuted;
  std::vector<Instruction> instructions;
  /// The op ids the instructions' `op` views point into, shared by copies of the program:
  /// one string per op of the rank's DAGs instead of one per instruction.
  std::shared_ptr<const std::vector<std::string>> op_ids;
};

struct RankDags;

/// Everything a rank's program depends on but the rank itself: its stage and what the
/// lowering reads of its DAGs. Copies share the DAGs.
class RankLoweringInput {
 public:
  /// Checks that `rank` exists, has a stage that lists it and a pairing, and that stages
  /// hold every layer, then builds its DAGs. Throws Error(kInvalidInput) (kUnsupported from
  /// the DAG builder) with the words of lower_rank_program, in the same order.
  RankLoweringInput(const Plan& plan, const JobSpec& job, int64_t rank);

  /// Index in plan.stages of the rank's stage.
  size_t stage_index() const { return stage_index_; }
  const RankDags& dags() const { return *dags_; }
  /// Equal inputs lower to equal stage programs (lower_stage_program is a function of them).
  bool operator==(const RankLoweringInput& other) const;

 private:
  size_t stage_index_ = 0;
  std::shared_ptr<const RankDags> dags_;
};

/// The program of every rank whose input is `input`: `rank` -1, and each transfer's `peer`
/// -1 with its `peer_stage` set. Throws Error(kInvalidInput) as lower_rank_program does.
RankProgram lower_stage_program(const Plan& plan, const JobSpec& job,
                                const RankLoweringInput& input, ExecutionMode mode);

/// A stage program made rank `rank`'s: `rank` set, and each transfer's `peer` the world rank
/// with `rank`'s coordinates on the transfer's peer_stage.
RankProgram relabel_stage_program(RankProgram program, const Placement& placement, int64_t rank);

/// Lowers `plan` for world rank `rank` (see the file comment). `job` is the plan's job
/// (lib/plan/plan_job.h). Throws Error(kInvalidInput) naming the stage, task, block and op when
/// the plan is inconsistent: a rank or pairing that does not exist, a block op the layer
/// DAG lacks, an op scheduled before one of its inputs is produced, a layer no stage holds.
RankProgram lower_rank_program(const Plan& plan, const JobSpec& job, int64_t rank,
                               ExecutionMode mode);

/// "stage 1 task 4 (F2d+B0u) block 3: fwd.gemm_qkv, layer 1, micro-batch 2": where an
/// instruction comes from, for messages.
std::string describe_instruction(const Plan& plan, const RankProgram& program,
                                 const Instruction& instruction);

}  // namespace dhelix
