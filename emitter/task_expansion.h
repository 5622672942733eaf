#pragma once
// A plan task expanded into the ops it runs, with absolute predicted times: what the Chrome
// trace draws (emitter/chrome_trace.h) and what its tests count.
//
// An SI block task over c layers runs the stage's pairing template c times: c copies of the
// layer blocks, or, in the "chunk" scope, c / window_layers copies of the window blocks and
// then the remainder blocks (the last, shorter window). Block k starts where block k-1 ended;
// an op starts at task start + block offset + its timing in the block. The forward strand
// walks the forward chunk's layers upwards, the backward strand the backward chunk's layers
// downwards, so the j-th layer pair of the task is (forward first+j, backward last-j).
//
// A forward-only or backward-only task (warm-up, cool-down) has no co-run template, and the
// plan does not keep per-op timings of a strand run alone. Its ops are laid back to back in
// topological order at their solo times, and squeezed uniformly when the sum overruns the
// task (the simulator's strand-alone time overlaps some communication with compute, so it is
// shorter than the sum). Those ops are marked `approximate`.
//
// Time a task holds beyond its layers (the embedding on the first stage) becomes one extra
// event: "embedding.fwd" before the layers, "embedding.bwd" after them, or "other" after
// them when the plan does not say what it is. A head-loss task is one "head_loss" event.
//
// Worked example: stage 1 of examples/plans/llama-39b-a40-dp2-tp8-cp2-pp2-seq16k.json,
// task F2d+B0u over 3 layers, chunk scope with 2-layer windows: 11 window blocks (layers
// 0-1 of the task, 432.409 ms) then 7 remainder blocks (layer 2, 220.806 ms), 653.215 ms in
// all, which is exactly the task's predicted duration.

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "lib/plan/plan.h"
#include "lib/plan/plan_blocks.h"  // split_window_op_id, used by callers

namespace dhelix {

/// One op (or extra step) of an expanded task.
struct ExpandedOp {
  std::string name;  ///< op id without the "L<k>." prefix, or "embedding.fwd", "head_loss", ...
  std::optional<Pass> strand;  ///< none for an extra step
  StreamClass stream = StreamClass::kCompute;
  std::optional<ParallelDim> group;  ///< communication group; none for compute and extras
  int64_t micro_batch = -1;          ///< -1 for an extra step that belongs to no one micro-batch
  int64_t layer = -1;                ///< absolute layer index; -1 for extra steps
  /// The SI block's number in its template, counted from 0 as the report and the pairing
  /// picture count them; -1 outside SI blocks.
  int64_t block = -1;
  const char* blocks =
      "";               ///< the template: "layer", "window" or "remainder"; "" outside SI blocks
  double start_us = 0;  ///< absolute predicted start
  double end_us = 0;    ///< absolute predicted end, >= start_us
  bool approximate = false;  ///< laid out from solo times (no co-run timing in the plan)
};

/// The ops of `task` (a task of `stage` of `plan`), in start order (ties: stream, then name).
/// Throws Error(kInvalidInput) when the task refers to a missing pairing, an SI block's
/// forward and backward layer counts differ, or a block timing names an unknown op.
std::vector<ExpandedOp> expand_task(const Plan& plan, const PlanStage& stage, const PlanTask& task);

/// "local comm" for local_comm and so on: a stream's name in pictures and traces.
const char* stream_title(StreamClass stream);

}  // namespace dhelix
