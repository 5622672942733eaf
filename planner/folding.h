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

#include <cstdint>
#include <vector>

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
  LayerRange down;  ///< chunk p: layers p·c .. p·c+c-1
  LayerRange up;    ///< chunk 2·pp-1-p: the mirror layers L-(p+1)·c .. L-p·c-1
};

/// The U-shaped layout of L layers over pp stages.
struct FoldedLayout {
  int64_t num_layers = 0;
  int64_t pp = 0;
  int64_t layers_per_chunk = 0;     ///< c = L / (2·pp)
  std::vector<FoldedStage> stages;  ///< size pp
  int64_t embedding_stage = 0;      ///< always 0: it holds layer 0
  int64_t head_loss_stage = 0;      ///< always 0: it holds layer L-1 (final norm, head, loss)

  /// Layers stage p keeps: 2·c = L / pp.
  int64_t layers_per_stage() const { return 2 * layers_per_chunk; }
  /// The stage and chunk holding `layer` (0 <= layer < num_layers).
  int64_t stage_of_layer(int64_t layer) const;
  ChunkSide chunk_of_layer(int64_t layer) const;
};

/// The 1F1B layout: stage p keeps layers p·L/pp .. (p+1)·L/pp-1.
struct UnfoldedLayout {
  int64_t num_layers = 0;
  int64_t pp = 0;
  int64_t layers_per_stage = 0;    ///< L / pp
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

}  // namespace dhelix
