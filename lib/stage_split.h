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
//
// Megatron's other way to lighten the ends, --account-for-embedding-in-pipeline-split and
// --account-for-loss-in-pipeline-split (megatron/core/transformer/transformer_block.py,
// get_num_layers_to_build; checked in transformer_config.py): the embedding and the loss
// each count as one layer, the L + e + l "layers" split evenly, b = (L + e + l) / pp per
// stage (Megatron refuses when pp does not divide them), and the first (last) stage builds
// one transformer layer fewer. For the 1F1B and the W that is F = b - e and La = b - l
// (stage_ends); with a virtual pipeline of v model chunks only the first model chunk of
// stage 0 (the last of stage pp-1) is one layer short (interleaved_stage_layers). Megatron
// refuses the flags together with F or La. Llama-3.1-405B on pp 8 with both flags: b = 128
// / 8 = 16, F = La = 15; folded, stage 0 holds 7 + 7 layers and every other stage 8 + 8; with
// v = 8 every model chunk holds 2 layers but the first of stage 0 and the last of stage 7.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "lib/parallel_spec.h"

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

/// The first and last 1F1B stages' layer counts a job sets (0: not set, even stages).
struct StageEnds {
  int64_t first = 0;  ///< F
  int64_t last = 0;   ///< La
};

/// The ends `parallel` sets for `num_layers` layers: its first/last_stage_layers, or those
/// its account_for flags imply (F = b - e, La = b - l with b = (L + e + l) / pp; nothing with
/// pp = 1). Returns nothing and sets `why` when Megatron refuses the flags: account_for with
/// first/last_stage_layers, or pp not dividing L + e + l.
std::optional<StageEnds> stage_ends(int64_t num_layers, const ParallelSpec& parallel,
                                    std::string& why);

/// split_stages for the ends `parallel` sets (stage_ends, then split_stages).
std::optional<StageSplit> split_job_stages(int64_t num_layers, const ParallelSpec& parallel,
                                           std::string& why);

/// Whether some F, La (both unset included) split `num_layers` over `pp` stages.
bool any_stage_split(int64_t num_layers, int64_t pp);

/// Layers of each model chunk of each stage under Megatron's interleaved 1F1B with v model
/// chunks per stage (v >= 2), as Megatron builds them: even stages and F/La split every
/// stage's layers evenly over its v chunks (F, La and the middle count must divide by v);
/// the account_for flags split (L + e + l) / pp per stage evenly (it must divide by v) and
/// take one layer off the first chunk of stage 0 (the last chunk of stage pp-1). Returns
/// nothing and sets `why` (Megatron's rule, with the numbers) when Megatron refuses v.
std::optional<std::vector<std::vector<int64_t>>> interleaved_stage_layers(
    int64_t num_layers, const ParallelSpec& parallel, int64_t v, std::string& why);

}  // namespace dhelix
