// The MoE MLP of a layer (Megatron-Core's all-to-all token dispatcher), between ln_mlp and
// bda_mlp. With tp > 1 the MoE layer needs sequence parallelism and works on the rank's
// N = T/tp tokens. Expert tensor parallelism (--expert-tensor-parallel-size, etp = tp by
// default as in Megatron-Core, or 1) splits each expert's FFN columns over the TP group:
// after the dispatch all-to-all the TP ranks all-gather their received tokens (etp times
// the rows, each expert 1/etp of the FFN width), and reduce-scatter the expert outputs
// before the combine (etp_allgather / etp_reduce_scatter below; in backward the reverse).
// With etp = 1 every TP rank keeps whole experts and the MLP has no TP communication.
//
//   forward:  ln_mlp ─> router ─> permute ─> dispatch_a2a ─> grouped_fc1 ─> act
//                 └──────────────────┘        ─> grouped_fc2 ─> combine_a2a ─> unpermute
//   backward: unpermute ─> combine_a2a ─> grouped_fc2_dgrad ─> act ─> grouped_fc1_dgrad
//                 │                 └─> grouped_fc2_wgrad     └─> grouped_fc1_wgrad
//                 │          ─> dispatch_a2a ─> permute ─┐
//                 └─> router ─────────────────────────────┴─> ln_mlp;  router ─> router_wgrad
//
// The router's probabilities travel with the permuted tokens (the dispatcher keeps them for
// unpermute), so in forward the router only feeds permute. In backward the router's
// gradient needs only unpermute's d(probabilities): it may run anywhere beside the expert
// chain (the paper's movable router), and its weight gradient is a movable sink.
//
// Token counts, with E experts, top-k routing, ep ranks per EP group, E/ep local experts,
// assuming balanced routing (each expert receives its share N·k/E from every rank):
//   a rank sends P = N·k token copies (its all-to-all send buffer is P·h·dt bytes) and each
//   expert computes on m = ceil(N·k·ep / E) tokens from its EP group.
//   A capacity factor cf > 0 only limits: an expert accepts cap = ceil(cf·N·k/E) tokens
//   per source rank and drops the rest, without padding (Megatron-Core's default; padding
//   to capacity is the opt-in --moe-pad-expert-input-to-capacity, which dhelix does not
//   model). So with cf >= 1 balanced routing drops nothing and cf only matters below 1:
//   P = E·min(cap, N·k/E), m = ep·min(cap, ceil(N·k/E)).
// Grouped GEMMs have batch = E/ep and m tokens per expert.
//
// Routing is not balanced: the busiest expert receives f times its mean share (f = the
// load imbalance of lib/moe_routing.h, capped by cf), and every EP rank waits for the rank
// that holds it. So each local expert computes on m = ep·min(cap, ceil(f·N·k/E)) tokens (the
// busiest rank's load; conservative when E/ep > 1, as its other experts may be lighter), and
// the all-to-alls move f·P token rows (what the busiest rank receives and sends back). The
// permutations work on the rank's own P copies and stay unscaled.

#include <algorithm>
#include <cmath>

#include "lib/dag_builder_internal.h"
#include "lib/error.h"
#include "lib/int_math.h"
#include "lib/moe_routing.h"

namespace dhelix::dag_detail {
namespace {

struct MoeShapes {
  int64_t tokens = 0;         ///< N: tokens entering the MoE layer on this rank
  int64_t sent = 0;           ///< P: token copies this rank dispatches
  int64_t exchanged = 0;      ///< f·P: token rows the busiest rank's all-to-all moves
  int64_t local_experts = 0;  ///< E / ep
  int64_t per_expert = 0;     ///< m: tokens one local expert computes on
  int64_t experts = 0;        ///< E
  int64_t ffn = 0;            ///< one expert's FFN columns on this rank: F_e / etp
  int64_t etp = 1;            ///< expert tensor-parallel size (1 or tp)
  int64_t rows = 0;           ///< rows a local expert computes on: m · etp
};

MoeShapes moe_shapes(const BuildContext& ctx) {
  const MoeSpec& moe = *ctx.model->moe;
  DHELIX_CHECK(moe.num_experts % ctx.ep == 0);
  MoeShapes s;
  s.tokens = ctx.rows;
  s.experts = moe.num_experts;
  s.local_experts = moe.num_experts / ctx.ep;
  s.etp = ctx.parallel->expert_tp_size();
  DHELIX_CHECK(s.etp == 1 || s.etp == ctx.tp);
  s.ffn = moe.expert_ffn_hidden_size / s.etp;
  const double imbalance = moe_load_imbalance(*ctx.model, *ctx.parallel);
  const double mean_share =
      static_cast<double>(s.tokens * moe.top_k) / static_cast<double>(moe.num_experts);
  s.sent = s.tokens * moe.top_k;
  int64_t busiest_share = static_cast<int64_t>(std::ceil(imbalance * mean_share - 1e-9));
  if (moe.capacity_factor > 0) {
    const auto cap = static_cast<int64_t>(std::ceil(moe.capacity_factor * mean_share - 1e-9));
    s.sent = std::min(s.sent, moe.num_experts * cap);
    busiest_share = std::min(busiest_share, cap);
  }
  s.per_expert = ctx.ep * busiest_share;
  s.exchanged = static_cast<int64_t>(std::ceil(imbalance * static_cast<double>(s.sent) - 1e-9));
  s.rows = s.per_expert * s.etp;
  return s;
}

// Router: the N×h · h×E logits GEMM plus softmax and top-k over N×E.
Op make_router(const BuildContext& ctx, const MoeShapes& s, Pass pass) {
  const std::string id = pass == Pass::kForward ? "fwd.router" : "bwd.router";
  const GemmRole role = pass == Pass::kForward ? GemmRole::kForward : GemmRole::kDgrad;
  Op op = pass == Pass::kForward
              ? make_gemm(ctx, id, OpKind::kRouter, pass, role, 1, s.tokens, s.experts, ctx.hidden)
              : make_gemm(ctx, id, OpKind::kRouter, pass, role, 1, s.tokens, ctx.hidden, s.experts);
  op.gemm_role = GemmRole::kNone;  // a fused op, not a plain GEMM
  op.flops += kFlopsPerSoftmaxElement * static_cast<double>(s.tokens * s.experts);
  return op;
}

// Permute gathers P token rows into expert order; its backward sums the copies back into N
// rows. Unpermute weights the P expert outputs by their probabilities and sums them into N
// rows; its backward scatters the gradient and forms d(probabilities).
Op make_permutation(const BuildContext& ctx, const MoeShapes& s, OpKind kind, Pass pass) {
  const bool forward = pass == Pass::kForward;
  const std::string id =
      std::string(forward ? "fwd." : "bwd.") + (kind == OpKind::kPermute ? "permute" : "unpermute");
  const double per_element = kind == OpKind::kPermute ? (forward ? 0 : 1) : kFlopsPerCombineElement;
  Op op = make_memory_op(ctx, id, kind, pass, s.sent, ctx.hidden, per_element, 1, 1);
  const int64_t rows_bytes = ctx.bytes(s.tokens * ctx.hidden);
  const int64_t copies_bytes = ctx.bytes(s.sent * ctx.hidden);
  const bool narrows = (kind == OpKind::kPermute) != forward;  // P rows in, N rows out
  op.bytes_read = narrows ? copies_bytes : rows_bytes;
  op.bytes_written = narrows ? rows_bytes : copies_bytes;
  if (kind == OpKind::kUnpermute && !forward) op.bytes_read += copies_bytes;  // for d(probs)
  return op;
}

Op make_all_to_all(const BuildContext& ctx, const MoeShapes& s, const char* id, Pass pass) {
  return make_comm(ctx, std::string(pass == Pass::kForward ? "fwd." : "bwd.") + id,
                   OpKind::kAllToAll, pass, ParallelDim::kEp, ctx.bytes(s.exchanged * ctx.hidden),
                   ctx.dtype);
}

// With expert tensor parallelism, the TP group's all-gather of the tokens the experts
// compute on (or the reduce-scatter of their outputs): the full gathered buffer is etp times
// the rows this rank received.
int64_t maybe_expert_tp_comm(const BuildContext& ctx, LayerDag& dag, const MoeShapes& s,
                             OpKind kind, Pass pass, int64_t after) {
  if (s.etp == 1) return after;
  const std::string id = std::string(pass == Pass::kForward ? "fwd." : "bwd.") +
                         (kind == OpKind::kAllGather ? "etp_allgather" : "etp_reduce_scatter");
  return add_after(dag,
                   make_comm(ctx, id, kind, pass, ParallelDim::kTp,
                             ctx.bytes(s.etp * s.exchanged * ctx.hidden), ctx.dtype),
                   {after});
}

// Adds an all-to-all after `after` when the EP group has more than one rank.
int64_t maybe_all_to_all(const BuildContext& ctx, LayerDag& dag, const MoeShapes& s, const char* id,
                         Pass pass, int64_t after) {
  if (ctx.ep == 1) return after;
  return add_after(dag, make_all_to_all(ctx, s, id, pass), {after});
}

}  // namespace

int64_t add_moe_forward(const BuildContext& ctx, LayerDag& dag, int64_t ln_mlp) {
  const Pass f = Pass::kForward;
  const MoeShapes s = moe_shapes(ctx);
  const int64_t fc1_width = ctx.fc1_width(s.ffn);
  const int64_t router = add_after(dag, make_router(ctx, s, f), {ln_mlp});
  const int64_t permute =
      add_after(dag, make_permutation(ctx, s, OpKind::kPermute, f), {ln_mlp, router});
  const int64_t dispatched =
      maybe_expert_tp_comm(ctx, dag, s, OpKind::kAllGather, f,
                           maybe_all_to_all(ctx, dag, s, "dispatch_a2a", f, permute));
  const int64_t fc1 =
      add_after(dag,
                make_gemm(ctx, "fwd.grouped_fc1", OpKind::kGroupedGemm, f, GemmRole::kForward,
                          s.local_experts, s.rows, fc1_width, ctx.hidden),
                {dispatched});
  const int64_t act = add_after(
      dag, make_activation(ctx, "fwd." + activation_id(ctx), f, s.local_experts * s.rows, s.ffn),
      {fc1});
  const int64_t fc2 =
      add_after(dag,
                make_gemm(ctx, "fwd.grouped_fc2", OpKind::kGroupedGemm, f, GemmRole::kForward,
                          s.local_experts, s.rows, ctx.hidden, s.ffn),
                {act});
  const int64_t combined =
      maybe_all_to_all(ctx, dag, s, "combine_a2a", f,
                       maybe_expert_tp_comm(ctx, dag, s, OpKind::kReduceScatter, f, fc2));
  const int64_t unpermute =
      add_after(dag, make_permutation(ctx, s, OpKind::kUnpermute, f), {combined});
  if (!ctx.model->moe->has_shared_expert()) return unpermute;
  return add_shared_expert_forward(ctx, dag, {ln_mlp, unpermute});
}

std::vector<int64_t> add_moe_backward(const BuildContext& ctx, LayerDag& dag, int64_t bda_mlp) {
  const Pass b = Pass::kBackward;
  const MoeShapes s = moe_shapes(ctx);
  const int64_t fc1_width = ctx.fc1_width(s.ffn);
  const bool shared = ctx.model->moe->has_shared_expert();
  const int64_t shared_grad = shared ? add_shared_expert_backward(ctx, dag, bda_mlp) : bda_mlp;
  const int64_t unpermute =
      add_after(dag, make_permutation(ctx, s, OpKind::kUnpermute, b), {bda_mlp, shared_grad});
  const int64_t grad =
      maybe_expert_tp_comm(ctx, dag, s, OpKind::kAllGather, b,
                           maybe_all_to_all(ctx, dag, s, "combine_a2a", b, unpermute));
  const int64_t fc2_dgrad =
      add_after(dag,
                make_gemm(ctx, "bwd.grouped_fc2_dgrad", OpKind::kGroupedGemm, b, GemmRole::kDgrad,
                          s.local_experts, s.rows, s.ffn, ctx.hidden),
                {grad});
  add_after(dag,
            make_wgrad(ctx, "bwd.grouped_fc2_wgrad", OpKind::kGroupedGemm, s.local_experts, s.rows,
                       ctx.hidden, s.ffn),
            {grad});
  const int64_t act = add_after(
      dag, make_activation(ctx, "bwd." + activation_id(ctx), b, s.local_experts * s.rows, s.ffn),
      {fc2_dgrad});
  const int64_t fc1_dgrad =
      add_after(dag,
                make_gemm(ctx, "bwd.grouped_fc1_dgrad", OpKind::kGroupedGemm, b, GemmRole::kDgrad,
                          s.local_experts, s.rows, ctx.hidden, fc1_width),
                {act});
  add_after(dag,
            make_wgrad(ctx, "bwd.grouped_fc1_wgrad", OpKind::kGroupedGemm, s.local_experts, s.rows,
                       fc1_width, ctx.hidden),
            {act});
  const int64_t returned =
      maybe_all_to_all(ctx, dag, s, "dispatch_a2a", b,
                       maybe_expert_tp_comm(ctx, dag, s, OpKind::kReduceScatter, b, fc1_dgrad));
  const int64_t permute = add_after(dag, make_permutation(ctx, s, OpKind::kPermute, b), {returned});
  const int64_t router = add_after(dag, make_router(ctx, s, b), {unpermute});
  add_after(dag,
            make_wgrad(ctx, "bwd.router_wgrad", OpKind::kGemm, 1, s.tokens, s.experts, ctx.hidden),
            {router});
  if (shared) return {permute, router, shared_grad};
  return {permute, router};
}

}  // namespace dhelix::dag_detail
