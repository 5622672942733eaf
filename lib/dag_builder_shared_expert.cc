// The shared expert of a Qwen2-MoE layer: a dense MLP every token passes beside the routed
// experts, its output scaled by a sigmoid gate and added to theirs. Megatron-Core runs it
// after the routed experts (without --moe-shared-expert-overlap), and autograd runs its
// backward first, so it is chained behind them here rather than put beside them as a
// parallel branch (which also keeps the exact pairing search small: a parallel branch of
// 5-7 ops per strand made it about 30 times slower). Megatron-Core's SharedExpertMLP is
// tensor-parallel like a dense MLP, so it is built as one: with SP, an
// all-gather of the rank's T/tp rows, a column-parallel fc1 (f_s/tp columns, gate and up
// fused for SwiGLU), the activation, a row-parallel fc2 and a reduce-scatter back to T/tp
// rows (all-reduce without SP). The gate (an h -> 1 projection and a sigmoid per token) is
// left out: a T x h x 1 GEMM next to the MLP's T x h x f_s ones. f_s/tp is rounded up when
// tp does not divide it.
//
//   forward:  ln_mlp, unpermute ─> allgather_shared ─> shared_fc1 ─> act ─> shared_fc2 ─>
//             reduce_scatter_shared (the layer's MLP output; it adds unpermute's) ─> bda_mlp
//   backward: bda_mlp ─> allgather_shared ─> shared_fc2_dgrad ─> act ─> shared_fc1_dgrad ─>
//             reduce_scatter_shared ─> unpermute (the routed experts' backward) and ln_mlp;
//             wgrads of fc2 and fc1 are movable sinks

#include <vector>

#include "lib/dag_builder_internal.h"
#include "lib/int_math.h"

namespace dhelix::dag_detail {
namespace {

std::string pass_prefix(Pass pass) { return pass == Pass::kForward ? "fwd." : "bwd."; }

// The all-gather of the shared expert's input with SP; without, a no-op join of `after`
// (the first GEMM then waits for all of them).
std::vector<int64_t> shared_gather(const BuildContext& ctx, LayerDag& dag, Pass pass,
                                   const std::vector<int64_t>& after) {
  if (!ctx.sp) return after;
  return {add_after(dag,
                    make_comm(ctx, pass_prefix(pass) + "allgather_shared", OpKind::kAllGather, pass,
                              ParallelDim::kTp, ctx.bytes(ctx.tokens * ctx.hidden), ctx.dtype),
                    after)};
}

int64_t shared_reduce(const BuildContext& ctx, LayerDag& dag, Pass pass, int64_t after) {
  if (ctx.tp == 1) return after;
  return add_after(
      dag,
      make_comm(ctx, pass_prefix(pass) + (ctx.sp ? "reduce_scatter_shared" : "allreduce_shared"),
                ctx.sp ? OpKind::kReduceScatter : OpKind::kAllReduce, pass, ParallelDim::kTp,
                ctx.bytes(ctx.tokens * ctx.hidden), ctx.dtype),
      {after});
}

int64_t shared_ffn_per_rank(const BuildContext& ctx) {
  return ceil_div(ctx.model->moe->shared_expert_ffn_hidden_size, ctx.tp);
}

}  // namespace

int64_t add_shared_expert_forward(const BuildContext& ctx, LayerDag& dag,
                                  const std::vector<int64_t>& after) {
  const Pass f = Pass::kForward;
  const int64_t ffn = shared_ffn_per_rank(ctx);
  const std::vector<int64_t> input = shared_gather(ctx, dag, f, after);
  const int64_t fc1 =
      add_after(dag,
                make_gemm(ctx, "fwd.shared_fc1", OpKind::kGemm, f, GemmRole::kForward, 1,
                          ctx.tokens, ctx.fc1_width(ffn), ctx.hidden),
                input);
  const int64_t act = add_after(
      dag, make_activation(ctx, "fwd.shared_" + activation_id(ctx), f, ctx.tokens, ffn), {fc1});
  const int64_t fc2 = add_after(dag,
                                make_gemm(ctx, "fwd.shared_fc2", OpKind::kGemm, f,
                                          GemmRole::kForward, 1, ctx.tokens, ctx.hidden, ffn),
                                {act});
  return shared_reduce(ctx, dag, f, fc2);
}

int64_t add_shared_expert_backward(const BuildContext& ctx, LayerDag& dag, int64_t bda_mlp) {
  const Pass b = Pass::kBackward;
  const int64_t ffn = shared_ffn_per_rank(ctx);
  const int64_t fc1_width = ctx.fc1_width(ffn);
  const std::vector<int64_t> grad = shared_gather(ctx, dag, b, {bda_mlp});
  const int64_t fc2_dgrad = add_after(dag,
                                      make_gemm(ctx, "bwd.shared_fc2_dgrad", OpKind::kGemm, b,
                                                GemmRole::kDgrad, 1, ctx.tokens, ffn, ctx.hidden),
                                      grad);
  add_after(dag,
            make_wgrad(ctx, "bwd.shared_fc2_wgrad", OpKind::kGemm, 1, ctx.tokens, ctx.hidden, ffn),
            grad);
  const int64_t act =
      add_after(dag, make_activation(ctx, "bwd.shared_" + activation_id(ctx), b, ctx.tokens, ffn),
                {fc2_dgrad});
  const int64_t fc1_dgrad =
      add_after(dag,
                make_gemm(ctx, "bwd.shared_fc1_dgrad", OpKind::kGemm, b, GemmRole::kDgrad, 1,
                          ctx.tokens, ctx.hidden, fc1_width),
                {act});
  add_after(
      dag,
      make_wgrad(ctx, "bwd.shared_fc1_wgrad", OpKind::kGemm, 1, ctx.tokens, fc1_width, ctx.hidden),
      {act});
  return shared_reduce(ctx, dag, b, fc1_dgrad);
}

}  // namespace dhelix::dag_detail
