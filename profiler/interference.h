#pragma once
// Co-running two operators that start together on different streams of one GPU
// (docs/cost-model.md, "Interference"). Each op progresses at a slowed rate while both run
// and at full speed once the other has finished, so finish times are piecewise:
//
//   a and b run at rates r_a, r_b (1 = solo speed). If a finishes first, at t_a = T_a / r_a,
//   b has done r_b · t_a of its T_b and finishes at t_a + (T_b - r_b · t_a).
//
// The rates come from the resources the two ops share:
// - compute x communication: the compute kernel loses the SMs NCCL occupies
//   (cluster.nccl_sms_intra_node or nccl_sms_inter_node; a GEMM of exactly sm_count tiles then
//   pays a second wave); both compete for memory bandwidth (NCCL moves
//   nccl_memory_traffic_factor bytes through memory per byte on the link), shared max-min
//   (collective_memory_shares): the collective's demand is held to its link's pace, so when
//   it asks for at most half it gets all of it and a memory-bound kernel beside it gets the
//   rest (A100 reports: elementwise kernels 2.5x slower beside an all-gather; proportional
//   sharing would give them 1.33x, this 1.5x).
// - compute x compute: SMs are split in proportion to what each kernel can fill, memory
//   bandwidth likewise, and the pair pays a contention penalty (kComputeContention): the
//   GPU time-slices them, so OEF is near 0 or below.
// - communication x communication on the same link class: the link is shared (OEF near 0).
// - a node-local and a cross-node collective use different links and compete only for memory
//   bandwidth and, on PCIe nodes, for the GPU's PCIe link that the NIC traffic also crosses.

#include "lib/cluster_spec.h"
#include "lib/op_catalogue.h"

namespace dhelix {

/// Extra slowdown of two compute kernels sharing SMs beyond their fair share (cache and
/// scheduler contention), an assumption chosen to match the DHelix paper's Figure 4, where
/// GEMM x GEMM and GEMM x FA overlap slightly worse than running one after the other.
inline constexpr double kComputeContention = 0.05;
/// The same for pairs involving backward attention, which the paper finds "particularly
/// unforgiving" when overlapped with a GEMM.
inline constexpr double kAttentionBackwardContention = 0.15;

/// Progress rates of two ops while both run (1 = solo speed), in (0, 1].
struct CoRunRates {
  double rate_a = 1;
  double rate_b = 1;
};

/// Finish times of two ops started together at time 0.
struct CoRun {
  double finish_a_us = 0;
  double finish_b_us = 0;
  double makespan_us = 0;  ///< max(finish_a_us, finish_b_us)
  double oef = 0;          ///< (T_a + T_b - makespan) / min(T_a, T_b)
  CoRunRates rates;
};

/// Shares of the usable memory bandwidth a compute kernel and a collective get while they
/// run together, each in [0, 1] of the bandwidth.
struct MemoryShares {
  double compute = 0;
  double collective = 0;
};

/// Max-min fair split of the memory bandwidth between a compute kernel and a collective
/// demanding `compute_demand` and `collective_demand` of it (each >= 0): both served in full
/// when they fit (sum <= 1); otherwise a demand at or below half gets all of it and the other
/// the rest, and two demands above half get half each.
MemoryShares collective_memory_shares(double compute_demand, double collective_demand);

/// Solo time of any op (computation or communication), microseconds.
double op_time_us(const ClusterSpec& cluster, const Op& op);

/// Rates of `a` and `b` while they run together on different streams.
CoRunRates co_run_rates(const ClusterSpec& cluster, const Op& a, const Op& b);

/// The piecewise co-run of two ops of solo times `time_a_us` and `time_b_us` with `rates`.
CoRun co_run_from_rates(double time_a_us, double time_b_us, CoRunRates rates);

/// co_run_from_rates(op_time_us(a), op_time_us(b), co_run_rates(a, b)).
CoRun co_run(const ClusterSpec& cluster, const Op& a, const Op& b);

}  // namespace dhelix
