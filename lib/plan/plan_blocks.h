#pragma once
// How an SI block task of a plan unrolls into template blocks: shared by the Chrome trace
// (emitter/task_expansion.h), the rank programs the runtime executes and the plan checker
// (lib/plan/rank_program.h), so that all three read a plan the same way.
//
// An SI block task over c layers runs the stage's pairing template c times: c copies of the
// layer blocks, or, in the "chunk" scope, c / window_layers copies of the window blocks and
// then the remainder blocks (the last, shorter window). The forward strand walks the
// forward chunk's layers upwards, the backward strand the backward chunk's layers
// downwards, so the j-th layer pair of the task is (forward first + j, backward last - j).
// In a window's blocks an op of the window's k-th layer is named "L<k>.<id>".

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "lib/plan/plan.h"

namespace dhelix {

/// One template block sequence placed in a task: the blocks, and the task-local index of
/// the layer its "L0" ops belong to.
struct PlacedBlocks {
  const std::vector<PlanBlock>* blocks = nullptr;
  int64_t first_local_layer = 0;
};

/// The block sequences an SI block task over `layers` layer pairs runs, in order.
std::vector<PlacedBlocks> si_block_sequence(const PlanPairing& pairing, int64_t layers);

/// The SI block task that follows `task` in `stage`'s list with no forward or backward task
/// between them (head-loss tasks may be), pairing at least one layer; nullptr otherwise.
const PlanTask* next_si_block_task(const PlanStage& stage, const PlanTask& task);

/// The absolute layer of a strand's j-th layer in a task part (backward walks downwards).
int64_t strand_layer(const PlanTaskPart& part, bool backward, int64_t j);

/// "L2.fwd.gemm_qkv" -> 2 and "fwd.gemm_qkv"; an id without the prefix -> 0 and itself.
std::pair<int64_t, std::string> split_window_op_id(const std::string& id);

}  // namespace dhelix
