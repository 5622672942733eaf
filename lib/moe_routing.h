#pragma once
// Routing load imbalance of a MoE layer: how many tokens the busiest expert receives over
// the mean. Every EP rank waits for the slowest at the combine all-to-all, so the rank
// holding the busiest expert sets the pace of the grouped GEMMs and of the all-to-alls.
//
//   imbalance = min(requested or default, capacity_factor)   (capacity_factor 0: no cap)
//
// A capacity factor cf drops what an expert receives beyond cf times its mean share, so it
// caps the busiest expert's load. The default, 1.72, is the global-batch maximal violation
// of expert load (MaxVio_global = (max load − mean load) / mean load = 0.72) that Wang et
// al. measured for their 1B MoE trained with the usual auxiliary balancing loss (coefficient
// 0.001): "Auxiliary-Loss-Free Load Balancing Strategy for Mixture-of-Experts", arXiv
// 2408.15664 (2024), section 4.2, Table 2 (their 3B model: 0.52; with their loss-free
// balancing both fall to 0.04). Phi-3.5-MoE and Mixtral train with such a loss.
// A job sets its own figure in "parallel": {"moe_load_imbalance": x}, dhelix-plan and
// dhelix-profile with --moe-load-imbalance x.
//
// Worked example: default 1.72 with capacity factor 6 -> 1.72; with capacity factor 1.25 ->
// 1.25; 16 experts, top-2, 3072 tokens a rank, ep 8: mean 3072 tokens an expert, busiest
// ceil(1.72 · 3072) = 5284.

#include "lib/model_spec.h"
#include "lib/parallel_spec.h"

namespace dhelix {

/// The busiest expert's tokens over the mean when a job does not say.
inline constexpr double kDefaultMoeLoadImbalance = 1.72;

/// The imbalance the cost model uses for `model` under `parallel`: the job's figure or the
/// default, capped by the capacity factor when it is set; 1 for dense models.
double moe_load_imbalance(const ModelSpec& model, const ParallelSpec& parallel);

}  // namespace dhelix
