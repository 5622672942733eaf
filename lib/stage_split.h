#pragma once
// How many transformer layers each pipeline stage holds when Megatron-LM's
// --decoder-first-pipeline-num-layers (F) and --decoder-last-pipeline-num-layers (La) make
// the stages uneven. The first stage also runs the embedding and the last the head and loss,
// which is why people give them fewer layers: Llama-3.1-405B (126 layers) was trained with
// pp = 16 and one layer fewer on the first and on the last stage ("The Llama 3 Herd of
// Models", section 3.3.2), i.e. F = La = 7 and 8 layers on every other stage.
//
// Unfolded (Megatron's 1F1B), as Megatron splits them: stage 0 holds F layers, stage pp-1
// holds La, and the middle stages share the rest equally, b = (L - F - La) / (pp - 2) each
// (a flag left unset counts its stage among the middle ones).
//
// Folded (DHelix's W). Stage 0 holds both ends of the model, so it takes both reductions:
// every other stage keeps b layers in two chunks of c = b/2, and stage 0's down chunk (the
// one with the embedding) holds F - c layers, its up chunk (before the head) La - c. With
// L = 126, pp = 16, F = La = 7: b = 8, c = 4, stage 0 holds 3 + 3 layers, stages 1-15 hold
// 4 + 4, 6 + 15·8 = 126. Stage 0 is lighter by b - (F + La - b) = (b - F) + (b - La) layers,
// exactly what the unfolded first and last stages give up together.
//
// Rules (each violation is a message naming the rule): pp >= 2; at least one middle stage
// (pp >= 3 when both flags are set); the middle stages divide the remaining layers evenly;
// b is even (the W's chunks are equal on the middle stages); F > c and La > c (stage 0's
// chunks are not empty).

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dhelix {

struct StageSplit {
  int64_t middle_stage_layers = 0;  ///< b
  std::vector<int64_t> unfolded;    ///< layers per 1F1B stage, size pp
  std::vector<int64_t> chunks;      ///< layers per W chunk along the U, size 2·pp
};

/// The split of `num_layers` layers over `pp` stages with F = `first` and La = `last`
/// layers (0: not set). Even stages (both 0) need num_layers % (2·pp) == 0. Returns
/// nothing and sets `why` (a sentence naming the rule and the numbers) when no split exists.
std::optional<StageSplit> split_stages(int64_t num_layers, int64_t pp, int64_t first, int64_t last,
                                       std::string& why);

}  // namespace dhelix
