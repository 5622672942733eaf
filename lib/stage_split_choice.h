#pragma once
// The uneven split the planner chooses itself when the layers do not fold evenly (2·pp does
// not divide them) and the job sets no split (no decoder_first/last_pipeline_num_layers, no
// account_for flag).
//
// Rule: among the splits lib/stage_split.h allows with F = La, take the one whose busiest
// stage has the least work per micro-batch, over both layouts the plan compares: the W
// (stage 0 holds F + La - b layers with the embedding, head and loss; every other stage b
// layers) and the unfolded 1F1B of the Megatron baselines (stage 0: F layers and the
// embedding; stage pp-1: La layers with the final norm, head and loss; the middle b). Ties
// go to the lighter busiest 1F1B stage, then to the smaller |F - La|, then to the smaller F.
// Only where no split has F = La (an odd layer count, or pp = 2, where one end stays unset)
// does the rule range over every split.
//
// Why F = La: then the W's stage 0 gets two equal chunks (F - b/2 each), and its SI blocks
// pair every layer. Unequal chunks (a user's split, or the fallback) also plan, check and
// run: an SI block pairs min(nf, nb) layers and runs the rest of the longer part alone
// (planner/pipeline_simulator.h, lib/plan/rank_program.h), so |F - La| layers of every such
// block go unpaired.
//
// Why stage work: in the steady state of every schedule here each stage runs every micro-
// batch's forward and backward once, so the busiest stage paces the iteration; the ramp
// and bubble depend on the schedule, not on the split. Why both layouts: one split serves
// the fold, the W and every baseline (the plan compares them on the same layers), and the
// two layouts share their middle stages, so a split that balances one balances the other
// (the W's stage 0 is no busier than b layers exactly when F·t + e + La·t + h <= 2·b·t,
// which is what the 1F1B ends need together). Work is a layer's, the embedding's and the
// head-loss step's forward plus backward (SplitTimes, from the profile's solo times).
//
// Hand-worked (tests/planner/stage_split_choice_test.cc): Llama-3.1-405B, L = 126, pp = 8,
// a layer t = 1, the embedding e = 0.1, head and loss h = 0.6. b = 14 leaves F + La = 42:
// the W's stage 0 holds 28 layers; b = 18 leaves F + La = 18 < 2·(b/2 + 1): no split. b = 16
// leaves F + La = 30, F = La = 15: the W's stage 0 holds 14 layers (work 14.7 <= 16), the
// 1F1B ends 15.1 and 15.6: busiest stage 16 layers. (Megatron's account_for flags give the
// same split here: (126 + 2) / 8 = 16, F = La = 15.)

#include <cstdint>
#include <optional>
#include <string>

#include "lib/stage_split.h"

namespace dhelix {

/// One micro-batch's forward plus backward time of each kind of stage work, us.
struct SplitTimes {
  double layer_us = 1;      ///< one transformer layer
  double embedding_us = 0;  ///< the token embedding (first stage)
  double head_loss_us = 0;  ///< final norm, output head and loss (last stage; W: stage 0)
};

struct ChosenSplit {
  StageEnds ends;             ///< F and La to plan with (0: that end counts as a middle stage)
  int64_t middle_layers = 0;  ///< b
  double busiest_us = 0;      ///< the busiest stage's work over both layouts
};

/// The split of the file comment for `num_layers` layers over `pp` stages. Returns nothing
/// and sets `why` when no split exists (any_stage_split is false).
std::optional<ChosenSplit> choose_stage_split(int64_t num_layers, int64_t pp,
                                              const SplitTimes& times, std::string& why);

/// Whether the planner chooses the split of `parallel` for `num_layers` layers: pp >= 2,
/// 2·pp does not divide the layers, and the job sets no end and no account_for flag.
bool planner_chooses_split(int64_t num_layers, const ParallelSpec& parallel);

}  // namespace dhelix
