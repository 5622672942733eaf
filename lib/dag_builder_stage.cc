// A pipeline stage's work outside its layers: the token embedding (first stage) and the
// final norm, output head and loss (last stage), forward and backward.
//
//   first stage, forward:  embedding ─> reduce_scatter_embedding (SP) | allreduce_embedding
//                backward: allgather_embedding (SP) ─> embedding (weight gradient, a sink)
//   last stage, forward:   final_norm ─> allgather_head (SP) ─> head ─> allreduce_loss ─> loss
//                backward: loss ─> head_dgrad ─> reduce_scatter_head (SP) | allreduce_head
//                               └─> head_wgrad (sink)            ─> final_norm
//
// The embedding is vocab-parallel: each TP rank looks up the tokens of its V/tp rows and
// leaves zeros for the rest, so the partial outputs are summed over TP (reduce-scatter to
// T/tp rows with SP). The forward reduction and the backward gather are boundary ops: their
// consumer (forward) or producer (backward) is the stage's first layer. Learned position
// embeddings are added inside the embedding op.
//
// The head is a column-parallel GEMM over V/tp vocabulary columns (Megatron pads V further
// to a multiple of 128·tp; that padding is left out so that flops match the model's count).
// Vocab-parallel cross-entropy all-reduces three fp32 values per token over TP (the max
// logit, the target logit and the sum of exponentials), modelled as one all-reduce of 3·T
// fp32 values between the head and the loss.

#include "lib/dag_builder.h"
#include "lib/dag_builder_internal.h"
#include "lib/int_math.h"

namespace dhelix {
namespace {

using namespace dag_detail;

Op make_embedding(const BuildContext& ctx, Pass pass) {
  // Forward gathers T rows of the table; backward scatter-adds T gradient rows into it.
  Op op = make_memory_op(ctx, pass == Pass::kForward ? "fwd.embedding" : "bwd.embedding",
                         OpKind::kEmbedding, pass, ctx.tokens, ctx.hidden,
                         pass == Pass::kForward ? 0 : 1, 1, 1);
  op.shape.k = ctx.vocab_shard;
  op.movable_sink = pass == Pass::kBackward;  // a weight gradient nothing waits for
  return op;
}

Op make_tp_comm(const BuildContext& ctx, const std::string& id, OpKind kind, Pass pass) {
  return make_comm(ctx, id, kind, pass, ParallelDim::kTp, ctx.bytes(ctx.tokens * ctx.hidden),
                   ctx.dtype);
}

void add_first_stage(const BuildContext& ctx, LayerDags& dags) {
  const int64_t embedding = add_after(dags.forward, make_embedding(ctx, Pass::kForward), {});
  if (ctx.tp > 1) {
    add_after(
        dags.forward,
        ctx.sp ? make_tp_comm(ctx, "fwd.reduce_scatter_embedding", OpKind::kReduceScatter,
                              Pass::kForward)
               : make_tp_comm(ctx, "fwd.allreduce_embedding", OpKind::kAllReduce, Pass::kForward),
        {embedding});
  }
  std::vector<int64_t> grad;
  if (ctx.sp) {
    grad.push_back(add_after(
        dags.backward,
        make_tp_comm(ctx, "bwd.allgather_embedding", OpKind::kAllGather, Pass::kBackward), {}));
  }
  add_after(dags.backward, make_embedding(ctx, Pass::kBackward), grad);
}

Op make_loss(const BuildContext& ctx, Pass pass) {
  const bool forward = pass == Pass::kForward;
  // Forward: softmax statistics and the per-token loss, keeping the softmax for backward;
  // backward: softmax minus one-hot.
  return make_memory_op(ctx, forward ? "fwd.loss" : "bwd.loss", OpKind::kLoss, pass, ctx.tokens,
                        ctx.vocab_shard, forward ? kFlopsPerSoftmaxElement : 2, 1, 1);
}

void add_last_stage(const BuildContext& ctx, LayerDags& dags) {
  LayerDag& f = dags.forward;
  const Pass fwd = Pass::kForward;
  int64_t x = add_after(f, make_norm(ctx, "fwd.final_norm", fwd, ctx.rows), {});
  if (ctx.sp) {
    x = add_after(f, make_tp_comm(ctx, "fwd.allgather_head", OpKind::kAllGather, fwd), {x});
  }
  const int64_t vocab = ctx.vocab_shard;
  x = add_after(f,
                make_gemm(ctx, "fwd.head", OpKind::kHead, fwd, GemmRole::kForward, 1, ctx.tokens,
                          vocab, ctx.hidden),
                {x});
  if (ctx.tp > 1) {
    x = add_after(f,
                  make_comm(ctx, "fwd.allreduce_loss", OpKind::kAllReduce, fwd, ParallelDim::kTp,
                            3 * ctx.tokens * dtype_bytes(DType::kFp32), DType::kFp32),
                  {x});
  }
  add_after(f, make_loss(ctx, fwd), {x});

  LayerDag& b = dags.backward;
  const Pass bwd = Pass::kBackward;
  const int64_t loss = add_after(b, make_loss(ctx, bwd), {});
  int64_t dx = add_after(b,
                         make_gemm(ctx, "bwd.head_dgrad", OpKind::kHead, bwd, GemmRole::kDgrad, 1,
                                   ctx.tokens, ctx.hidden, vocab),
                         {loss});
  add_after(b, make_wgrad(ctx, "bwd.head_wgrad", OpKind::kHead, 1, ctx.tokens, vocab, ctx.hidden),
            {loss});
  if (ctx.tp > 1) {
    dx =
        add_after(b,
                  ctx.sp ? make_tp_comm(ctx, "bwd.reduce_scatter_head", OpKind::kReduceScatter, bwd)
                         : make_tp_comm(ctx, "bwd.allreduce_head", OpKind::kAllReduce, bwd),
                  {dx});
  }
  add_after(b, make_norm(ctx, "bwd.final_norm", bwd, ctx.rows), {dx});
}

}  // namespace

LayerDags build_stage_extras(const JobSpec& job, int64_t rank, bool first_stage, bool last_stage) {
  const BuildContext ctx = make_context(job, rank);
  LayerDags dags;
  // Each part's ops are those it added, in both DAGs.
  const auto mark = [&dags](OpPart part, int64_t forward_from, int64_t backward_from) {
    for (int64_t i = forward_from; i < dags.forward.size(); ++i)
      dags.forward.mutable_op(i).part = part;
    for (int64_t i = backward_from; i < dags.backward.size(); ++i) {
      dags.backward.mutable_op(i).part = part;
    }
  };
  if (first_stage) {
    add_first_stage(ctx, dags);
    mark(OpPart::kEmbedding, 0, 0);
  }
  if (last_stage) {
    const int64_t forward_from = dags.forward.size();
    const int64_t backward_from = dags.backward.size();
    add_last_stage(ctx, dags);
    mark(OpPart::kHead, forward_from, backward_from);
  }
  return dags;
}

}  // namespace dhelix
