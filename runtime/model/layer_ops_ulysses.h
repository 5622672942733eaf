#pragma once
// A layer's attention core under Ulysses context parallelism (cp_comm_type a2a,
// lib/dag_builder_cp_a2a.cc): the plan's all-to-all ops bound to the CP group's
// all_to_all_v and to the cp = 1 attention kernels over the whole sequence on heads/cp.
//
// Failure rules: a2a runs on every backend with B::copy_strided (the packing below is
// strided copies: loops on the CPU, cudaMemcpy2DAsync on CUDA, host-tested on the recording
// device, tests/device/simulated_cp_a2a_run_test.cc) and the cp = 1 attention; a2a+p2p on
// every backend with the ring's kernels as well (tests/device/
// simulated_cp_hierarchical_run_test.cc); StageModel refuses CP on the others before
// anything runs (its constructor). With activation recompute
// the plan repeats the all-to-alls (bwd.recompute.qkv_a2a, .flash_attn, .out_a2a:
// lib/dag_builder_recompute.cc); bind gives them the recompute state, whose q, k, v, blocks and
// head-split output are its own (stage_model_state.h's recompute_state).
//
// Each CP rank holds chunks r and 2·cp − 1 − r of every sequence (c = seq_shard / 2 tokens
// each, runtime/train/context_split.h), so its T = batch · 2c local tokens are
// [batch, 2c]; local token p of a sequence is at global position r·c + p (p < c) or
// (2·cp − 1 − r)·c + p − c. Group rank j of the CP communicator is CP rank j. Rank r's
// head group j is its TP rank's heads [j·H/cp, (j+1)·H/cp) of each kind (H = heads or
// kv_heads of the TP rank).
//
//   op              before the all-to-all (send block j)      after (block j received)
//   fwd.qkv_a2a     my T tokens' q|k|v of head group j         rank j's T tokens of my heads,
//                                                              into q, k, v [b, S, H/cp, d]
//                                                              at their global positions
//   fwd.flash_attn  RoPE at positions 0..S−1, causal attention over S on H/cp heads:
//                   attn_out_heads [b, S, q/cp], lse
//   fwd.out_a2a     rank j's tokens' rows of attn_out_heads    my tokens' O of j's heads,
//                                                              into attn_out columns of j
//   bwd.dout_a2a    my tokens' dO columns of head group j      into d_out_heads (global order)
//   bwd.flash_attn  attention backward on the head split, inverse RoPE: dq, dk, dv
//   bwd.dqkv_a2a    rank j's tokens' dq|dk|dv rows             my tokens' gradients of j's
//                                                              heads, into d_qkv
//
// Every block is T·w/cp elements (w = qkv_width or q_width), so the counts are fixed.
// The packing moves values without arithmetic and the attention is the cp = 1 kernel, so
// a co-executed run is the same bits as the sequential one; against the ring the softmax
// folds differ (docs/kernels.md's tolerance).

#include <functional>
#include <string>
#include <vector>

#include "runtime/model/layer_ops_cp.h"
#include "runtime/model/stage_model_internal.h"

namespace dhelix::rt::model_detail {

/// True for the op ids only a Ulysses layer has, and its own attention ops.
inline bool is_ulysses_op(const std::string& op) {
  return op == "fwd.qkv_a2a" || op == "fwd.out_a2a" || op == "bwd.dout_a2a" ||
         op == "bwd.dqkv_a2a" || op == "fwd.flash_attn" || op == "bwd.flash_attn";
}

/// Where CP rank `member`'s local token `p` (0 <= p < 2c) of a sequence sits in it.
inline int64_t ulysses_position(const Dims& d, int64_t member, int64_t p) {
  const int64_t c = d.seq_shard / 2;
  return p < c ? member * c + p : (2 * d.cp - 1 - member) * c + p - c;
}

/// Where an all-to-all's rows go: `members` ranks (cp for a2a, A for a2a+p2p), a head split
/// of `seq` tokens per sequence. a2a: the whole sequence in order (ulysses_position).
/// a2a+p2p: sub-group g of A adjacent CP ranks holds chunks gA..gA+A-1 and their mirrors,
/// which are the two chunks of A·c tokens rank g of a P = cp / A ring holds under the same
/// load balancing; member a's early chunk goes to a·c, its late one to (2A − 1 − a)·c.
struct A2aLayout {
  int64_t members = 1;
  int64_t seq = 0;
  bool hierarchical = false;
  int64_t position(const Dims& d, int64_t member, int64_t p) const {
    if (!hierarchical) return ulysses_position(d, member, p);
    const int64_t c = d.seq_shard / 2;
    return p < c ? member * c + p : (2 * members - 1 - member) * c + p - c;
  }
};
inline A2aLayout ulysses_layout(const Dims& d) { return {d.cp, d.seq_shard * d.cp, false}; }
inline A2aLayout hierarchical_layout(const Dims& d) {
  return {d.cp_a2a, d.seq_shard * d.cp_a2a, true};
}

/// The head-split attention: the whole sequence on heads/cp of each kind.
inline kernels::AttentionShape ulysses_attention_shape(const Dims& d) {
  return kernels::AttentionShape{d.micro_batch, d.seq_shard * d.cp, d.heads / d.cp,
                                 d.kv_heads / d.cp, d.head_dim};
}

// One column range of a row-major tensor: `width` columns from `offset` of rows `stride`
// wide.
struct Columns {
  int64_t stride = 0, offset = 0, width = 0;
};

// One tensor's column range in a packing: the tensor (a [rows, stride] row-major buffer)
// and its columns.
template <class B>
using Packed = std::vector<std::pair<const typename B::Act*, Columns>>;

// Copies the rows of `from` for `member`'s tokens into `to`: to_local = true takes rows of
// a [b, S, ...] tensor at the member's global positions into a [b, 2c, ...] block; false
// puts a block back at those positions. One Columns per tensor (q | k | v packed side by
// side in the block). A member's chunk of c tokens is contiguous in both, so each (sequence,
// chunk, tensor) is one strided copy of c rows (B::copy_strided: a loop on the CPU, one
// cudaMemcpy2DAsync on CUDA).
template <class B>
void move_member_rows(const typename B::Exec& e, const Dims& d, const A2aLayout& layout,
                      int64_t member, bool to_local, const Packed<B>& sources,
                      typename B::Act* block, int64_t block_width) {
  using A = typename B::Act;
  const int64_t c = d.seq_shard / 2;
  for (int64_t b = 0; b < d.micro_batch; ++b) {
    for (int64_t p = 0; p < d.seq_shard; p += c) {
      const int64_t global = b * layout.seq + layout.position(d, member, p);
      A* rows = block + (b * d.seq_shard + p) * block_width;
      int64_t at = 0;
      for (const auto& [tensor, cols] : sources) {
        A* t = const_cast<A*>(tensor) + global * cols.stride + cols.offset;
        if (to_local) {
          B::copy_strided(e, c, cols.width, t, cols.stride, rows + at, block_width);
        } else {
          B::copy_strided(e, c, cols.width, rows + at, block_width, t, cols.stride);
        }
        at += cols.width;
      }
    }
  }
}

// Splits (to_blocks) or joins this rank's [T, ...] tensors by head group: block j holds
// group j (width / cp columns from offset + j·width/cp) of every column range, side by
// side, for all T local tokens: one strided copy of T rows per (group, tensor).
template <class B>
void move_head_groups(const typename B::Exec& e, const Dims& d, int64_t groups, bool to_blocks,
                      const Packed<B>& tensors, typename B::Act* blocks) {
  using A = typename B::Act;
  int64_t block_width = 0;
  for (const auto& [tensor, cols] : tensors) block_width += cols.width / groups;
  for (int64_t j = 0; j < groups; ++j) {
    A* block = blocks + j * d.tokens * block_width;
    int64_t at = 0;
    for (const auto& [tensor, cols] : tensors) {
      const int64_t group = cols.width / groups;
      A* columns = const_cast<A*>(tensor) + cols.offset + j * group;
      if (to_blocks) {
        B::copy_strided(e, d.tokens, group, columns, cols.stride, block + at, block_width);
      } else {
        B::copy_strided(e, d.tokens, group, block + at, block_width, columns, cols.stride);
      }
      at += group;
    }
  }
}

/// The counts of one all-to-all of equal blocks: 2·members int64 the collective reads
/// (send: `block` each) and writes (receive), made by the model outside the activation arena
/// when the op is bound (device memory on CUDA, whose all-to-all takes device counts).
using AllToAllCounts = std::function<int64_t*(int64_t members, int64_t block)>;

template <class B>
BasicBoundOp<B> ulysses_all_to_all(const Dims& d, int64_t members, const AllToAllCounts& counts,
                                   const typename B::Act* send, typename B::Act* recv,
                                   int64_t width, typename BasicBoundOp<B>::Task before,
                                   typename BasicBoundOp<B>::Task after) {
  // Fixed counts: T·width/members elements to and from every member.
  int64_t* c = counts(members, d.tokens * width / members);
  CollectiveRequest request = collective(CollectiveKind::kAllToAllV, send, recv, d.tokens * width);
  request.send_counts = c;
  request.recv_counts = c + members;
  BasicBoundOp<B> op = communication<B>(request);
  op.before_collective = std::move(before);
  op.after_collective = std::move(after);
  return op;
}

template <class B>
std::optional<BasicBoundOp<B>> bind_ulysses_op(const std::string& op, const LayerOpContext<B>& c,
                                               const AllToAllCounts& counts) {
  using Exec = typename B::Exec;
  using A = typename B::Act;
  const Dims d = c.dims;
  LayerState<B>& s = c.state;
  const int64_t q = d.q_width, kv = d.kv_width, qg = q / d.cp, kg = kv / d.cp;
  const int64_t qkv_group = d.qkv_width / d.cp;
  const A2aLayout layout = ulysses_layout(d);
  // The fused [q | k | v] rows of qkv and d_qkv as three column ranges.
  const int64_t w = d.qkv_width;
  const auto fused = [w, q, kv](const A* t) {
    return Packed<B>{{t, {w, 0, q}}, {t, {w, q, kv}}, {t, {w, q + kv, kv}}};
  };
  if (op == "fwd.qkv_a2a") {
    return ulysses_all_to_all<B>(
        d, d.cp, counts, s.a2a_send, s.a2a_recv, w,
        [d, &s, fused](const Exec& e) {
          move_head_groups<B>(e, d, d.cp, true, fused(s.qkv), s.a2a_send);
        },
        [d, &s, qg, kg, qkv_group, layout](const Exec& e) {
          for (int64_t j = 0; j < d.cp; ++j) {
            move_member_rows<B>(e, d, layout, j, false,
                                {{s.q, {qg, 0, qg}}, {s.k, {kg, 0, kg}}, {s.v, {kg, 0, kg}}},
                                s.a2a_recv + j * d.tokens * qkv_group, qkv_group);
          }
        });
  }
  if (op == "fwd.flash_attn") {
    return computation<B>([d, &s, rope = &c.rope](const Exec& e) {
      const kernels::AttentionShape shape = ulysses_attention_shape(d);
      B::rope_forward(e, *rope, d.micro_batch, shape.seq, shape.heads, 0, s.q);
      B::rope_forward(e, *rope, d.micro_batch, shape.seq, shape.kv_heads, 0, s.k);
      B::attention_forward(e, shape, s.q, s.k, s.v, s.attn_out_heads, s.lse);
    });
  }
  if (op == "fwd.out_a2a") {
    return ulysses_all_to_all<B>(
        d, d.cp, counts, s.a2a_send, s.a2a_recv, q,
        [d, &s, qg, layout](const Exec& e) {
          for (int64_t j = 0; j < d.cp; ++j) {
            move_member_rows<B>(e, d, layout, j, true, {{s.attn_out_heads, {qg, 0, qg}}},
                                s.a2a_send + j * d.tokens * qg, qg);
          }
        },
        [d, &s, q](const Exec& e) {
          move_head_groups<B>(e, d, d.cp, false, {{s.attn_out, {q, 0, q}}}, s.a2a_recv);
        });
  }
  if (op == "bwd.dout_a2a") {
    return ulysses_all_to_all<B>(
        d, d.cp, counts, s.a2a_send_bwd, s.a2a_recv_bwd, q,
        [d, &s, q](const Exec& e) {
          move_head_groups<B>(e, d, d.cp, true, {{s.d_attn_out, {q, 0, q}}}, s.a2a_send_bwd);
        },
        [d, &s, qg, layout](const Exec& e) {
          for (int64_t j = 0; j < d.cp; ++j) {
            move_member_rows<B>(e, d, layout, j, false, {{s.d_out_heads, {qg, 0, qg}}},
                                s.a2a_recv_bwd + j * d.tokens * qg, qg);
          }
        });
  }
  if (op == "bwd.flash_attn") {
    return computation<B>([d, &s, rope = &c.rope](const Exec& e) {
      const kernels::AttentionShape shape = ulysses_attention_shape(d);
      B::attention_backward(e, shape, s.q, s.k, s.v, s.attn_out_heads, s.lse, s.d_out_heads, s.dq,
                            s.dk, s.dv, s.attn_delta);
      B::rope_backward(e, *rope, d.micro_batch, shape.seq, shape.heads, 0, s.dq);
      B::rope_backward(e, *rope, d.micro_batch, shape.seq, shape.kv_heads, 0, s.dk);
    });
  }
  if (op == "bwd.dqkv_a2a") {
    return ulysses_all_to_all<B>(
        d, d.cp, counts, s.a2a_send_bwd, s.a2a_recv_bwd, d.qkv_width,
        [d, &s, qg, kg, qkv_group, layout](const Exec& e) {
          for (int64_t j = 0; j < d.cp; ++j) {
            move_member_rows<B>(e, d, layout, j, true,
                                {{s.dq, {qg, 0, qg}}, {s.dk, {kg, 0, kg}}, {s.dv, {kg, 0, kg}}},
                                s.a2a_send_bwd + j * d.tokens * qkv_group, qkv_group);
          }
        },
        [d, &s, fused](const Exec& e) {
          move_head_groups<B>(e, d, d.cp, false, fused(s.d_qkv), s.a2a_recv_bwd);
        });
  }
  return std::nullopt;
}

/// a2a+p2p's own ops (the ring's are layer_ops_cp.h's, bound on the ring's view).
inline bool is_hierarchical_a2a_op(const std::string& op) {
  return op == "fwd.qkv_a2a" || op == "fwd.out_a2a" || op == "bwd.dout_a2a" || op == "bwd.dqkv_a2a";
}

/// a2a+p2p (see hierarchical_layout): the all-to-alls over the sub-group of A = cp_a2a
/// ranks. fwd.qkv_a2a leaves q and the ring's own K/V block (ring.kv[0]) in the ring's
/// layout (`rd`: cp / A ranks, A·T tokens, heads / A), rotated at their global positions;
/// the ring (layer_ops_cp.h on the layer's view) writes the head-split output, dO's
/// all-to-all feeds its backward, whose d_qkv (the view's, dqkv_heads) goes back.
template <class B>
requires RingAttentionBackend<B> std::optional<BasicBoundOp<B>> bind_hierarchical_a2a_op(
    const std::string& op, const LayerOpContext<B>& c, const Dims& rd, CpLayerState<B>& ring,
    const AllToAllCounts& counts) {
  using Exec = typename B::Exec;
  using A = typename B::Act;
  const Dims d = c.dims;
  LayerState<B>& s = c.state;
  const A2aLayout layout = hierarchical_layout(d);
  const int64_t n = layout.members, q = d.q_width, kv = d.kv_width, w = d.qkv_width;
  const int64_t qg = q / n, kg = kv / n, wg = w / n;
  const auto fused = [w, q, kv](const A* t) {
    return Packed<B>{{t, {w, 0, q}}, {t, {w, q, kv}}, {t, {w, q + kv, kv}}};
  };
  if (op == "fwd.qkv_a2a") {
    return ulysses_all_to_all<B>(
        d, n, counts, s.a2a_send, s.a2a_recv, w,
        [d, n, &s, fused](const Exec& e) {
          move_head_groups<B>(e, d, n, true, fused(s.qkv), s.a2a_send);
        },
        [d, rd, n, &s, &ring, qg, kg, wg, layout, rope = &c.rope](const Exec& e) {
          A* k = ring.kv[0];
          A* v = k + rd.tokens * rd.kv_width;
          for (int64_t j = 0; j < n; ++j) {
            move_member_rows<B>(e, d, layout, j, false,
                                {{s.q, {qg, 0, qg}}, {k, {kg, 0, kg}}, {v, {kg, 0, kg}}},
                                s.a2a_recv + j * d.tokens * wg, wg);
          }
          const int64_t chunk = rd.seq_shard / 2;
          B::rope_forward_cp(e, *rope, rd.micro_batch, rd.cp, rd.cp_rank, chunk, rd.heads, s.q);
          B::rope_forward_cp(e, *rope, rd.micro_batch, rd.cp, rd.cp_rank, chunk, rd.kv_heads, k);
        });
  }
  if (op == "fwd.out_a2a") {
    return ulysses_all_to_all<B>(
        d, n, counts, s.a2a_send, s.a2a_recv, q,
        [d, n, &s, qg, layout](const Exec& e) {
          for (int64_t j = 0; j < n; ++j) {
            move_member_rows<B>(e, d, layout, j, true, {{s.attn_out_heads, {qg, 0, qg}}},
                                s.a2a_send + j * d.tokens * qg, qg);
          }
        },
        [d, n, &s, q](const Exec& e) {
          move_head_groups<B>(e, d, n, false, {{s.attn_out, {q, 0, q}}}, s.a2a_recv);
        });
  }
  if (op == "bwd.dout_a2a") {
    return ulysses_all_to_all<B>(
        d, n, counts, s.a2a_send_bwd, s.a2a_recv_bwd, q,
        [d, n, &s, q](const Exec& e) {
          move_head_groups<B>(e, d, n, true, {{s.d_attn_out, {q, 0, q}}}, s.a2a_send_bwd);
        },
        [d, n, &s, qg, layout](const Exec& e) {
          for (int64_t j = 0; j < n; ++j) {
            move_member_rows<B>(e, d, layout, j, false, {{s.d_out_heads, {qg, 0, qg}}},
                                s.a2a_recv_bwd + j * d.tokens * qg, qg);
          }
        });
  }
  if (op == "bwd.dqkv_a2a") {
    return ulysses_all_to_all<B>(
        d, n, counts, s.a2a_send_bwd, s.a2a_recv_bwd, w,
        [d, n, &s, wg, layout](const Exec& e) {
          for (int64_t j = 0; j < n; ++j) {
            move_member_rows<B>(e, d, layout, j, true, {{s.dqkv_heads, {wg, 0, wg}}},
                                s.a2a_send_bwd + j * d.tokens * wg, wg);
          }
        },
        [d, n, &s, fused](const Exec& e) {
          move_head_groups<B>(e, d, n, false, fused(s.d_qkv), s.a2a_recv_bwd);
        });
  }
  return std::nullopt;
}

}  // namespace dhelix::rt::model_detail
