// The layer DAG builder: one transformer layer's forward and backward operator DAGs on one
// rank, with the shapes, work and communication groups of that rank.
//
// Worked example: Llama-3-70B (h = 8192, 64 heads of d = 128, 8 KV heads, SwiGLU FFN 28672)
// with tp = 8 and sequence parallelism, one sequence of 8192 tokens, cp = 1. Every rank
// holds T = 8192 tokens in the GEMMs and T/tp = 1024 rows in the norm and residual regions.
// The forward DAG is the paper's 14-op chain, each op feeding the next, plus two residual
// edges [0] -> [6] and [7] -> [13]:
//
//    [0]  ln_attn              norm             1024 x 8192 rows of the residual stream
//    [1]  allgather_attn       all_gather       8192 x 8192 bf16 = 128 MiB, tp8, local
//    [2]  gemm_qkv             gemm             m 8192, n 1280 (1024 q + 2·128 kv), k 8192
//    [3]  flash_attn           attention        b 1, 8 heads, 1 KV head, q = kv = 8192, d 128
//    [4]  gemm_proj            gemm             m 8192, n 8192, k 1024
//    [5]  reduce_scatter_attn  reduce_scatter   128 MiB, tp8, local
//    [6]  bda_attn             bias_dropout_add 1024 x 8192   <- residual from [0]
//    [7]  ln_mlp               norm             1024 x 8192
//    [8]  allgather_mlp        all_gather       128 MiB
//    [9]  gemm_fc1             gemm             m 8192, n 7168 (gate and up), k 8192
//    [10] swiglu               activation       8192 x 3584
//    [11] gemm_fc2             gemm             m 8192, n 8192, k 3584
//    [12] reduce_scatter_mlp   reduce_scatter   128 MiB
//    [13] bda_mlp              bias_dropout_add 1024 x 8192   <- residual from [7]
//
// Each chain edge is the consumer reading the producer's output. The residual edges follow
// the authors' DAG: the residual added by a bda is the input of the norm that opens its
// half-layer, anchored on that norm (it adds no order the chain does not already have, but
// it keeps the residual visible in exports). RoPE is fused into the attention op, as
// Megatron's fused RoPE kernel does, so it is not counted as an op. The gathered inputs of
// the column-parallel GEMMs (qkv, fc1) are saved for their wgrads: backward does not
// re-gather them.
//
// The backward DAG (18 ops) mirrors it from bda_mlp to ln_attn; each forward GEMM becomes a
// dgrad on the critical path and a wgrad that nothing waits for (a movable sink, the
// paper's "Wgrad can move around"). The bda gradients also feed the next-but-one norm
// backward (the residual stream's gradient skips the branch). Variants:
//   * tp > 1 without SP: no gathers; an all-reduce follows proj and fc2 in forward and the
//     qkv and fc1 dgrads in backward; norms run over all T rows.
//   * tp = 1: no TP communication at all.
//   * cp > 1: the attention op becomes a ring (dag_builder_cp.cc).
//   * MoE: the MLP between ln_mlp and bda_mlp becomes router, permute, all-to-all, grouped
//     GEMMs, all-to-all, unpermute (dag_builder_moe.cc).
//   * FSDP (optim_grads_params): parameter all-gathers open the forward and the backward,
//     a gradient reduce-scatter closes the backward (dag_builder_fsdp.cc).
// Stage extras (embedding, head, loss) are in dag_builder_stage.cc.

#include "lib/dag_builder.h"

#include <fmt/format.h>

#include "lib/dag_builder_internal.h"
#include "lib/error.h"

namespace dhelix {
namespace {

using namespace dag_detail;

std::string prefix(Pass pass) { return pass == Pass::kForward ? "fwd." : "bwd."; }

// With SP, the T/tp rows of the residual region are all-gathered to T rows before a
// column-parallel GEMM (forward) or a row-parallel dgrad (backward). Returns the op whose
// output the GEMM reads.
int64_t gather_rows(const BuildContext& ctx, LayerDag& dag, Pass pass, const std::string& part,
                    int64_t after) {
  if (!ctx.sp) return after;
  return add_after(dag,
                   make_comm(ctx, prefix(pass) + "allgather_" + part, OpKind::kAllGather, pass,
                             ParallelDim::kTp, ctx.bytes(ctx.tokens * ctx.hidden), ctx.dtype),
                   {after});
}

// Partial sums over the TP group after a row-parallel GEMM (forward) or a column-parallel
// dgrad (backward): reduce-scatter back to T/tp rows with SP, all-reduce without.
int64_t reduce_rows(const BuildContext& ctx, LayerDag& dag, Pass pass, const std::string& part,
                    int64_t after) {
  if (ctx.tp == 1) return after;
  const bool sp = ctx.sp;
  return add_after(dag,
                   make_comm(ctx, prefix(pass) + (sp ? "reduce_scatter_" : "allreduce_") + part,
                             sp ? OpKind::kReduceScatter : OpKind::kAllReduce, pass,
                             ParallelDim::kTp, ctx.bytes(ctx.tokens * ctx.hidden), ctx.dtype),
                   {after});
}

int64_t qkv_width(const BuildContext& ctx) { return ctx.q_width + 2 * ctx.kv_width; }

// ln_attn .. bda_attn. Returns bda_attn.
int64_t add_attention_forward(const BuildContext& ctx, LayerDag& dag) {
  const Pass f = Pass::kForward;
  const int64_t ln = add_after(dag, make_norm(ctx, "fwd.ln_attn", f, ctx.rows), {});
  const int64_t input = gather_rows(ctx, dag, f, "attn", ln);
  const int64_t qkv = add_after(dag,
                                make_gemm(ctx, "fwd.gemm_qkv", OpKind::kGemm, f, GemmRole::kForward,
                                          1, ctx.tokens, qkv_width(ctx), ctx.hidden),
                                {input});
  const int64_t core = add_attention_core_forward(ctx, dag, qkv);
  const int64_t proj =
      add_after(dag,
                make_gemm(ctx, "fwd.gemm_proj", OpKind::kGemm, f, GemmRole::kForward, 1, ctx.tokens,
                          ctx.hidden, ctx.q_width),
                {core});
  const int64_t out = reduce_rows(ctx, dag, f, "attn", proj);
  return add_after(dag, make_bda(ctx, "fwd.bda_attn", f), {out, ln});  // ln: residual
}

// Dense MLP forward between ln_mlp and bda_mlp. Returns the op producing the MLP output.
int64_t add_dense_mlp_forward(const BuildContext& ctx, LayerDag& dag, int64_t ln) {
  const Pass f = Pass::kForward;
  const int64_t input = gather_rows(ctx, dag, f, "mlp", ln);
  const int64_t fc1 = add_after(dag,
                                make_gemm(ctx, "fwd.gemm_fc1", OpKind::kGemm, f, GemmRole::kForward,
                                          1, ctx.tokens, ctx.fc1_width(ctx.ffn), ctx.hidden),
                                {input});
  const int64_t act = add_after(
      dag, make_activation(ctx, "fwd." + activation_id(ctx), f, ctx.tokens, ctx.ffn), {fc1});
  const int64_t fc2 = add_after(dag,
                                make_gemm(ctx, "fwd.gemm_fc2", OpKind::kGemm, f, GemmRole::kForward,
                                          1, ctx.tokens, ctx.hidden, ctx.ffn),
                                {act});
  return reduce_rows(ctx, dag, f, "mlp", fc2);
}

void build_forward(const BuildContext& ctx, LayerDag& dag) {
  if (fsdp_gathers(ctx, Pass::kForward)) add_fsdp_gather(ctx, dag, Pass::kForward);
  const int64_t bda_attn = add_attention_forward(ctx, dag);
  const int64_t ln =
      add_after(dag, make_norm(ctx, "fwd.ln_mlp", Pass::kForward, ctx.rows), {bda_attn});
  const int64_t out =
      ctx.model->is_moe() ? add_moe_forward(ctx, dag, ln) : add_dense_mlp_forward(ctx, dag, ln);
  add_after(dag, make_bda(ctx, "fwd.bda_mlp", Pass::kForward), {out, ln});  // ln: residual
  link_fsdp_collectives(ctx, dag, Pass::kForward);
}

// Dense MLP backward between bda_mlp and ln_mlp. Returns the op producing d(ln_mlp output).
int64_t add_dense_mlp_backward(const BuildContext& ctx, LayerDag& dag, int64_t bda) {
  const Pass b = Pass::kBackward;
  const int64_t grad = gather_rows(ctx, dag, b, "mlp", bda);
  const int64_t fc2_dgrad =
      add_after(dag,
                make_gemm(ctx, "bwd.fc2_dgrad", OpKind::kGemm, b, GemmRole::kDgrad, 1, ctx.tokens,
                          ctx.ffn, ctx.hidden),
                {grad});
  // wgrads read the saved forward input and the gradient of their output.
  add_after(dag,
            make_wgrad(ctx, "bwd.fc2_wgrad", OpKind::kGemm, 1, ctx.tokens, ctx.hidden, ctx.ffn),
            {grad});
  const int64_t act = add_after(
      dag, make_activation(ctx, "bwd." + activation_id(ctx), b, ctx.tokens, ctx.ffn), {fc2_dgrad});
  const int64_t fc1_width = ctx.fc1_width(ctx.ffn);
  const int64_t fc1_dgrad =
      add_after(dag,
                make_gemm(ctx, "bwd.fc1_dgrad", OpKind::kGemm, b, GemmRole::kDgrad, 1, ctx.tokens,
                          ctx.hidden, fc1_width),
                {act});
  add_after(dag,
            make_wgrad(ctx, "bwd.fc1_wgrad", OpKind::kGemm, 1, ctx.tokens, fc1_width, ctx.hidden),
            {act});
  return reduce_rows(ctx, dag, b, "mlp", fc1_dgrad);
}

// bda_attn .. ln_attn backward, after ln_mlp's backward. `bda_mlp` carries the residual
// stream's gradient around the MLP branch.
void add_attention_backward(const BuildContext& ctx, LayerDag& dag, int64_t ln_mlp,
                            int64_t bda_mlp) {
  const Pass b = Pass::kBackward;
  const int64_t bda = add_after(dag, make_bda(ctx, "bwd.bda_attn", b), {ln_mlp, bda_mlp});
  const int64_t grad = gather_rows(ctx, dag, b, "attn", bda);
  const int64_t proj_dgrad =
      add_after(dag,
                make_gemm(ctx, "bwd.proj_dgrad", OpKind::kGemm, b, GemmRole::kDgrad, 1, ctx.tokens,
                          ctx.q_width, ctx.hidden),
                {grad});
  add_after(
      dag, make_wgrad(ctx, "bwd.proj_wgrad", OpKind::kGemm, 1, ctx.tokens, ctx.hidden, ctx.q_width),
      {grad});
  const std::vector<int64_t> dqkv = add_attention_core_backward(ctx, dag, proj_dgrad);
  const int64_t qkv_dgrad =
      add_after(dag,
                make_gemm(ctx, "bwd.qkv_dgrad", OpKind::kGemm, b, GemmRole::kDgrad, 1, ctx.tokens,
                          ctx.hidden, qkv_width(ctx)),
                dqkv);
  add_after(
      dag,
      make_wgrad(ctx, "bwd.qkv_wgrad", OpKind::kGemm, 1, ctx.tokens, qkv_width(ctx), ctx.hidden),
      dqkv);
  const int64_t dx = reduce_rows(ctx, dag, b, "attn", qkv_dgrad);
  // The residual stream's gradient (from bda_attn) joins the norm's input gradient.
  add_after(dag, make_norm(ctx, "bwd.ln_attn", b, ctx.rows), {dx, bda});
}

void build_backward(const BuildContext& ctx, LayerDag& dag) {
  const Pass b = Pass::kBackward;
  if (fsdp_gathers(ctx, b)) add_fsdp_gather(ctx, dag, b);
  const int64_t bda = add_after(dag, make_bda(ctx, "bwd.bda_mlp", b), {});
  const std::vector<int64_t> dnormed =
      ctx.model->is_moe() ? add_moe_backward(ctx, dag, bda)
                          : std::vector<int64_t>{add_dense_mlp_backward(ctx, dag, bda)};
  const int64_t ln = add_after(dag, make_norm(ctx, "bwd.ln_mlp", b, ctx.rows), dnormed);
  add_attention_backward(ctx, dag, ln, bda);
  link_fsdp_collectives(ctx, dag, b);
}

}  // namespace

LayerDags build_layer_dags(const JobSpec& job, int64_t rank) {
  const ParallelSpec& p = job.parallel;
  if (job.model.is_moe() && p.tp > 1 && !p.sp) {
    throw Error(ErrorCode::kUnsupported,
                fmt::format("{}: /parallel/sp: false is not supported for a mixture-of-experts "
                            "model with tp = {} (MoE layers with tensor parallelism need "
                            "sequence parallelism, as in Megatron-LM)",
                            job.source_file, p.tp));
  }
  const BuildContext ctx = make_context(job, rank);
  LayerDags dags;
  build_forward(ctx, dags.forward);
  build_backward(ctx, dags.backward);
  return dags;
}

}  // namespace dhelix
