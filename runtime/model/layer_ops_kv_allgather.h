#pragma once
// A layer's attention core under all-gather context parallelism (cp_comm_type allgather,
// lib/dag_builder_cp_a2a.cc): K and V all-gathered whole over the CP group, this rank's
// queries folded against every rank's block with the ring's kernels
// (runtime/cpu/ring_attention_cpu.h) in the ring's order, and dK, dV reduce-scattered.
//
// Failure rules: any backend with the ring's kernels (layer_ops_cp.h's
// RingAttentionBackend: the CPU's, CUDA's; host-tested on the recording device,
// tests/device/simulated_cp_allgather_run_test.cc); StageModel refuses CP on the others
// before anything runs (its constructor). The forward's online-softmax state is the layer's
// CP state's (B::RingState, made from the arena when the layer is bound: the CUDA backend
// allocates nothing while an iteration runs). With activation recompute the plan repeats
// fwd.kv_allgather and fwd.flash_attn (selective) or the whole forward (full) in the backward; the
// repeated ops write the recompute state's gathered blocks, output and lse, and read q and
// kv_local, which selective recompute keeps from the forward (stage_model_state.h).
//
// The blocks are the ring's: [K | V] of one CP rank's 2c local tokens (2·T·kv_width
// elements, K and V rotated at their global positions), rank j's block at j in the
// gathered buffer (group rank = CP rank).
//
//   op                      reads              writes
//   fwd.gemm_qkv            attn_in            q, kv_local ([K | V]), RoPE at global positions
//   fwd.kv_allgather        kv_local           kv_gathered (cp blocks)
//   fwd.flash_attn          q, kv_gathered     attn_out, lse: steps i = 0..cp-1 fold block
//                                              (r - i) mod cp, as the ring does: the same
//                                              bits as the ring's forward
//   bwd.kv_allgather        kv_local           kv_gathered_bwd (TE gathers again)
//   bwd.flash_attn          q, dO, lse, blocks dq (unscaled) and every block's dK, dV share
//                                              into dkv_shares (block j at j)
//   bwd.dkv_reducescatter   dkv_shares         dkv_mine = the sum over the CP ranks of their
//                                              share of this rank's block (group-rank
//                                              order); after it: scale, inverse RoPE, d_qkv
//
// Every sum has a fixed order, so --verify holds bitwise; against the ring the dK, dV sums
// run in another order (docs/kernels.md's tolerance).

#include <optional>
#include <string>

#include "runtime/model/layer_ops_cp.h"
#include "runtime/model/stage_model_internal.h"

namespace dhelix::rt::model_detail {

/// True for the ops an all-gather CP layer binds here.
inline bool is_kv_allgather_op(const std::string& op) {
  return op == "fwd.gemm_qkv" || op == "fwd.kv_allgather" || op == "fwd.flash_attn" ||
         op == "bwd.kv_allgather" || op == "bwd.flash_attn" || op == "bwd.dkv_reducescatter";
}

template <class B>
requires RingAttentionBackend<B> std::optional<BasicBoundOp<B>> bind_kv_allgather_op(
    const std::string& op, const LayerOpContext<B>& c, CpLayerState<B>& ring) {
  using Exec = typename B::Exec;
  using A = typename B::Act;
  const Dims d = c.dims;
  LayerState<B>& s = c.state;
  const int64_t kv = d.tokens * d.kv_width, block = 2 * kv, chunk = d.seq_shard / 2;
  if (op == "fwd.gemm_qkv") {
    return computation<B>([d, &s, kv, chunk, rope = &c.rope,
                           w = c.params.w_qkv.compute](const Exec& e) {
      B::linear_forward(e, d.tokens, d.hidden, d.qkv_width, s.attn_in, w, s.qkv);
      B::split_qkv(e, d.tokens, d.q_width, d.kv_width, s.qkv, s.q, s.kv_local, s.kv_local + kv);
      B::rope_forward_cp(e, *rope, d.micro_batch, d.cp, d.cp_rank, chunk, d.heads, s.q);
      B::rope_forward_cp(e, *rope, d.micro_batch, d.cp, d.cp_rank, chunk, d.kv_heads, s.kv_local);
    });
  }
  if (op == "fwd.kv_allgather") {
    return communication<B>(
        collective(CollectiveKind::kAllGather, s.kv_local, s.kv_gathered, block));
  }
  if (op == "bwd.kv_allgather") {
    return communication<B>(
        collective(CollectiveKind::kAllGather, s.kv_local, s.kv_gathered_bwd, block));
  }
  if (op == "fwd.flash_attn") {
    return computation<B>([d, &s, kv, block, state = &ring.forward](const Exec& e) {
      const kernels::AttentionShape shape = attention_shape(d);
      B::ring_forward_start(e, shape, *state);
      for (int64_t i = 0; i < d.cp; ++i) {
        const A* kv_block = s.kv_gathered + ring_step(d, i).block_rank * block;
        B::ring_forward_step(e, shape, ring_step(d, i), s.q, kv_block, kv_block + kv, *state);
      }
      B::ring_forward_finish(e, shape, *state, s.attn_out, s.lse);
    });
  }
  if (op == "bwd.flash_attn") {
    return computation<B>([d, &s, kv, block](const Exec& e) {
      const kernels::AttentionShape shape = attention_shape(d);
      B::zero_tensor(e, d.tokens * d.q_width, s.dq);
      B::zero_tensor(e, d.cp * block, s.dkv_shares);
      B::ring_backward_delta(e, shape, s.attn_out, s.d_attn_out, s.attn_delta);
      for (int64_t i = 0; i < d.cp; ++i) {
        const int64_t owner = ring_step(d, i).block_rank;
        const A* kv_block = s.kv_gathered_bwd + owner * block;
        A* share = s.dkv_shares + owner * block;
        B::ring_backward_step(e, shape, ring_step(d, i), s.q, s.d_attn_out, s.lse, s.attn_delta,
                              kv_block, kv_block + kv, s.dq, share, share + kv);
      }
    });
  }
  if (op == "bwd.dkv_reducescatter") {
    BasicBoundOp<B> bound = communication<B>(
        collective(CollectiveKind::kReduceScatter, s.dkv_shares, s.dkv_mine, block));
    bound.after_collective = [d, &s, kv, chunk, rope = &c.rope](const Exec& e) {
      const kernels::AttentionShape shape = attention_shape(d);
      A* dk = s.dkv_mine;
      B::ring_scale(e, shape, d.tokens * d.q_width, s.dq);
      B::ring_scale(e, shape, kv, dk);
      B::rope_backward_cp(e, *rope, d.micro_batch, d.cp, d.cp_rank, chunk, d.heads, s.dq);
      B::rope_backward_cp(e, *rope, d.micro_batch, d.cp, d.cp_rank, chunk, d.kv_heads, dk);
      B::merge_qkv(e, d.tokens, d.q_width, d.kv_width, s.dq, dk, dk + kv, s.d_qkv);
    };
    return bound;
  }
  return std::nullopt;
}

}  // namespace dhelix::rt::model_detail
