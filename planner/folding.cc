#include "planner/folding.h"

#include <fmt/format.h>

#include <string>

#include "lib/divisibility_hints.h"
#include "lib/error.h"

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
  const int64_t chunk = layer / layers_per_chunk;  // 0 .. 2·pp-1 along the U
  return chunk < pp ? chunk : 2 * pp - 1 - chunk;
}

ChunkSide FoldedLayout::chunk_of_layer(int64_t layer) const {
  DHELIX_CHECK(layer >= 0 && layer < num_layers);
  return layer / layers_per_chunk < pp ? ChunkSide::kDown : ChunkSide::kUp;
}

int64_t UnfoldedLayout::stage_of_layer(int64_t layer) const {
  DHELIX_CHECK(layer >= 0 && layer < num_layers);
  return layer / layers_per_stage;
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

}  // namespace dhelix
