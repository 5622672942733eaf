#pragma once
// Times one iteration of a pipeline schedule (pipeline_schedule.h) from per-chunk costs.
//
// Model. Each stage runs its task list in order on one compute timeline. A task starts when
// its stage is free and every input has arrived: an input made on the same stage is ready
// when its task ends; one made on a neighbour stage arrives p2p_us (the sender's figure)
// after its task ends. Point-to-point transfers run on a communication stream beside the
// compute, so they cost only this delay; what part of it made a stage wait is PP time
// exposed, the rest is hidden. Both halves of an SI block deliver their results when the
// block ends (the pairing interleaves layers, so the forward's last layer may finish
// earlier; ending both at the block's end is the safe side). TP, CP and EP time, hidden and
// exposed, come with each task kind's costs (the layer-level pairing search gives them) and
// are summed. After its last task a stage finishes its DP reduction (dp_reduce_us: what
// Megatron's overlapped reduction and gather leave exposed, planner/dp_overlap.h; the hidden
// rest is dp_hidden_us) and steps the optimizer (optimizer_us); the iteration ends when the
// slowest stage has done both.
//
// Memory. A forward of a chunk keeps its layers' activations for that micro-batch until the
// backward of the same chunk ends; the simulator charges a forward's allocation at its start
// and a backward's release at its end (the conservative reading of a step curve). In an SI
// block the pairing alternates layer pairs of the stage's two equal chunks, so at its worst
// moment the stage holds one more layer's activations than at the block's start and at its
// end as many as at its start; the head-loss step holds its transient (logits) while it
// runs. A split backward (baseline_schedules.h) frees the chunk's activations when its
// weight-gradient half W ends, not after the input-gradient half I: the wgrads read them.
//
// Uneven stages. A stage's chunks may hold different layer counts (the folded stage 0 with
// Megatron's first/last-stage layer counts, docs/pipeline.md): a chunk's forward and
// backward scale with its layers; an SI block of a forward of nf layers and a backward of
// nb layers co-runs min(nf, nb) layer pairs (si_block_us scaled to that many pairs) and
// runs the other |nf - nb| layers alone. With recompute, a chunk keeps what
// memory_model.h's chunk_activation_bytes says, and a backward holds the recomputed
// group's activations (backward_transient_bytes) on top while it runs. Interleaved 1F1B's
// model chunks may differ too (model_chunk_layers): each is timed and kept by its own
// layers, the same way.
//
// Hand-timed example (pipeline_simulator_test.cc): the W of pipeline_schedule.h with pp = 2,
// m = 4, unit forward and backward chunks, SI blocks of 2, no transfer delay, takes 20 units,
// exactly like 1F1B with stages of two chunks ((m + pp - 1)·(2 + 2) = 20): same bubble
// ratio, 4/20 = 0.2. With SI blocks of 1.5 the W takes 17.

#include <array>
#include <cstdint>
#include <vector>

#include "lib/parallel_spec.h"
#include "planner/pipeline_schedule.h"

namespace dhelix {

/// Communication time of one type, split by whether compute ran beside it.
struct CommTime {
  double hidden_us = 0;
  double exposed_us = 0;
};

/// Communication time per type (TP, CP, EP, DP, PP), indexed by ParallelDim.
struct CommBreakdown {
  std::array<CommTime, 5> by_dim{};

  CommTime& operator[](ParallelDim dim) { return by_dim[static_cast<size_t>(dim)]; }
  const CommTime& operator[](ParallelDim dim) const { return by_dim[static_cast<size_t>(dim)]; }
  CommBreakdown& operator+=(const CommBreakdown& other);
  /// Every figure multiplied by `factor` (a chunk of `factor` identical layers).
  CommBreakdown scaled(double factor) const;
  double total_hidden_us() const;
  double total_exposed_us() const;
};

/// What a stage's tasks cost, for one micro-batch. A chunk is the folded layout's down or up
/// chunk for the W, the stage's whole layer range for 1F1B.
struct StageCosts {
  double forward_chunk_us = 0;   ///< forward of one chunk
  double backward_chunk_us = 0;  ///< backward of one chunk (dgrad and wgrad)
  /// The weight-gradient part W of backward_chunk_us (BackwardWork, lib/op_catalogue.h):
  /// a split backward runs B = backward_chunk_us - this (with backward_comm) and W apart.
  double backward_weight_chunk_us = 0;
  /// The forward of one chunk co-run with the backward of another (same layer count): the
  /// pairing search's time of a layer pair times the layers per chunk.
  double si_block_us = 0;
  CommBreakdown forward_comm;   ///< TP, CP, EP time inside forward_chunk_us
  CommBreakdown backward_comm;  ///< inside backward_chunk_us
  CommBreakdown si_block_comm;  ///< inside si_block_us
  /// Embedding forward and backward, added to the first chunk's forward and backward on the
  /// embedding stage (ignored elsewhere).
  double embedding_forward_us = 0;
  double embedding_backward_us = 0;
  /// Final norm, head and loss, forward and backward: the head-loss step on its stage.
  double head_loss_forward_us = 0;
  double head_loss_backward_us = 0;
  double p2p_us = 0;        ///< one activation or gradient sent to a neighbour stage
  int64_t p2p_bytes = 0;    ///< bytes of that transfer
  double dp_reduce_us = 0;  ///< this stage's exposed DP reduction and gather, after its last task
  double dp_hidden_us = 0;  ///< DP time hidden under the stage's backward and forward
  double optimizer_us = 0;  ///< this stage's optimizer step
  int64_t layers_per_chunk = 1;
  int64_t activation_bytes_per_layer = 0;  ///< kept per layer per micro-batch (memory_model.h)
  int64_t head_loss_transient_bytes = 0;   ///< live during a head-loss step only
  // ----- uneven stages and activation recompute -----
  /// Layers of the W's up chunk when they differ from layers_per_chunk (0: the same). The
  /// figures above are those of a chunk of layers_per_chunk layers; see the file comment.
  int64_t up_layers = 0;
  /// Bytes the down (or whole) and the up chunk keep per micro-batch; -1: their layers
  /// times activation_bytes_per_layer.
  int64_t chunk_activation_bytes = -1;
  int64_t up_chunk_activation_bytes = -1;
  /// Live on top of the kept bytes while a backward (or an SI block) runs: one recompute
  /// group's activations, all-gather CP's whole-sequence K/V and dK/dV.
  int64_t backward_transient_bytes = 0;
  /// Live on top of the kept bytes while a forward (or an SI block, besides the backward's)
  /// runs: all-gather CP's whole-sequence K/V (memory_model.h).
  int64_t forward_transient_bytes = 0;
  /// An SI block holds its forward's whole chunk on top of what it started with (DualPipeV's
  /// count, PP+1 chunks), instead of DHelix's one extra layer of a layer-by-layer pairing.
  bool si_block_holds_whole_forward = false;
  /// Interleaved 1F1B: the layers of each model chunk when they differ (Megatron's
  /// account_for flags take a layer off stage 0's first and stage pp-1's last model chunk,
  /// lib/stage_split.h), and the bytes each keeps; empty: every model chunk holds
  /// layers_per_chunk layers and keeps chunk_activation_bytes.
  std::vector<int64_t> model_chunk_layers;
  std::vector<int64_t> model_chunk_activation_bytes;

  /// Layers of the chunk on `side` (of model chunk `model_chunk` under interleaved 1F1B).
  int64_t chunk_layers(ChunkSide side, int64_t model_chunk = 0) const {
    if (!model_chunk_layers.empty()) return model_chunk_layers.at(static_cast<size_t>(model_chunk));
    return side == ChunkSide::kUp && up_layers > 0 ? up_layers : layers_per_chunk;
  }
};

/// One layer's costs as the layer-level search reports them.
struct LayerCosts {
  double forward_us = 0;
  double backward_us = 0;
  double si_pair_us = 0;  ///< one layer's forward co-run with one layer's backward
  /// The weight-gradient GEMMs of backward_us: their solo times summed (they are compute
  /// ops on one stream, so a backward without them is shorter by about this much).
  double backward_weight_us = 0;
  CommBreakdown forward_comm;
  CommBreakdown backward_comm;
  CommBreakdown si_pair_comm;
  int64_t activation_bytes = 0;  ///< per micro-batch
};

/// `extras` with its chunk fields set from `layer` for chunks of `layers_per_chunk` layers.
StageCosts chunk_costs(const LayerCosts& layer, int64_t layers_per_chunk, StageCosts extras);

/// One task as it ran.
struct TimelineEntry {
  PipelineTask task;
  double start_us = 0;
  double end_us = 0;
};

/// Live activation bytes on a stage from time_us on (a step curve).
struct MemoryPoint {
  double time_us = 0;
  int64_t bytes = 0;
};

struct StageSimulation {
  std::vector<TimelineEntry> timeline;  ///< in execution order
  double busy_us = 0;                   ///< sum of task times
  double last_end_us = 0;               ///< end of the stage's last task
  double finish_us = 0;                 ///< after DP reduction and optimizer
  CommBreakdown comm;                   ///< summed over the stage's tasks, PP and DP included
  std::vector<MemoryPoint> activation_curve;
  int64_t peak_activation_bytes = 0;
  double peak_activation_time_us = 0;
  int64_t p2p_received = 0;  ///< transfers this stage received
};

struct PipelineSimulation {
  std::vector<StageSimulation> stages;
  double pipeline_us = 0;   ///< end of the last task on any stage
  double iteration_us = 0;  ///< the slowest stage's finish_us
  /// Idle share of the stages' time up to pipeline_us (DP reduction and optimizer excluded).
  double bubble_ratio = 0;
  int64_t p2p_transfers = 0;
  int64_t p2p_bytes = 0;
  CommBreakdown comm;  ///< summed over stages (GPU-microseconds)

  int64_t peak_activation_bytes() const;  ///< over stages
};

/// Simulates the schedule. `costs` has one entry per stage. Throws Error(kInvalidInput)
/// on a size mismatch or a negative time, Error(kInternal) if the schedule deadlocks.
PipelineSimulation simulate_pipeline(const PipelineSchedule& schedule,
                                     const std::vector<StageCosts>& costs);

/// Each stage's peak_activation_bytes exactly as simulate_pipeline finds it, without the
/// times: a stage runs its tasks in the schedule's order, and its live bytes change at
/// each task's start and end only, so the peak depends on that order and the byte fields
/// of `costs`, never on a duration. The configuration search uses it to reject a
/// configuration that cannot fit before its pairing search runs. Errors as simulate_pipeline
/// (a size mismatch; no deadlock check: the order alone decides).
std::vector<int64_t> activation_peaks(const PipelineSchedule& schedule,
                                      const std::vector<StageCosts>& costs);

}  // namespace dhelix
