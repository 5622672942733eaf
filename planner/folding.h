#pragma once
// Where the layers live: DHelix's U-shaped model folding (paper section 4.1, Figure 7) and
// the classic unfolded layout of Megatron-LM's 1F1B pipeline.
//
// Folding cuts the L layers into 2·pp chunks of c = L / (2·pp) consecutive layers. Stage p
// holds chunk p (the "down" chunk, layers p·c .. p·c+c-1) and its mirror, chunk 2·pp-1-p
// (the "up" chunk, layers L-(p+1)·c .. L-p·c-1): the layer order runs down the stages
// and comes back up, a U. With L = 32, pp = 4 (c = 4):
//
//     stage 0: L0-L3   + L28-L31   embedding, final norm, head, loss
//     stage 1: L4-L7   + L24-L27
//     stage 2: L8-L11  + L20-L23
//     stage 3: L12-L15 + L16-L19   (the bottom of the U: both chunks are consecutive)
//
// Every stage keeps L/pp layers, as unfolded, so weights per stage do not change; stage 0
// holds both ends of the model and therefore the embedding and the head with the loss.
// The unfolded layout gives stage p the L/pp layers p·L/pp .. (p+1)·L/pp-1, the embedding
// on stage 0 and the final norm, head and loss on stage pp-1.
//
// Uneven stages (Megatron's --decoder-first/last-pipeline-num-layers F and La): the layer
// counts of lib/stage_split.h. Unfolded, stage 0 holds F layers and stage pp-1 holds La;
// folded, stage 0's down chunk holds F - c and its up chunk La - c layers, where c is half
// a middle stage's count. L = 126, pp = 16, F = La = 7 (c = 4):
//
//     folded   stage 0: L0-L2 + L123-L125   stage 1: L3-L6 + L119-L122  ...  stage 15: L59-L66
//     unfolded stage 0: L0-L6   stage 1: L7-L14  ...  stage 14: L111-L118   stage 15: L119-L125

#include <cstdint>
#include <vector>

#include "lib/parallel_spec.h"
#include "lib/plan/plan_kinds.h"

namespace dhelix {

// ChunkSide (lib/plan/plan_kinds.h): the folded layout's down chunk (forward runs stage 0 ->
// pp-1), its up chunk (forward runs pp-1 -> 0), or the unfolded layout's single chunk.

/// Consecutive layers first .. first+count-1, listed in forward execution order.
struct LayerRange {
  int64_t first = 0;
  int64_t count = 0;

  int64_t last() const { return first + count - 1; }
  bool contains(int64_t layer) const { return layer >= first && layer < first + count; }
};

/// One stage of the folded layout.
struct FoldedStage {
  LayerRange down;  ///< chunk p: layers p·c .. p·c+c-1 (even stages)
  LayerRange up;    ///< chunk 2·pp-1-p: the mirror layers L-(p+1)·c .. L-p·c-1 (even stages)

  const LayerRange& chunk(ChunkSide side) const { return side == ChunkSide::kUp ? up : down; }
};

/// The U-shaped layout of L layers over pp stages.
struct FoldedLayout {
  int64_t num_layers = 0;
  int64_t pp = 0;
  int64_t layers_per_chunk = 0;     ///< c = L / (2·pp); a middle stage's chunk when uneven
  std::vector<FoldedStage> stages;  ///< size pp
  int64_t embedding_stage = 0;      ///< always 0: it holds layer 0
  int64_t head_loss_stage = 0;      ///< always 0: it holds layer L-1 (final norm, head, loss)

  /// Layers a middle stage keeps: 2·c (= L / pp with even stages).
  int64_t layers_per_stage() const { return 2 * layers_per_chunk; }
  /// Layers stage p keeps (down and up chunks).
  int64_t stage_layers(int64_t stage) const;
  /// The stage and chunk holding `layer` (0 <= layer < num_layers).
  int64_t stage_of_layer(int64_t layer) const;
  ChunkSide chunk_of_layer(int64_t layer) const;
};

/// The 1F1B layout: stage p keeps layers p·L/pp .. (p+1)·L/pp-1.
struct UnfoldedLayout {
  int64_t num_layers = 0;
  int64_t pp = 0;
  int64_t layers_per_stage = 0;    ///< L / pp; a middle stage's count when uneven
  std::vector<LayerRange> stages;  ///< size pp
  int64_t embedding_stage = 0;     ///< 0
  int64_t head_loss_stage = 0;     ///< pp - 1

  int64_t stage_of_layer(int64_t layer) const;
};

/// Folds `num_layers` layers over `pp` stages. Throws Error(kInvalidInput) when pp < 1,
/// num_layers < 1 or num_layers % (2·pp) != 0; the message names the nearest valid layer
/// counts and the pp values that would divide.
FoldedLayout fold_layers(int64_t num_layers, int64_t pp);

/// The unfolded 1F1B layout. Throws Error(kInvalidInput) when num_layers % pp != 0, naming
/// the nearest valid layer counts and pp values.
UnfoldedLayout unfold_layers(int64_t num_layers, int64_t pp);

/// Both layouts with the first and last 1F1B stages holding `first_stage_layers` and
/// `last_stage_layers` layers (0: not set; both 0 is the even split above). Throws
/// Error(kInvalidInput) naming the rule of lib/stage_split.h that the counts break.
FoldedLayout fold_layers(int64_t num_layers, int64_t pp, int64_t first_stage_layers,
                         int64_t last_stage_layers);
UnfoldedLayout unfold_layers(int64_t num_layers, int64_t pp, int64_t first_stage_layers,
                             int64_t last_stage_layers);

/// Both layouts of a job's `num_layers` layers under `parallel`: the ends it sets, its
/// account_for flags included (lib/stage_split.h: stage_ends). Throws Error(kInvalidInput)
/// naming the rule they break.
FoldedLayout fold_job_layers(int64_t num_layers, const ParallelSpec& parallel);
UnfoldedLayout unfold_job_layers(int64_t num_layers, const ParallelSpec& parallel);

}  // namespace dhelix
