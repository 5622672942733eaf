#include "lib/plan/plan_blocks.h"

namespace dhelix {

std::vector<PlacedBlocks> si_block_sequence(const PlanPairing& pairing, int64_t layers) {
  std::vector<PlacedBlocks> out;
  const bool windows = pairing.scope == PairingScope::kChunk && pairing.window_layers > 1 &&
                       !pairing.window_blocks.empty();
  if (!windows) {
    for (int64_t j = 0; j < layers; ++j) out.push_back({&pairing.layer_blocks, j});
    return out;
  }
  const int64_t full = layers / pairing.window_layers;
  for (int64_t w = 0; w < full; ++w) {
    out.push_back({&pairing.window_blocks, w * pairing.window_layers});
  }
  const int64_t rest = layers % pairing.window_layers;
  const bool remainder_fits =
      pairing.chunk_layers % pairing.window_layers == rest && !pairing.remainder_blocks.empty();
  if (rest > 0 && remainder_fits) {
    out.push_back({&pairing.remainder_blocks, full * pairing.window_layers});
  } else {
    // Not the chunk the windows were fitted for: the remaining layers pair one by one.
    for (int64_t j = full * pairing.window_layers; j < layers; ++j) {
      out.push_back({&pairing.layer_blocks, j});
    }
  }
  return out;
}

const PlanTask* next_si_block_task(const PlanStage& stage, const PlanTask& task) {
  const auto after = static_cast<size_t>(&task - stage.tasks.data()) + 1;
  for (size_t t = after; t < stage.tasks.size(); ++t) {
    const PlanTask& candidate = stage.tasks[t];
    if (candidate.kind == TaskKind::kHeadLoss) continue;
    const bool pairs = candidate.kind == TaskKind::kSiBlock && candidate.forward &&
                       candidate.backward && candidate.forward->layers.count > 0 &&
                       candidate.backward->layers.count > 0;
    return pairs ? &candidate : nullptr;
  }
  return nullptr;
}

int64_t strand_layer(const PlanTaskPart& part, bool backward, int64_t j) {
  return backward ? part.layers.first + part.layers.count - 1 - j : part.layers.first + j;
}

std::pair<int64_t, std::string> split_window_op_id(const std::string& id) {
  if (id.size() < 3 || id[0] != 'L') return {0, id};
  const size_t dot = id.find('.');
  if (dot == std::string::npos || dot == 1) return {0, id};
  int64_t k = 0;
  for (size_t i = 1; i < dot; ++i) {
    if (id[i] < '0' || id[i] > '9') return {0, id};
    k = k * 10 + (id[i] - '0');
  }
  return {k, id.substr(dot + 1)};
}

}  // namespace dhelix
