#pragma once
// What no plan of a configuration can beat, under DHelix and under Megatron-LM 1F1B: the
// configuration search (config_search.h) prunes with these without planning.
//
// Nothing in a plan runs faster than its ops alone: each stream (compute,
// local and cross-node communication) runs one op at a time, co-running only slows ops
// down, and a strand's ops follow their dependencies. So one layer's forward alone takes at
// least F = max(its busiest stream's solo work, its longest dependency chain at solo
// times), its backward at least B likewise, and a forward beside a backward (dhelix's SI
// pair) at least P = the busiest stream's work of both. A stage runs its layers for every
// one of the m = gbs / (dp · mbs) micro-batches, and the first micro-batch's forward must
// first pass the embedding E (forward and backward alone, each at least its busiest
// stream or its chain, as above) and the `before` layers of the stages ahead of it, as the
// last one's backward must pass them after it. The stage that embeds runs E for every
// micro-batch instead, and the stage with the head runs the head-loss step H (final norm,
// head, loss, forward and backward) for every micro-batch:
//
//   Megatron-LM 1F1B  max over stages of  ramp + m · layers · (F + B)
//                                         + m · (E on stage 0, H on the last)
//   dhelix (W or V)   max over stages of  ramp' + m · layers · P + m · (E and H on stage 0)
//   ramp   before · (F + B) + E, or 0 on the stage that embeds
//   ramp'  before · (F + I) + E, or 0 on the stage that embeds
//
// where I is a backward without its weight-gradient GEMMs: dhelix's W and V may split the
// last micro-batches' backwards (w_split_drain.h), so their gradient leaves a stage after I.
// with each layout's own layers per stage and `before` (the W's stage s comes after the
// s down chunks ahead of it). Exposed communication, bubbles beyond the ramp, DP and
// optimizer time only add. The recomputed forward ops count when every layer recomputes.
// With the candidate's profile, P is also at least the co-run load bound of both strands'
// work (planner/co_run_bound.h): co-running ops slow each other down, so hiding
// communication costs the computation part of its speed.
// The head matters: Llama-3-70B's head over 128k tokens of vocabulary costs about one
// layer, 10 % of an 8-stage pipeline's last stage. Worked example: F = 4 ms, B = 8 ms of
// which I = 5 ms, P = 10 ms, E = 1 ms, H = 12 ms, 80 layers on pp 4 (1F1B: 20 layers a
// stage; W: 10 + 10, stage 3 after 30 layers), m 16: Megatron's last stage 60 · 12 + 1 +
// 16 · 20 · 12 + 16 · 12 = 4.753 s; dhelix's stage 0 16 · 20 · 10 + 16 · (1 + 12) = 3.408 s,
// its stage 3 30 · 9 + 1 + 16 · 20 · 10 = 3.471 s, so 3.471 s.

#include <functional>

#include "lib/job_spec.h"
#include "lib/op_catalogue.h"
#include "lib/profile.h"

namespace dhelix {

/// An op's solo time exactly as the search's profiles hold it, in us.
using SoloTime = std::function<double(const ClusterSpec&, const Op&)>;

/// Lower bounds of a configuration's iteration time under each scheme, in us.
struct SchemeBounds {
  double dhelix_us = 0;
  double megatron_us = 0;
  double least_us() const { return dhelix_us < megatron_us ? dhelix_us : megatron_us; }
};

/// The bounds of `job` (validated: its stages split) from its ops' solo times (see the file
/// comment). With `profile` (the one the job will be planned with), dhelix's P also counts
/// the slow-downs of co-running ops: at least the co-run load bound (planner/co_run_bound.h)
/// of both strands' work under the profile's rates, which holds for any sequence of blocks
/// and so for the pairing search's chunk of layers. Errors: those of build_layer_dags (the
/// DAG builder may refuse the job) and from_layer_dag.
SchemeBounds lower_bounds(const JobSpec& job, const SoloTime& solo_time_us,
                          const Profile* profile = nullptr);

}  // namespace dhelix
