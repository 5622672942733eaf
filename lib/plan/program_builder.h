#pragma once
// Appending instructions to a rank program (lib/plan/rank_program.h), for the lowering:
// each instruction is stamped with the task and SI block being lowered, gets the current
// barrier (co-executed mode: the last instruction of every stream when the task or block
// began) or the previous instruction (sequential mode) as dependencies, and a failure
// names where in the plan it happened. Internal to lib/plan/.

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "lib/plan/rank_program.h"

namespace dhelix {

class ProgramBuilder {
 public:
  ProgramBuilder(int64_t rank, int64_t stage, ExecutionMode mode);

  ExecutionMode mode() const { return program_.mode; }
  int64_t stage() const { return program_.stage; }

  /// Starts task `task` (its index in the stage's list) behind a barrier.
  void begin_task(int64_t task);
  /// Starts SI block `block` of the current task behind a barrier; -1: the task's own ops
  /// after its blocks.
  void begin_block(int64_t block);

  /// Appends `instruction` (its deps: the data dependencies) and returns its index.
  int64_t push(Instruction instruction);
  /// The same for a collective issued ahead of the blocks that use it (FSDP's prefetch):
  /// it waits for the current barrier, but no later barrier waits for it; its consumers'
  /// data dependencies and its stream's order still do. Sequential mode: push.
  int64_t push_beside(Instruction instruction);

  /// Throws Error(kInvalidInput) "plan: stage S task T[ block B]: what".
  [[noreturn]] void fail(const std::string& what) const;
  /// The same naming task `task` (a problem found after the task was lowered).
  [[noreturn]] void fail_at(int64_t task, const std::string& what) const;

  /// The finished program; the builder is spent.
  RankProgram take() { return std::move(program_); }

 private:
  void start_barrier();

  RankProgram program_;
  std::array<int64_t, kStreamClassNames.names.size()> last_on_stream_;  // -1: none yet
  std::vector<int64_t> barrier_;
  int64_t task_ = -1;
  int64_t block_ = -1;
};

}  // namespace dhelix
