// Attention core of a layer: one flash attention, or with context parallelism (cp >= 2)
// the ring of Megatron-LM / TransformerEngine's "p2p" CP attention (the default
// --cp-comm-type; a2a, allgather and a2a+p2p are in dag_builder_cp_a2a.cc, and a2a+p2p runs
// this ring across its sub-groups).
//
// Forward, cp = 4 (a = attention step on one KV block, s = KV send/recv, both K and V:
// 2·T·kv_heads·d·dt bytes to the next CP rank, the previous rank's block in return):
//
//    gemm_qkv ─┬─> a0 ─────> a1 ─────> a2 ─────> a3 ──> attn_merge (reads a0..a3)
//              └─> s0 ──┬──> a1
//                       └──> s1 ──┬──> a2
//                                 └──> s2 ──> a3
//
//   a0 uses the local block; a(i+1) needs the block s(i) received; s(i+1) forwards that
//   block, so it waits for s(i) but not for a(i): comm step i+1 overlaps attention step i,
//   as Megatron issues it. Steps stay in ring order (one compute stream; Megatron corrects
//   step i's partial output while step i+1 runs), and the merge combines the partial outputs
//   with their softmax statistics (every step feeds it).
//
// Causality: with Megatron's load balancing each rank holds chunks i and 2·cp−1−i of the
// sequence, so step 0 is a causal block and every other step does exactly half of a full
// block. Each step records the full seq/cp × seq/cp block with causal = true: the cost
// model halves it, and the flops are Megatron's undiscounted count.
//
// Backward, the same ring with gradients: block b's dK, dV are accumulated by every rank
// as they travel one hop behind the block itself, so rank r sends at iteration i the KV
// block for the neighbour's step i+1 together with the dKV accumulated through its step
// i−1. Iteration 0 sends KV only (bytes x1), iterations 1..cp−2 KV and dKV (x2), iteration
// cp−1 dKV only (x1), and a last exchange after the final step carries the finished dKV
// home (x1): cp+1 send/recvs, cp attention-backward steps. s(i) waits for s(i−1) (the
// forwarded block and dKV) and for step i−1 (its dKV contribution), never for step i.
// The first exchange needs only the saved K and V; it is anchored on proj_dgrad, where
// Megatron's attention backward starts, so that it has a producer in the layer.

#include <string>

#include "lib/dag_builder_internal.h"

namespace dhelix::dag_detail {
namespace {

std::string indexed(const char* stem, int64_t i) { return stem + std::to_string(i); }

Op make_merge(const BuildContext& ctx, const RingSpec& ring) {
  // Reads one partial output per step (and their fp32 statistics, left out), writes one.
  const int64_t rows = ctx.micro_batch * ring.step.q_len;
  const int64_t width = ring.step.heads * ctx.head_dim;
  const auto steps = static_cast<double>(ring.size);
  Op op = make_memory_op(ctx, "fwd.attn_merge", OpKind::kAttentionMerge, Pass::kForward, rows,
                         width, kFlopsPerMergeElement * steps, steps, 1);
  op.shape.batch = ring.size;
  return op;
}

Op make_hop(const BuildContext& ctx, const RingSpec& ring, std::string id, Pass pass,
            int64_t bytes) {
  return make_comm_on(ctx, std::move(id), OpKind::kSendRecv, pass, ParallelDim::kCp, *ring.group,
                      bytes, ctx.dtype);
}

}  // namespace

RingSpec p2p_ring(const BuildContext& ctx) {
  // Bytes of this rank's K and V blocks: the payload of one ring hop. Megatron-LM up to core
  // 0.5 repeats K and V to the query heads before calling the attention (Attention.forward,
  // "expand the key_layer and value_layer"), so its ring carries q_width columns each.
  const int64_t width = ctx.parallel->cp_ring_query_heads ? ctx.q_width : ctx.kv_width;
  return {.step = local_attention(ctx, ctx.seq_shard),
          .block_bytes = ctx.bytes(2 * ctx.tokens * width),
          .group = &ctx.cp_ring_group,
          .size = ctx.cp};
}

int64_t add_attention_core_forward(const BuildContext& ctx, LayerDag& dag, int64_t qkv) {
  const Pass f = Pass::kForward;
  if (ctx.cp == 1) {
    return add_after(dag, make_attention(ctx, "fwd.flash_attn", f, ctx.seq_shard), {qkv});
  }
  switch (ctx.parallel->cp_comm_type) {
    case CpCommType::kP2p:
      return add_ring_forward(ctx, dag, p2p_ring(ctx), qkv);
    case CpCommType::kAllGather:
      return add_cp_allgather_forward(ctx, dag, qkv);
    default:
      return add_cp_a2a_forward(ctx, dag, qkv);
  }
}

std::vector<int64_t> add_attention_core_backward(const BuildContext& ctx, LayerDag& dag,
                                                 int64_t proj_dgrad) {
  const Pass b = Pass::kBackward;
  if (ctx.cp == 1) {
    return {add_after(dag, make_attention(ctx, "bwd.flash_attn", b, ctx.seq_shard), {proj_dgrad})};
  }
  switch (ctx.parallel->cp_comm_type) {
    case CpCommType::kP2p:
      return add_ring_backward(ctx, dag, p2p_ring(ctx), proj_dgrad);
    case CpCommType::kAllGather:
      return add_cp_allgather_backward(ctx, dag, proj_dgrad);
    default:
      return add_cp_a2a_backward(ctx, dag, proj_dgrad);
  }
}

int64_t add_ring_forward(const BuildContext& ctx, LayerDag& dag, const RingSpec& ring,
                         int64_t block_source) {
  const Pass f = Pass::kForward;
  // Each exchange is added before the step it overlaps, so that the smallest-index-first
  // order issues the communication first, as Megatron does.
  std::vector<int64_t> steps;
  for (int64_t i = 0; i < ring.size; ++i) {
    int64_t next_source = block_source;
    if (i + 1 < ring.size) {
      next_source =
          add_after(dag, make_hop(ctx, ring, indexed("fwd.kv_sendrecv", i), f, ring.block_bytes),
                    {block_source});
    }
    std::vector<int64_t> after = {block_source};
    if (!steps.empty()) after.push_back(steps.back());
    steps.push_back(
        add_after(dag, make_attention(ctx, indexed("fwd.attn_step", i), f, ring.step), after));
    block_source = next_source;
  }
  return add_after(dag, make_merge(ctx, ring), steps);
}

std::vector<int64_t> add_ring_backward(const BuildContext& ctx, LayerDag& dag, const RingSpec& ring,
                                       int64_t start) {
  const Pass b = Pass::kBackward;
  const int64_t block = ring.block_bytes;
  auto exchange = [&](int64_t i, int64_t bytes, const std::vector<int64_t>& after) {
    return add_after(dag, make_hop(ctx, ring, indexed("bwd.kv_sendrecv", i), b, bytes), after);
  };
  int64_t sent = exchange(0, block, {start});
  int64_t step = add_after(dag, make_attention(ctx, "bwd.attn_step0", b, ring.step), {start});
  for (int64_t i = 1; i < ring.size; ++i) {
    const int64_t next_sent = exchange(i, i + 1 < ring.size ? 2 * block : block, {sent, step});
    step = add_after(dag, make_attention(ctx, indexed("bwd.attn_step", i), b, ring.step),
                     {sent, step});
    sent = next_sent;
  }
  // The finished dK, dV of the last block go home; dQ is complete after the last step.
  const int64_t home = exchange(ring.size, block, {sent, step});
  return {step, home};
}

}  // namespace dhelix::dag_detail
