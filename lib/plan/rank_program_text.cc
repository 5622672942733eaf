// Names and descriptions of rank programs' instructions, for messages.

#include <fmt/format.h>

#include "lib/plan/rank_program.h"

namespace dhelix {

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
