#pragma once
// The op names of a MoE layer's MLP in the planner's DAG (lib/dag_builder_moe.cc), as the
// backends' MoE layers bind them: the routed experts' ops, expert tensor parallelism's
// exchanges (moe_expert_tp_cpu.cc, moe_expert_tp_padded.h), and the shared expert's
// (moe_shared_expert_cpu.cc, moe_shared_expert_padded.h).

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>

#include "lib/error.h"

namespace dhelix::rt {

/// The routed experts' ops, forward then backward.
inline constexpr std::array<const char*, 19> kRoutedMoeOps = {"fwd.router",
                                                              "fwd.permute",
                                                              "fwd.dispatch_a2a",
                                                              "fwd.grouped_fc1",
                                                              "fwd.swiglu",
                                                              "fwd.grouped_fc2",
                                                              "fwd.combine_a2a",
                                                              "fwd.unpermute",
                                                              "bwd.unpermute",
                                                              "bwd.combine_a2a",
                                                              "bwd.grouped_fc2_dgrad",
                                                              "bwd.grouped_fc2_wgrad",
                                                              "bwd.swiglu",
                                                              "bwd.grouped_fc1_dgrad",
                                                              "bwd.grouped_fc1_wgrad",
                                                              "bwd.dispatch_a2a",
                                                              "bwd.permute",
                                                              "bwd.router",
                                                              "bwd.router_wgrad"};

/// Expert tensor parallelism's exchanges of the experts' rows.
inline constexpr std::array<const char*, 4> kExpertTpOps = {
    "fwd.etp_allgather", "bwd.etp_allgather", "fwd.etp_reduce_scatter", "bwd.etp_reduce_scatter"};

/// The shared expert's ops (lib/dag_builder_shared_expert.cc), forward then backward; the
/// TP exchanges (allgather_ / reduce_scatter_shared) occur with tp > 1 only.
inline constexpr std::array<const char*, 12> kSharedOps = {
    "fwd.allgather_shared",      "fwd.shared_fc1",
    "fwd.shared_swiglu",         "fwd.shared_fc2",
    "fwd.reduce_scatter_shared", "bwd.allgather_shared",
    "bwd.shared_fc2_dgrad",      "bwd.shared_fc2_wgrad",
    "bwd.shared_swiglu",         "bwd.shared_fc1_dgrad",
    "bwd.shared_fc1_wgrad",      "bwd.reduce_scatter_shared",
};

/// Throws Error(kInvalidInput) for a shared-expert op that exchanges rows over TP (the
/// all-gathers and reduce-scatters) when `tp` is 1: the planner writes none then.
inline void check_shared_expert_op(const std::string& op, int64_t tp) {
  const bool exchange =
      op.find("allgather_") != std::string::npos || op.find("reduce_scatter_") != std::string::npos;
  if (exchange && tp == 1) {
    throw Error(ErrorCode::kInvalidInput,
                fmt::format("StageModel: op {} does not occur with tp = 1", op));
  }
}

/// True when `op` is one of `names`.
template <size_t N>
bool names_op(const std::array<const char*, N>& names, const std::string& op) {
  return std::find(names.begin(), names.end(), op) != names.end();
}

}  // namespace dhelix::rt
