// Fully sharded data parallelism in the layer DAGs (Megatron-LM's --use-megatron-fsdp with
// --data-parallel-sharding-strategy optim_grads_params; PyTorch FSDP2's fully_shard; ZeRO-3,
// Rajbhandari et al. 2020). Only that strategy adds ops: optim (ZeRO-1) and optim_grads
// (ZeRO-2) keep the parameters whole across micro-batches and reduce the gradients at the
// iteration's end, as the distributed optimizer does (planner/scheme_runs.cc).
//
// Each layer is one FSDP unit. Between uses a dp rank keeps 1/dp of the layer's
// parameters; the layer all-gathers them whole before it reads them and reduce-scatters its
// gradients when they are complete, every micro-batch (FSDP reduces each micro-batch's
// gradients into the sharded buffer, so no full gradient buffer outlives a backward):
//
//    op                        kind            group  bytes (lib/fsdp_sizes.h)   edges
//    fwd.fsdp_gather           all_gather      dp     params·2 (bf16)           -> every forward op
//                                                                                 that reads
//                                                                                 weights
//    bwd.fsdp_gather           all_gather      dp     params·2                  -> every dgrad and
//                                                                                 norm backward
//    bwd.fsdp_reduce_scatter   reduce_scatter  dp     params·4 (fp32; 2 with    <- every wgrad and
//                                                     --grad-reduce-in-bf16)       norm backward
//
// Forward weight readers: the GEMMs, the norms (their scale), a bias-dropout-add with a
// bias. Backward weight readers: the dgrads and the norm backwards (wgrads read the saved
// input and the output gradient, not the weight). Weight-gradient producers: the wgrads,
// the norm backwards (dγ) and a bias-dropout-add backward with a bias (db).
//
// The gathers are inserted first (index 0): nothing in the layer precedes them (the gather
// needs only the shard), and the intra-batch rewrite (dag_builder_intra_batch.cc) wants
// indices in topological order. bwd.fsdp_gather exists only with reshard_after_forward
// (FSDP2's default): without it the forward's gathered parameters stay until the
// micro-batch's backward ends. The reduce-scatter is a movable sink like the wgrads:
// nothing in the layer waits for it, and a split backward counts it as weight work W
// (backward_work in lib/op_catalogue.cc).
//
// Example, tiny Llama (examples/jobs/tiny-fsdp-dp4.json: tp 1, dp 4): the forward's 9 ops
// become 10, fwd.fsdp_gather feeding ln_attn, gemm_qkv, gemm_proj, ln_mlp, gemm_fc1 and
// gemm_fc2; the backward's 13 become 15, bwd.fsdp_gather feeding the four dgrads and two
// norm backwards, the reduce-scatter after the four wgrads and two norm backwards.
//
// A mixture of experts has two parts (lib/fsdp_sizes.h): the non-expert part above over the
// DP group, the experts over the expert-data-parallel group (edp = dp·cp·tp / (ep·etp),
// Megatron-FSDP's expert sharding). The grouped GEMMs read and write the expert part only;
// every other weight reader and writer (the router, a shared expert included) the
// non-expert part. So each pass has a gather of each part and the backward a reduce-scatter
// of each:
//
//    op                               group  bytes                   edges
//    fwd.fsdp_expert_gather           edp    experts·2               -> grouped_fc1, grouped_fc2
//    bwd.fsdp_expert_gather           edp    experts·2               -> the grouped dgrads
//    bwd.fsdp_expert_reduce_scatter   edp    experts·4 (fp32)        <- the grouped wgrads
//
// The expert gather is index 1, after the non-expert one (both first). With edp = 1 (ep·etp
// covers dp·cp·tp) the experts stay whole on the rank and have no ops. Example,
// examples/jobs/tiny-fsdp-moe-ep2-dp4.json (llama-tiny-moe, dp 4, ep 2, edp 2): the forward
// gains 2 ops, the backward 4.

#include <string>
#include <vector>

#include "lib/dag_builder_internal.h"
#include "lib/error.h"
#include "lib/fsdp_sizes.h"

namespace dhelix::dag_detail {
namespace {

bool has_bias(const Op& op) { return op.kind == OpKind::kBiasDropoutAdd && op.variant == "bias"; }

// The grouped GEMMs are the experts'; every other op's weights are the non-expert part's.
bool is_expert_op(const Op& op) { return op.kind == OpKind::kGroupedGemm; }

bool reads_weights(const Op& op) {
  if (op.pass == Pass::kForward) {
    return op.kind == OpKind::kGemm || op.kind == OpKind::kGroupedGemm ||
           op.kind == OpKind::kNorm || op.kind == OpKind::kRouter || has_bias(op);
  }
  // The router's backward (a fused op, no GEMM role) multiplies by its weights for dx.
  return op.gemm_role == GemmRole::kDgrad || op.kind == OpKind::kNorm || op.kind == OpKind::kRouter;
}

bool writes_weight_gradient(const Op& op) {
  return op.gemm_role == GemmRole::kWgrad || op.kind == OpKind::kNorm || has_bias(op);
}

// One FSDP part of a layer: its ids' stem, its group and its sizes.
struct FsdpPart {
  bool experts = false;
  std::string stem;  // "fsdp" or "fsdp_expert"
  const ProcessGroup* group = nullptr;
  int64_t gather_bytes = 0;
  int64_t reduce_scatter_bytes = 0;
};

std::vector<FsdpPart> fsdp_parts(const BuildContext& ctx) {
  const ModelSpec& m = *ctx.model;
  const ParallelSpec& p = *ctx.parallel;
  std::vector<FsdpPart> parts{
      {false, "fsdp", &ctx.dp_group, fsdp_gather_bytes(m, p), fsdp_reduce_scatter_bytes(m, p)}};
  if (fsdp_shards_experts(m, p)) {
    parts.push_back({true, "fsdp_expert", &ctx.edp_group, fsdp_expert_gather_bytes(m, p),
                     fsdp_expert_reduce_scatter_bytes(m, p)});
  }
  return parts;
}

Op make_fsdp_comm(const BuildContext& ctx, const FsdpPart& part, std::string id, OpKind kind,
                  Pass pass, int64_t bytes, DType dtype) {
  return make_comm_on(ctx, std::move(id), kind, pass, ParallelDim::kDp, *part.group, bytes, dtype);
}

std::string gather_id(const FsdpPart& part, Pass pass) {
  return (pass == Pass::kForward ? "fwd." : "bwd.") + part.stem + "_gather";
}

}  // namespace

bool fsdp_gathers(const BuildContext& ctx, Pass pass) {
  const ParallelSpec& p = *ctx.parallel;
  return p.fsdp_shards_parameters() && (pass == Pass::kForward || p.fsdp_reshard_after_forward);
}

void add_fsdp_gather(const BuildContext& ctx, LayerDag& dag, Pass pass) {
  DHELIX_CHECK(dag.size() == 0);  // indices 0 (and 1), see the file comment
  for (const FsdpPart& part : fsdp_parts(ctx)) {
    dag.add_op(make_fsdp_comm(ctx, part, gather_id(part, pass), OpKind::kAllGather, pass,
                              part.gather_bytes, ctx.dtype));
  }
}

void link_fsdp_collectives(const BuildContext& ctx, LayerDag& dag, Pass pass) {
  if (!ctx.parallel->fsdp_shards_parameters()) return;
  const int64_t n = dag.size();
  for (const FsdpPart& part : fsdp_parts(ctx)) {
    // Without an expert part the experts' weights are whole: nobody waits for them.
    const auto mine = [&part](const Op& op) { return is_expert_op(op) == part.experts; };
    if (fsdp_gathers(ctx, pass)) {
      const int64_t gather = *dag.find(gather_id(part, pass));
      for (int64_t v = 0; v < n; ++v) {
        if (v != gather && reads_weights(dag.op(v)) && mine(dag.op(v))) dag.add_edge(gather, v);
      }
    }
    if (pass == Pass::kForward) continue;
    std::vector<int64_t> gradients;
    for (int64_t v = 0; v < n; ++v) {
      if (writes_weight_gradient(dag.op(v)) && mine(dag.op(v))) gradients.push_back(v);
    }
    Op scatter =
        make_fsdp_comm(ctx, part, "bwd." + part.stem + "_reduce_scatter", OpKind::kReduceScatter,
                       pass, part.reduce_scatter_bytes, fsdp_gradient_dtype(*ctx.parallel));
    scatter.movable_sink = true;
    add_after(dag, std::move(scatter), gradients);
  }
}

}  // namespace dhelix::dag_detail
