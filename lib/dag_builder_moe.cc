// The MoE MLP of a layer (Megatron-Core's all-to-all token dispatcher), between ln_mlp and
// bda_mlp. With tp > 1 the MoE layer needs sequence parallelism and works on the rank's
// N = T/tp tokens (expert tensor parallelism 1): no TP communication inside the MLP.
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

#include <algorithm>
#include <cmath>

#include "lib/dag_builder_internal.h"
#include "lib/error.h"
#include "lib/int_math.h"

namespace dhelix::dag_detail {
namespace {

struct MoeShapes {
  int64_t tokens = 0;         ///< N: tokens entering the MoE layer on this rank
  int64_t sent = 0;           ///< P: token copies this rank dispatches
  int64_t local_experts = 0;  ///< E / ep
  int64_t per_expert = 0;     ///< m: tokens one local expert computes on
  int64_t experts = 0;        ///< E
  int64_t ffn = 0;            ///< one expert's FFN size
};

MoeShapes moe_shapes(const BuildContext& ctx) {
  const MoeSpec& moe = *ctx.model->moe;
  DHELIX_CHECK(moe.num_experts % ctx.ep == 0);
  MoeShapes s;
  s.tokens = ctx.rows;
  s.experts = moe.num_experts;
  s.local_experts = moe.num_experts / ctx.ep;
  s.ffn = moe.expert_ffn_hidden_size;
  s.sent = s.tokens * moe.top_k;
  s.per_expert = ceil_div(s.tokens * moe.top_k * ctx.ep, moe.num_experts);
  if (moe.capacity_factor > 0) {
    const auto cap = static_cast<int64_t>(
        std::ceil(moe.capacity_factor * static_cast<double>(s.tokens * moe.top_k) /
                  static_cast<double>(moe.num_experts)));
    s.sent = std::min(s.sent, moe.num_experts * cap);
    s.per_expert = std::min(s.per_expert, ctx.ep * cap);
  }
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
                   OpKind::kAllToAll, pass, ParallelDim::kEp, ctx.bytes(s.sent * ctx.hidden),
                   ctx.dtype);
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
  const int64_t dispatched = maybe_all_to_all(ctx, dag, s, "dispatch_a2a", f, permute);
  const int64_t fc1 =
      add_after(dag,
                make_gemm(ctx, "fwd.grouped_fc1", OpKind::kGroupedGemm, f, GemmRole::kForward,
                          s.local_experts, s.per_expert, fc1_width, ctx.hidden),
                {dispatched});
  const int64_t act = add_after(
      dag,
      make_activation(ctx, "fwd." + activation_id(ctx), f, s.local_experts * s.per_expert, s.ffn),
      {fc1});
  const int64_t fc2 =
      add_after(dag,
                make_gemm(ctx, "fwd.grouped_fc2", OpKind::kGroupedGemm, f, GemmRole::kForward,
                          s.local_experts, s.per_expert, ctx.hidden, s.ffn),
                {act});
  const int64_t combined = maybe_all_to_all(ctx, dag, s, "combine_a2a", f, fc2);
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
  const int64_t grad = maybe_all_to_all(ctx, dag, s, "combine_a2a", b, unpermute);
  const int64_t fc2_dgrad =
      add_after(dag,
                make_gemm(ctx, "bwd.grouped_fc2_dgrad", OpKind::kGroupedGemm, b, GemmRole::kDgrad,
                          s.local_experts, s.per_expert, s.ffn, ctx.hidden),
                {grad});
  add_after(dag,
            make_wgrad(ctx, "bwd.grouped_fc2_wgrad", OpKind::kGroupedGemm, s.local_experts,
                       s.per_expert, ctx.hidden, s.ffn),
            {grad});
  const int64_t act = add_after(
      dag,
      make_activation(ctx, "bwd." + activation_id(ctx), b, s.local_experts * s.per_expert, s.ffn),
      {fc2_dgrad});
  const int64_t fc1_dgrad =
      add_after(dag,
                make_gemm(ctx, "bwd.grouped_fc1_dgrad", OpKind::kGroupedGemm, b, GemmRole::kDgrad,
                          s.local_experts, s.per_expert, ctx.hidden, fc1_width),
                {act});
  add_after(dag,
            make_wgrad(ctx, "bwd.grouped_fc1_wgrad", OpKind::kGroupedGemm, s.local_experts,
                       s.per_expert, fc1_width, ctx.hidden),
            {act});
  const int64_t returned = maybe_all_to_all(ctx, dag, s, "dispatch_a2a", b, fc1_dgrad);
  const int64_t permute = add_after(dag, make_permutation(ctx, s, OpKind::kPermute, b), {returned});
  const int64_t router = add_after(dag, make_router(ctx, s, b), {unpermute});
  add_after(dag,
            make_wgrad(ctx, "bwd.router_wgrad", OpKind::kGemm, 1, s.tokens, s.experts, ctx.hidden),
            {router});
  if (shared) return {permute, router, shared_grad};
  return {permute, router};
}

}  // namespace dhelix::dag_detail
