// Attention core under the all-to-all and all-gather forms of context parallelism
// (Megatron-LM's --cp-comm-type a2a | allgather | a2a+p2p, TransformerEngine's
// AttnFuncWithCPAndQKVOA2A and AttnFuncWithCPAndKVAllGather; the p2p ring is in
// dag_builder_cp.cc).
//
// a2a, DeepSpeed Ulysses (Jacobs et al. 2023, arXiv:2309.14509). Each CP rank holds T/cp
// tokens of every head of its TP rank; an all-to-all over the CP group turns that into all
// T tokens of heads/cp, the attention runs over the whole sequence on those heads, and a
// second all-to-all turns the output back into the sequence split. Forward, cp = 4 on a
// TP rank with 8 query and 4 KV heads, sequence 4096 (b = micro-batch, d = head_dim,
// dt = dtype bytes; bytes are nccl-tests' size, what one rank sends and keeps):
//
//    op              group  bytes               this rank holds afterwards
//    gemm_qkv        -      -                   1024 tokens x (8 q + 4 k + 4 v) heads
//    fwd.qkv_a2a     cp     b·1024·16·d·dt      4096 tokens x (2 q + 1 k + 1 v) heads
//    fwd.flash_attn  -      -                   O: 4096 tokens x 2 heads (causal 4096 x 4096)
//    fwd.out_a2a     cp     b·1024·8·d·dt       O: 1024 tokens x 8 heads
//
// (the K and V heads must divide by cp as the query heads do: TE's all-to-all splits each
// of Q, K, V along its heads, lib/job_validation.cc refuses the rest). The all-to-all moves
// (cp−1)/cp of its size over the link, which link_cost.h's all-to-all prices: the same
// function that prices MoE's dispatch. The attention does the ring's work: heads/cp·T·T/2
// causal pairs against cp steps of heads·(T/cp)²/2 each.
//
//    gemm_qkv ──> qkv_a2a ──> flash_attn ──> out_a2a ──> gemm_proj
//    proj_dgrad ──> dout_a2a ──> flash_attn (bwd) ──> dqkv_a2a ──> qkv_dgrad, qkv_wgrad
//
// Backward mirrors it: TE keeps Q, K, V and O in the head split for the backward, so only
// dO is exchanged on the way in, and dQ, dK, dV (b·T/cp·(8+2+2)·d·dt) on the way out.
// Nothing in the layer runs beside these all-to-alls in Megatron (it issues them on the
// compute stream); DHelix's pairing may put the other strand's compute under them.
//
// a2a+p2p, hierarchical (--hierarchical-context-parallel-sizes A P, A·P = cp): the
// all-to-all runs inside sub-groups of A adjacent CP ranks (NVLink when A fits the node),
// leaving each rank A·T/cp = T/P tokens of heads/A; the p2p ring (dag_builder_cp.cc's, P
// steps) then moves K/V blocks of b·T/P·2·(kv_heads/A)·d·dt across the sub-groups:
//
//    gemm_qkv ──> qkv_a2a ──> ring over P (kv_sendrecv, attn_step, attn_merge) ──> out_a2a
//
// allgather: K and V are all-gathered whole (b·T·2·kv_heads·d·dt, the gathered buffer),
// each rank's T/cp queries attend to them (causal: with Megatron's load balancing the two
// chunks of a rank see T/2 keys on average, which the causal halving of a (T/cp) x T block
// gives exactly). TE saves only the local K, V and gathers them again in the backward,
// which reduce-scatters dK, dV (the same size) after the attention:
//
//    gemm_qkv ──> kv_allgather ──> flash_attn ──> gemm_proj
//    proj_dgrad ──> kv_allgather ──> flash_attn (bwd) ──> dkv_reducescatter ──> qkv_dgrad

#include "lib/dag_builder_internal.h"

namespace dhelix::dag_detail {
namespace {

// Heads and tokens after the all-to-all over `a2a` ranks: heads/a2a over a2a·seq_shard.
AttentionShape after_a2a(const BuildContext& ctx, int64_t a2a) {
  const int64_t tokens = ctx.seq_shard * a2a;
  return {
      .heads = ctx.heads / a2a, .kv_heads = ctx.kv_heads / a2a, .q_len = tokens, .kv_len = tokens};
}

Op make_a2a(const BuildContext& ctx, std::string id, Pass pass, int64_t width) {
  return make_comm_on(ctx, std::move(id), OpKind::kAllToAll, pass, ParallelDim::kCp,
                      ctx.cp_a2a_group, ctx.bytes(ctx.tokens * width), ctx.dtype);
}

// The ring a2a+p2p runs across its sub-groups on the heads the all-to-all left.
RingSpec hierarchical_ring(const BuildContext& ctx) {
  const AttentionShape step = after_a2a(ctx, ctx.parallel->cp_a2a_group());
  const int64_t heads = ctx.parallel->cp_ring_query_heads ? step.heads : step.kv_heads;
  return {.step = step,
          .block_bytes = ctx.bytes(2 * ctx.micro_batch * step.q_len * heads * ctx.head_dim),
          .group = &ctx.cp_ring_group,
          .size = ctx.parallel->cp_ring_group()};
}

bool hierarchical(const BuildContext& ctx) {
  return ctx.parallel->cp_comm_type == CpCommType::kA2aP2p;
}

// K and V of the whole sequence: the all-gather's output and the reduce-scatter's input.
int64_t gathered_kv_bytes(const BuildContext& ctx) {
  return ctx.bytes(2 * ctx.micro_batch * ctx.parallel->seq_length * ctx.kv_width);
}

Op make_kv_collective(const BuildContext& ctx, std::string id, OpKind kind, Pass pass) {
  return make_comm(ctx, std::move(id), kind, pass, ParallelDim::kCp, gathered_kv_bytes(ctx),
                   ctx.dtype);
}

}  // namespace

int64_t add_cp_a2a_forward(const BuildContext& ctx, LayerDag& dag, int64_t qkv) {
  const Pass f = Pass::kForward;
  const int64_t scattered = add_after(dag, make_a2a(ctx, "fwd.qkv_a2a", f, ctx.qkv_width), {qkv});
  const int64_t core =
      hierarchical(ctx)
          ? add_ring_forward(ctx, dag, hierarchical_ring(ctx), scattered)
          : add_after(dag, make_attention(ctx, "fwd.flash_attn", f, after_a2a(ctx, ctx.cp)),
                      {scattered});
  return add_after(dag, make_a2a(ctx, "fwd.out_a2a", f, ctx.q_width), {core});
}

std::vector<int64_t> add_cp_a2a_backward(const BuildContext& ctx, LayerDag& dag,
                                         int64_t proj_dgrad) {
  const Pass b = Pass::kBackward;
  const int64_t dout = add_after(dag, make_a2a(ctx, "bwd.dout_a2a", b, ctx.q_width), {proj_dgrad});
  const std::vector<int64_t> core =
      hierarchical(ctx)
          ? add_ring_backward(ctx, dag, hierarchical_ring(ctx), dout)
          : std::vector<int64_t>{add_after(
                dag, make_attention(ctx, "bwd.flash_attn", b, after_a2a(ctx, ctx.cp)), {dout})};
  return {add_after(dag, make_a2a(ctx, "bwd.dqkv_a2a", b, ctx.qkv_width), core)};
}

int64_t add_cp_allgather_forward(const BuildContext& ctx, LayerDag& dag, int64_t qkv) {
  const Pass f = Pass::kForward;
  const int64_t gather =
      add_after(dag, make_kv_collective(ctx, "fwd.kv_allgather", OpKind::kAllGather, f), {qkv});
  return add_after(
      dag, make_attention(ctx, "fwd.flash_attn", f, local_attention(ctx, ctx.parallel->seq_length)),
      {qkv, gather});
}

std::vector<int64_t> add_cp_allgather_backward(const BuildContext& ctx, LayerDag& dag,
                                               int64_t proj_dgrad) {
  const Pass b = Pass::kBackward;
  // The gather needs only the saved K and V; anchored on proj_dgrad, as the ring's first
  // backward exchange is, so that it has a producer in the layer.
  const int64_t gather = add_after(
      dag, make_kv_collective(ctx, "bwd.kv_allgather", OpKind::kAllGather, b), {proj_dgrad});
  const int64_t attention = add_after(
      dag, make_attention(ctx, "bwd.flash_attn", b, local_attention(ctx, ctx.parallel->seq_length)),
      {proj_dgrad, gather});
  const int64_t scatter =
      add_after(dag, make_kv_collective(ctx, "bwd.dkv_reducescatter", OpKind::kReduceScatter, b),
                {attention});
  return {attention, scatter};
}

}  // namespace dhelix::dag_detail
