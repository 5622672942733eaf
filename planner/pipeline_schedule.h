#pragma once
// Per-stage task lists of one training iteration: DHelix's W-shaped pipeline over the
// folded layout (paper section 4.1, Figure 8) and Megatron-LM's 1F1B over the unfolded one.
//
// The W. Number the 2·pp chunks along the U: v = 0 .. 2·pp-1, chunk v on stage v (down) for
// v < pp and on stage 2·pp-1-v (up) otherwise. A micro-batch's forward walks v upwards,
// i.e. stages 0 -> pp-1 over the down chunks, then pp-1 -> 0 over the up chunks; the head
// and loss run on stage 0; its backward walks v downwards: stages 0 -> pp-1 over the up
// chunks, then pp-1 -> 0 over the down chunks. So a forward on a down chunk and a backward on
// an up chunk both travel 0 -> pp-1, and a forward on an up chunk and a backward on a down
// chunk both travel pp-1 -> 0: pairing them keeps both strands moving the same way.
//
// Put one time slot per chunk step and start micro-batch j at slot 2·j. Then on stage p
//     slot p + 2·j            forward(j, down)    and backward(j-pp, up)
//     slot 2·pp-1-p + 2·j     forward(j, up)      and backward(j-pp, down)
// (the forward of j reaches stage p's down chunk after p steps, its up chunk after 2·pp-1-p;
// the backward of i = j-pp starts 2·pp steps after micro-batch i's forward did). The two
// slot series have opposite parity, so a stage does one thing per slot: an SI block pairing
// the forward of micro-batch j with the backward of micro-batch j-pp (the prototype's
// "backward of i with forward of i+PP"), or whichever half exists. The generator lists
// each stage's tasks in slot order; any order that a slot assignment respecting every
// dependency produces is deadlock-free, and the simulator then times it with real costs.
// Warm-up is the slots with forwards only (j < pp), cool-down those with backwards only
// (j >= m); the head-loss step runs on stage 0 right after forward(j, up).
//
// Worked example, pp = 2, m = 4 (F3d = forward of micro-batch 3 on the down chunk, B0u =
// backward of micro-batch 0 on the up chunk, H0 = head and loss of micro-batch 0,
// F2d+B0u = SI block):
//
//     slot  stage 0          stage 1
//       0   F0d              .
//       1   .                F0d
//       2   F1d              F0u
//       3   F0u, then H0     F1d
//       4   F2d+B0u          F1u
//       5   F1u, then H1     F2d+B0u
//       6   F3d+B1u          F2u+B0d
//       7   F2u+B0d, then H2 F3d+B1u
//       8   B2u              F3u+B1d
//       9   F3u+B1d, then H3 B2u
//      10   B3u              B2d
//      11   B2d              B3u
//      12   .                B3d
//      13   B3d              .
//
// Stage 0 lists F0d F1d F0u H0 F2d+B0u F1u H1 F3d+B1u F2u+B0d H2 B2u F3u+B1d H3 B3u B2d B3d;
// stage 1 lists F0d F0u F1d F1u F2d+B0u F2u+B0d F3d+B1u F3u+B1d B2u B2d B3u B3d. Each stage
// runs 2·(m-pp) = 4 SI blocks. In general a stage runs 2·max(0, m-pp) SI blocks,
// 2·min(m, pp) lone forwards (micro-batches j < pp have no backward partner j-pp) and as
// many lone backwards (micro-batches i >= m-pp have no forward partner i+pp). With m <= pp
// there is no SI block at all: the W runs lone forwards and backwards only and strand
// interleaving gains nothing (the planner says so); its half-size chunks still fill and
// drain the pipeline a little faster than 1F1B for 2 <= m <= pp, as interleaved 1F1B does.
//
// 1F1B (Megatron-LM, unfolded): stage p runs min(pp-1-p, m) warm-up forwards, then
// alternates forward(warm-up + i) and backward(i), then the remaining backwards; the last
// stage runs the head-loss step between each forward and its backward.
//
// The baselines people run today (interleaved 1F1B, ZB-H1, ZB-V, DualPipeV) are generated
// in baseline_schedules.h with the same task and work-item vocabulary: interleaved 1F1B
// numbers a stage's model chunks (forward_model_chunk), the zero-bubble schedules split a
// backward into its input-gradient half I and weight-gradient half W (backward_split), and
// ZB-V and DualPipeV place the layers in the V that the W's folding already uses (shape kV:
// the same dependencies as kW, one micro-batch at a time instead of paired strands).

#include <cstdint>
#include <string>
#include <vector>

#include "planner/folding.h"

namespace dhelix {

// PipelineShape and PipelineScheme, with their name tables: lib/plan/plan_kinds.h (the plan
// stores them).

/// Whether the shape uses the folded layout (embedding, head and loss on stage 0).
bool folded_shape(PipelineShape shape);

/// The shape a scheme runs: the W for dhelix and wavelet+, 1F1B for Megatron, intra-batch
/// and ZB-H1, the interleaved pipeline for Megatron's virtual stages, the V for ZB-V and
/// DualPipeV.
PipelineShape scheme_shape(PipelineScheme scheme);

/// A backward half's share of the chunk's backward: all of it, or one half of the
/// zero-bubble split (BackwardWork, lib/op_catalogue.h): the input gradient I, which the
/// previous stage waits for, or the weight gradient W, which only the optimizer reads.
enum class BackwardSplit { kWhole, kInput, kWeight };

/// The plan's name for a backward half's share (BackwardShare, lib/plan/plan_kinds.h: the
/// same three cases), and back.
BackwardShare backward_share(BackwardSplit split);
BackwardSplit backward_split(BackwardShare share);

// TaskKind: lib/plan/plan_kinds.h (the plan stores it).

/// One thing a stage runs. A forward half (forward, SI block) names its micro-batch and
/// chunk; so does a backward half (backward, SI block). A head-loss step (final norm, head,
/// loss, and their backward) sets both micro-batch fields to its micro-batch and both
/// chunks to the chunk holding the last layer.
struct PipelineTask {
  TaskKind kind = TaskKind::kForward;
  int64_t forward_micro_batch = -1;
  ChunkSide forward_chunk = ChunkSide::kWhole;
  int64_t backward_micro_batch = -1;
  ChunkSide backward_chunk = ChunkSide::kWhole;
  /// Interleaved 1F1B: which of the stage's model chunks (0 .. model_chunks-1) each half
  /// runs (a head-loss step: the last); 0 for every other shape.
  int64_t forward_model_chunk = 0;
  int64_t backward_model_chunk = 0;
  bool numbered_chunks = false;  ///< interleaved: the label names the model chunks
  BackwardSplit backward_split = BackwardSplit::kWhole;  ///< the backward half's share

  bool has_forward() const { return kind == TaskKind::kForward || kind == TaskKind::kSiBlock; }
  bool has_backward() const { return kind == TaskKind::kBackward || kind == TaskKind::kSiBlock; }
  /// "F3d", "B1u", "F5d+B1u", "H3", "F2" (whole chunk): for traces, tests and messages.
  /// Interleaved chunks add ".c" ("F3.1": micro-batch 3 on model chunk 1); a split backward
  /// reads "I1u" (input gradient) or "W1u" (weight gradient), as PyTorch's pipeline action
  /// IR spells them.
  std::string label() const;
};

/// Every stage's task list, in execution order.
struct PipelineSchedule {
  PipelineShape shape = PipelineShape::kW;
  int64_t pp = 0;
  int64_t num_micro_batches = 0;
  int64_t embedding_stage = 0;
  int64_t head_loss_stage = 0;
  ChunkSide first_chunk = ChunkSide::kDown;       ///< chunk holding layer 0 (with the embedding)
  ChunkSide last_chunk = ChunkSide::kUp;          ///< chunk holding layer L-1 (before the head)
  int64_t model_chunks = 1;                       ///< interleaved 1F1B's v; 1 for every other shape
  std::vector<std::vector<PipelineTask>> stages;  ///< size pp

  /// SI blocks on one stage.
  int64_t si_block_count(int64_t stage) const;
};

/// The W-shaped schedule for pp >= 1 stages and m >= 1 micro-batches; Error(kInvalidInput)
/// otherwise.
PipelineSchedule make_w_schedule(int64_t pp, int64_t num_micro_batches);

/// Megatron-LM's 1F1B schedule (unfolded, single strand) for pp >= 1, m >= 1.
PipelineSchedule make_one_f_one_b_schedule(int64_t pp, int64_t num_micro_batches);

PipelineSchedule make_schedule(PipelineShape shape, int64_t pp, int64_t num_micro_batches);

/// What one piece of work does: a forward or backward of one chunk, or a head-loss step.
/// (kBackward: a whole backward, or the input-gradient half of a split one; kWeightGrad: the
/// weight-gradient half.)
enum class WorkPass { kForward, kBackward, kHeadLoss, kWeightGrad };

/// One micro-batch's pass through one chunk of one stage; the unit dependencies join.
struct WorkItem {
  WorkPass pass = WorkPass::kForward;
  int64_t micro_batch = 0;
  ChunkSide chunk = ChunkSide::kWhole;
  int64_t stage = 0;
  int64_t model_chunk = 0;  ///< interleaved 1F1B only

  bool operator==(const WorkItem& other) const = default;
};

/// The work items a task performs: one, or two for an SI block (forward first).
std::vector<WorkItem> task_work(const PipelineTask& task, int64_t stage);

/// The work items whose results `item` consumes: the activation (forward), the output
/// gradient (backward), the last chunk's forward (head-loss). A backward also consumes its
/// own forward's saved activations (same stage); a weight-gradient half its input-gradient
/// half. An input on another stage arrives by a point-to-point transfer; one on the same
/// stage needs none.
std::vector<WorkItem> work_inputs(const PipelineSchedule& schedule, const WorkItem& item);

}  // namespace dhelix
