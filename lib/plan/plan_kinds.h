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

/// Which share of a chunk's backward a backward part runs (the zero-bubble split, Qi et al.
/// 2024): all of it; its input gradient I (every op but the weight-gradient GEMMs: what the
/// previous stage waits for); or its weight gradient W (only those GEMMs,
/// backward_work(op) == kWeightGradient in lib/op_catalogue.h), deferred to fill a bubble.
/// Only a lone backward task is split; an SI block's backward is whole.
enum class BackwardShare { kWhole, kInput, kWeight };
inline constexpr EnumNames<BackwardShare, 3> kBackwardShareNames{{"whole", "input", "weight"}};
/// "whole", "input", "weight".
constexpr const char* backward_share_name(BackwardShare share) {
  return kBackwardShareNames.name(share);
}

/// Which search scope a pairing's stage costs use: one layer pair at a time (the paper's)
/// or windows of several layers.
enum class PairingScope { kLayer, kChunk };
inline constexpr EnumNames<PairingScope, 2> kPairingScopeNames{{"layer", "chunk"}};

/// Which pipeline a schedule implements (planner/pipeline_schedule.h): how layers sit on
/// stages and work items depend on each other. kW: DHelix's folded U (down and up chunk),
/// paired strands; kOneFOneB: Megatron-LM's one whole chunk per stage; kInterleaved: v model
/// chunks per stage, chunk c of stage p is virtual stage c·pp + p; kV: the folded U walked
/// by one micro-batch at a time (ZB-V, DualPipeV).
enum class PipelineShape { kW, kOneFOneB, kInterleaved, kV };
inline constexpr EnumNames<PipelineShape, 4> kPipelineShapeNames{{"w", "1f1b", "interleaved", "v"}};
/// "w", "1f1b", "interleaved", "v".
constexpr const char* pipeline_shape_name(PipelineShape shape) {
  return kPipelineShapeNames.name(shape);
}

/// Which shape the dhelix plan may take (dhelix-plan --shape): the W, the V, Megatron's
/// interleaved stages, or whichever is faster and fits (planner/dhelix_shapes.h).
enum class ShapeRequest { kAuto, kW, kV, kInterleaved };
inline constexpr EnumNames<ShapeRequest, 4> kShapeRequestNames{{"auto", "w", "v", "interleaved"}};
/// "auto", "w", "v", "interleaved".
constexpr const char* shape_request_name(ShapeRequest request) {
  return kShapeRequestNames.name(request);
}

/// The schemes the planner compares, in the order a plan lists them; they share the cost
/// model and differ in shape and in the per-chunk costs they are fed (docs/pipeline.md):
/// DHelix (the W with the exact pairing search's SI blocks), Wavelet+ (the W with
/// round-robin paired SI blocks), intra-batch overlap (1F1B with overlapped chunk times),
/// Megatron 1F1B (solo chunk times); then the schedules of the last years
/// (planner/baseline_schedules.h), all with solo chunk times except DualPipeV's overlapped
/// forward-backward pairs, which cost what the pairing search gives DHelix's SI blocks (the
/// most generous reading of its hand-written overlap: an upper bound, not a baseline);
/// then the two baselines as people run them (planner/handwritten_pairs.h): DualPipeV with
/// DeepSeek-V3's hand-written pair order, and Megatron-Core's combined 1F1B
/// (--overlap-moe-expert-parallel-comm).
enum class PipelineScheme {
  kDHelix,
  kWaveletPlus,
  kIntraBatch,
  kMegatron1F1B,
  kMegatronInterleaved,
  kZeroBubbleH1,
  kZeroBubbleV,
  kDualPipeV,
  kDualPipeVHandwritten,
  kMegatronA2aOverlap
};
inline constexpr EnumNames<PipelineScheme, 10> kPipelineSchemeNames{
    {"dhelix", "wavelet+", "intra-batch", "megatron-1f1b", "megatron-interleaved", "zb-h1", "zb-v",
     "dualpipev", "dualpipev-handwritten", "megatron-a2a-overlap"}};
/// "dhelix", "wavelet+", "intra-batch", "megatron-1f1b", "megatron-interleaved", "zb-h1",
/// "zb-v", "dualpipev", "dualpipev-handwritten", "megatron-a2a-overlap".
constexpr const char* pipeline_scheme_name(PipelineScheme scheme) {
  return kPipelineSchemeNames.name(scheme);
}

/// Whether people run `scheme` as it is priced: the schemes dhelix's gain is stated over
/// (megatron-1f1b, megatron-interleaved, zb-h1, zb-v, dualpipev-handwritten,
/// megatron-a2a-overlap). dhelix itself, the paper's layer-level comparisons (wavelet+,
/// intra-batch) and the generous dualpipev (an upper bound) are not.
constexpr bool run_as_priced(PipelineScheme scheme) {
  switch (scheme) {
    case PipelineScheme::kMegatron1F1B:
    case PipelineScheme::kMegatronInterleaved:
    case PipelineScheme::kZeroBubbleH1:
    case PipelineScheme::kZeroBubbleV:
    case PipelineScheme::kDualPipeVHandwritten:
    case PipelineScheme::kMegatronA2aOverlap:
      return true;
    case PipelineScheme::kDHelix:
    case PipelineScheme::kWaveletPlus:
    case PipelineScheme::kIntraBatch:
    case PipelineScheme::kDualPipeV:
      return false;
  }
  return false;
}

}  // namespace dhelix
