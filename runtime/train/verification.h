#pragma once
// dhelix-run --verify: the same micro-batches through the plan's co-executed schedule and
// through the sequential one must give the same losses and gradients, bit for bit.
//
// Bitwise equality is the right test, not a tolerance: every kernel of the CPU backend has
// a fixed reduction order (runtime/cpu/kernels_cpu.h), OpenBLAS runs with a fixed thread
// count, collectives sum in group-rank order (runtime/comm/communicator.h), and weight
// gradients accumulate micro-batches in the plan's task order in both schedules. So the
// only thing the schedule could change is which data an op reads; any difference at all
// is a wrong dependency, a buffer overwritten too early, or a misrouted message.

#include <optional>
#include <string>
#include <vector>

#include "runtime/model/stage_model.h"

namespace dhelix::rt {

/// The losses and local gradients (before any synchronisation) after one iteration.
struct IterationSnapshot {
  std::vector<float> losses;  ///< per micro-batch; NaN where the loss ran on another rank
  std::vector<std::string> names;
  std::vector<std::vector<float>> gradients;
};

IterationSnapshot take_snapshot(StageModel& model);

/// The first difference between two snapshots of the same rank, in words ("gradient of
/// layers.1.w_qkv differs at element 37: 0.0123 (0x3c4985f0) vs 0.0124 (0x3c4b295f)"), or
/// nothing when they are bitwise equal.
std::optional<std::string> first_difference(const IterationSnapshot& expected,
                                            const IterationSnapshot& actual);

}  // namespace dhelix::rt
