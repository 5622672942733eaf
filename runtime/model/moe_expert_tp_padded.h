#pragma once
// Expert tensor parallelism of the device MoE layer (PaddedMoeLayers, included at the end of
// moe_layers_padded.h): the plan's etp_allgather and etp_reduce_scatter over the TP group
// (etp = tp > 1), the CPU's data flow (moe_expert_tp_cpu.cc) on padded blocks. Every TP
// member holds 1/etp of each local expert's FFN columns, so each must see the own rows of
// every member: R = L ep C rows, expert-major ([L][ep C]: the dispatch's regrouped arrival,
// or permute's buffer with ep = 1).
//
// With padding every member's own block has the same size, so the exchanges are the
// fixed-size collectives, no counts travel (the CPU's all_to_all_v of copies carries the
// routed counts, which a padded block does not need), and the padding rows stay zero
// through the experts:
//
//   etp_allgather        all_gather of the own rows -> [etp][L][ep C] member-major, then
//                        moe_regroup (etp, L, ep C) -> [L][etp][ep C] for the grouped GEMMs
//                        (each local expert's etp ep C rows contiguous);
//   etp_reduce_scatter   grouped_fc2 leaves the partial outputs regrouped member-major;
//                        reduce_scatter sums each member's block over TP into its own rows
//                        (expert-major), then moe_regroup (ep, L, C) -> EP source-major for
//                        the combine (ep > 1) or read as is by unpermute (ep = 1).
//
// Worked example, etp = 2, ep = 1, L = E = 2, C = 1 (R = 2): member m's own rows are
// (e0: x_m0), (e1: x_m1); after the gather, member-major x_00 x_01 x_10 x_11, regrouped
// expert-major x_00 x_10 | x_01 x_11: expert 0 computes on rows 0-1, expert 1 on 2-3.
// The backward moves the output gradient (gather) and the partial input gradients
// (reduce-scatter) the same way. NCCL sums the reduce-scatter in its own order: the same
// order in every run of one configuration, so --verify stays bitwise (as for the dense
// layers' reduce-scatters); against the CPU's rank-order sum it differs by rounding.

#include <string>

#include "runtime/model/moe_layers_padded.h"

namespace dhelix::rt {

template <class B>
std::optional<typename PaddedMoeLayers<B>::BoundOp> PaddedMoeLayers<B>::bind_expert_tp(
    const std::string& op, State& s) {
  using Exec = typename B::Exec;
  if (etp_ == 1) {
    throw Error(
        ErrorCode::kInvalidInput,
        fmt::format("StageModel: op {} does not occur with expert tensor parallelism 1", op));
  }
  const int64_t h = shape_.hidden, etp = etp_, ep = ep_, local = local_, c = shape_.capacity;
  const int64_t own = kernels::padded_rows(shape_.experts, c) * h;  // one member's block
  auto gather = [own](const A* in, A* out) {
    return model_detail::communication<B>(
        model_detail::collective(CollectiveKind::kAllGather, in, out, own));
  };
  auto reduce_scatter = [own](const A* in, A* out) {
    return model_detail::communication<B>(
        model_detail::collective(CollectiveKind::kReduceScatter, in, out, own));
  };
  // Member-major [etp][L][ep C] -> expert-major [L][etp][ep C].
  auto to_experts = [etp, local, ep, c, h](const A* from, A* to, const Exec& e) {
    B::moe_regroup(e, etp, local, ep * c, h, from, to, true);
  };
  // The summed own rows (expert-major) -> EP source-major for the all-to-all that follows.
  auto to_sources = [ep, local, c, h](const A* from, A* to, const Exec& e) {
    if (ep > 1) B::moe_regroup(e, ep, local, c, h, from, to, false);
  };

  if (op == "fwd.etp_allgather") {
    BoundOp bound = gather(s.own_in, s.tp_recv);
    bound.after_collective = [&s, to_experts](const Exec& e) {
      to_experts(s.tp_recv, s.gathered, e);
    };
    return bound;
  }
  if (op == "fwd.etp_reduce_scatter") {  // grouped_fc2 left tp_send member-major
    BoundOp bound = reduce_scatter(s.tp_send, s.expert_own);
    bound.after_collective = [&s, to_sources](const Exec& e) {
      to_sources(s.expert_own, s.expert_out_src, e);
    };
    return bound;
  }
  if (op == "bwd.etp_allgather") {
    BoundOp bound = gather(s.own_grad, s.d_tp_recv);
    bound.after_collective = [&s, to_experts](const Exec& e) {
      to_experts(s.d_tp_recv, s.d_gathered, e);
    };
    return bound;
  }
  if (op == "bwd.etp_reduce_scatter") {  // grouped_fc1_dgrad left d_tp_send member-major
    BoundOp bound = reduce_scatter(s.d_tp_send, s.d_expert_own);
    bound.after_collective = [&s, to_sources](const Exec& e) {
      to_sources(s.d_expert_own, s.d_expert_in_src, e);
    };
    return bound;
  }
  return std::nullopt;
}

}  // namespace dhelix::rt
