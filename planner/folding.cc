#include "planner/folding.h"

#include <fmt/format.h>

#include <string>

#include "lib/divisibility_hints.h"
#include "lib/error.h"
#include "lib/stage_split.h"

namespace dhelix {

namespace {

void check_sizes(int64_t num_layers, int64_t pp) {
  if (pp < 1) {
    throw Error(ErrorCode::kInvalidInput,
                fmt::format("pp = {}: the number of pipeline stages must be at least 1", pp));
  }
  if (num_layers < 1) {
    throw Error(ErrorCode::kInvalidInput,
                fmt::format("num_layers = {}: a model needs at least one layer", num_layers));
  }
}

}  // namespace

int64_t FoldedLayout::stage_of_layer(int64_t layer) const {
  DHELIX_CHECK(layer >= 0 && layer < num_layers);
  for (int64_t p = 0; p < pp; ++p) {
    const FoldedStage& s = stages[static_cast<size_t>(p)];
    if (s.down.contains(layer) || s.up.contains(layer)) return p;
  }
  DHELIX_CHECK_MSG(false, "layer outside the folded layout");
  return -1;
}

ChunkSide FoldedLayout::chunk_of_layer(int64_t layer) const {
  return stages[static_cast<size_t>(stage_of_layer(layer))].down.contains(layer) ? ChunkSide::kDown
                                                                                 : ChunkSide::kUp;
}

int64_t FoldedLayout::stage_layers(int64_t stage) const {
  const FoldedStage& s = stages.at(static_cast<size_t>(stage));
  return s.down.count + s.up.count;
}

int64_t UnfoldedLayout::stage_of_layer(int64_t layer) const {
  DHELIX_CHECK(layer >= 0 && layer < num_layers);
  for (int64_t p = 0; p < pp; ++p) {
    if (stages[static_cast<size_t>(p)].contains(layer)) return p;
  }
  DHELIX_CHECK_MSG(false, "layer outside the unfolded layout");
  return -1;
}

FoldedLayout fold_layers(int64_t num_layers, int64_t pp) {
  check_sizes(num_layers, pp);
  if (num_layers % (2 * pp) != 0) {
    const std::string valid_pp =
        num_layers % 2 == 0 ? fmt::format(", or a pp dividing num_layers / 2 = {} ({})",
                                          num_layers / 2, divisors_text(num_layers / 2))
                            : std::string(" (an odd layer count cannot be folded for any pp)");
    throw Error(
        ErrorCode::kInvalidInput,
        fmt::format("pp = {}: num_layers = {} is not divisible by 2·pp = {}; model "
                    "folding gives every stage two chunks of equal size: use "
                    "num_layers = {}{}",
                    pp, num_layers, 2 * pp, nearest_multiples_text(num_layers, 2 * pp), valid_pp));
  }
  FoldedLayout layout;
  layout.num_layers = num_layers;
  layout.pp = pp;
  layout.layers_per_chunk = num_layers / (2 * pp);
  const int64_t c = layout.layers_per_chunk;
  for (int64_t p = 0; p < pp; ++p) {
    layout.stages.push_back(
        FoldedStage{LayerRange{p * c, c}, LayerRange{num_layers - (p + 1) * c, c}});
  }
  return layout;
}

UnfoldedLayout unfold_layers(int64_t num_layers, int64_t pp) {
  check_sizes(num_layers, pp);
  if (num_layers % pp != 0) {
    throw Error(ErrorCode::kInvalidInput,
                fmt::format("pp = {}: num_layers = {} is not divisible by pp; every stage keeps "
                            "the same number of layers: use num_layers = {}, or a pp dividing "
                            "{} ({})",
                            pp, num_layers, nearest_multiples_text(num_layers, pp), num_layers,
                            divisors_text(num_layers)));
  }
  UnfoldedLayout layout;
  layout.num_layers = num_layers;
  layout.pp = pp;
  layout.layers_per_stage = num_layers / pp;
  layout.head_loss_stage = pp - 1;
  for (int64_t p = 0; p < pp; ++p) {
    layout.stages.push_back(LayerRange{p * layout.layers_per_stage, layout.layers_per_stage});
  }
  return layout;
}

namespace {

StageSplit checked_split(int64_t num_layers, int64_t pp, int64_t first, int64_t last) {
  check_sizes(num_layers, pp);
  std::string why;
  auto split = split_stages(num_layers, pp, first, last, why);
  if (!split) {
    throw Error(ErrorCode::kInvalidInput,
                fmt::format("pp = {}, decoder_first_pipeline_num_layers = {}, "
                            "decoder_last_pipeline_num_layers = {}: {}",
                            pp, first, last, why));
  }
  return *split;
}

}  // namespace

FoldedLayout fold_layers(int64_t num_layers, int64_t pp, int64_t first_stage_layers,
                         int64_t last_stage_layers) {
  if (first_stage_layers == 0 && last_stage_layers == 0) return fold_layers(num_layers, pp);
  const StageSplit split = checked_split(num_layers, pp, first_stage_layers, last_stage_layers);
  FoldedLayout layout;
  layout.num_layers = num_layers;
  layout.pp = pp;
  layout.layers_per_chunk = split.middle_stage_layers / 2;
  layout.stages.resize(static_cast<size_t>(pp));
  int64_t next = 0;  // walk the U: chunk v on stage v (down), then 2·pp-1-v (up)
  for (int64_t v = 0; v < 2 * pp; ++v) {
    const LayerRange range{next, split.chunks[static_cast<size_t>(v)]};
    if (v < pp) {
      layout.stages[static_cast<size_t>(v)].down = range;
    } else {
      layout.stages[static_cast<size_t>(2 * pp - 1 - v)].up = range;
    }
    next += range.count;
  }
  return layout;
}

UnfoldedLayout unfold_layers(int64_t num_layers, int64_t pp, int64_t first_stage_layers,
                             int64_t last_stage_layers) {
  if (first_stage_layers == 0 && last_stage_layers == 0) return unfold_layers(num_layers, pp);
  const StageSplit split = checked_split(num_layers, pp, first_stage_layers, last_stage_layers);
  UnfoldedLayout layout;
  layout.num_layers = num_layers;
  layout.pp = pp;
  layout.layers_per_stage = split.middle_stage_layers;
  layout.head_loss_stage = pp - 1;
  int64_t next = 0;
  for (int64_t count : split.unfolded) {
    layout.stages.push_back(LayerRange{next, count});
    next += count;
  }
  return layout;
}

namespace {

StageEnds checked_ends(int64_t num_layers, const ParallelSpec& parallel) {
  std::string why;
  const std::optional<StageEnds> ends = stage_ends(num_layers, parallel, why);
  if (!ends) {
    throw Error(
        ErrorCode::kInvalidInput,
        fmt::format("pp = {}, account_for_embedding_in_pipeline_split = {}, "
                    "account_for_loss_in_pipeline_split = {}: {}",
                    parallel.pp, parallel.account_for_embedding, parallel.account_for_loss, why));
  }
  return *ends;
}

}  // namespace

FoldedLayout fold_job_layers(int64_t num_layers, const ParallelSpec& parallel) {
  const StageEnds ends = checked_ends(num_layers, parallel);
  return fold_layers(num_layers, parallel.pp, ends.first, ends.last);
}

UnfoldedLayout unfold_job_layers(int64_t num_layers, const ParallelSpec& parallel) {
  const StageEnds ends = checked_ends(num_layers, parallel);
  return unfold_layers(num_layers, parallel.pp, ends.first, ends.last);
}

}  // namespace dhelix
