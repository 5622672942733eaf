#pragma once
// How both executors (runtime/exec/interpreter.cc on the CPU, runtime/cuda/device_executor.cc
// on GPUs) report a failing instruction: the rank, the plan position and the op, then the
// error, "<describe_instruction>: <what>". Describing is done only on failure: it searches
// the stage's task list, too slow to do for every instruction of every iteration.

#include <fmt/format.h>

#include <exception>
#include <utility>

#include "lib/error.h"
#include "lib/plan/plan.h"
#include "lib/plan/rank_program.h"

namespace dhelix::rt {

/// Runs `work`; rethrows what it throws as an Error naming `instruction` (a dhelix::Error
/// keeps its code, anything else becomes kInternal).
template <class Work>
void run_naming_instruction(const Plan& plan, const RankProgram& program,
                            const Instruction& instruction, Work&& work) {
  try {
    std::forward<Work>(work)();
  } catch (const Error& error) {
    throw Error(
        error.code(),
        fmt::format("{}: {}", describe_instruction(plan, program, instruction), error.what()));
  } catch (const std::exception& error) {
    throw Error(
        ErrorCode::kInternal,
        fmt::format("{}: {}", describe_instruction(plan, program, instruction), error.what()));
  }
}

}  // namespace dhelix::rt
