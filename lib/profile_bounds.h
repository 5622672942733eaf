#pragma once
// Physical lower bounds on op times, and the check that a profile keeps to them.
//
// No kernel runs faster than the GPU's dense tensor-core peak allows for the work it must do,
// and no transfer moves bytes faster than the links of its GPU carry them. A profile whose
// times break either bound was not measured (or modelled) on the hardware its cluster
// describes: 1e-300 us per op, or all zeros, once gave a plan of 555 % MFU, exit 0.
//
// The bounds are the hardware figures themselves, with no margin: the peak and the link
// bandwidth are the most the hardware can do, so a real measurement is at or above them. Only
// the file format's rounding (4 decimals, 0.5e-4 us at most) is allowed for.
//
// Work counted:
// - matrix work (GEMMs, grouped GEMMs, the head, the router, attention): Op::flops at
//   cluster.gpu.peak_bf16_tflops (also the fp16 peak, and above the fp32 one), except causal
//   attention, whose kernels skip the masked half: there the work of the (query, key) pairs a
//   causal kernel must compute (see minimum_work_flops). Other computation (elementwise ops,
//   norms, the loss) has no FLOP bound: its kernels are memory-bound, fusable or skippable,
//   so its FLOP count says nothing about its least time; it may only not take less than
//   the 1 ns resolution of any timer (zero included).
// - communication: the bytes that must reach one rank over its links whatever the algorithm
//   (see minimum_link_bytes), at the hardware bandwidth of every link the GPU could use at
//   once (intra_node.bandwidth_gbps, plus nics_per_node x inter_node.bandwidth_gbps when the
//   group leaves the node).
// Worked example (H100, 989 TFLOP/s): a GEMM of m = 8192, n = 1280, k = 8192 does
// 2·8192·1280·8192 = 1.718e11 FLOPs, so it takes at least 1.718e11 / 989e6 = 173.7 us.

#include <string>
#include <vector>

#include "lib/cluster_spec.h"
#include "lib/op_catalogue.h"
#include "lib/profile.h"

namespace dhelix {

/// FLOPs the op's kernel cannot avoid: Op::flops, but for causal attention the work of the
/// pairs under the mask only (q·kv/2, or q·w - w²/2 within a sliding window w).
double minimum_work_flops(const Op& op);

/// Bytes that must reach one rank of a collective of `op.comm_bytes` over `group_size` ranks
/// S, n: all-gather and all-to-all (n-1)/n·S (the others' parts); all-reduce (n-1)/n·S (the
/// others' contributions, even reduced in the switch); reduce-scatter S/n (the rank's reduced
/// shard, the least an in-switch reduction needs); send/recv S. 0 for a group of one.
double minimum_link_bytes(const Op& op);

/// The least time the op can take on `cluster`, microseconds (0 for an op with no work).
double minimum_op_time_us(const ClusterSpec& cluster, const Op& op);

/// Why the least time holds, for messages: "its 1.72e+11 FLOPs need at least 173.7 us at the
/// GPU's peak of 989 TFLOP/s (cluster gpu.peak_bf16_tflops)".
std::string minimum_op_time_reason(const ClusterSpec& cluster, const Op& op);

/// Throws Error(kInvalidInput) when a time of `profile` is faster than the hardware of
/// `cluster` allows for an op of `ops` with its signature: the median of the op's solo time
/// (what the planner prices it at; a single fastest sample may undercut the bound by a
/// timer's resolution) and its finish time in every pair (medians too). A zero time of an op with
/// work (FLOPs, bytes of device memory or bytes over a link: an embedding lookup has no FLOPs but
/// moves memory) is refused as such. The message names `profile_file`, each time's JSON pointer,
/// its value, the op and the bound (at most 8 problems listed, then how many more).
void check_profile_bounds(const Profile& profile, const std::vector<Op>& ops,
                          const ClusterSpec& cluster, const std::string& profile_file);

}  // namespace dhelix
