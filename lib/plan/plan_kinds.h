#pragma once
// The enums a plan is made of, and their name tables (lib/enum_names.h): the plan stores
// them typed; lib/plan/plan_reader.cc and lib/plan/plan_writer.cc convert at the file
// edge, and messages name them through the same tables. The enums of an op (OpKind,
// StreamClass, Pass: lib/op_catalogue.h) and of a process group (ParallelDim:
// lib/parallel_spec.h) keep their homes and tables there.

#include "lib/enum_names.h"

namespace dhelix {

/// What a task of a stage's list does: a chunk's forward or backward alone, an SI block
/// (one micro-batch's forward co-executed with another's backward), or the head and loss.
enum class TaskKind { kForward, kBackward, kSiBlock, kHeadLoss };
inline constexpr EnumNames<TaskKind, 4> kTaskKindNames{
    {"forward", "backward", "si_block", "head_loss"}};
/// "forward", "backward", "si_block", "head_loss".
constexpr const char* task_kind_name(TaskKind kind) { return kTaskKindNames.name(kind); }

/// Which chunk of a stage a task part runs: the W pipeline's down or up chunk, or the whole
/// stage (1F1B).
enum class ChunkSide { kDown, kUp, kWhole };
inline constexpr EnumNames<ChunkSide, 3> kChunkSideNames{{"down", "up", "whole"}};
/// "down", "up", "whole".
constexpr const char* chunk_side_name(ChunkSide side) { return kChunkSideNames.name(side); }

/// Which search scope a pairing's stage costs use: one layer pair at a time (the paper's)
/// or windows of several layers.
enum class PairingScope { kLayer, kChunk };
inline constexpr EnumNames<PairingScope, 2> kPairingScopeNames{{"layer", "chunk"}};

}  // namespace dhelix
