#pragma once
// A layer's attention core under context parallelism (cp >= 2): the plan's ring ops
// (lib/dag_builder_cp.cc) bound to the ring-attention math (runtime/cpu/ring_attention_cpu.h).
//
// Each CP rank holds chunks r and 2·cp - 1 - r of every sequence (the data loader cut them,
// runtime/train/context_split.h), so q, k, v are [batch, 2c, heads, d] of those tokens.
// fwd.gemm_qkv also splits its output and applies RoPE at the tokens' global positions
// (rope_forward_cp): under CP there is no fwd.flash_attn to do it, and both the first
// exchange and the first attention step read the rotated K. K and V of one rank travel as
// one block [K | V] of 2·T·kv_width elements.
//
// Forward, rank r (block b = the K/V of CP rank b; kv[i] is the block step i reads):
//
//   op                   reads            writes           notes
//   fwd.gemm_qkv         attn_in          q, kv[0]         GEMM, split, RoPE at global positions
//   fwd.kv_sendrecv<i>   kv[i]            kv[i+1]          i < cp-1; block r-i out, r-i-1 in
//   fwd.attn_step<i>     q, kv[i]         online state     block (r - i) mod cp; step 0 resets
//   fwd.attn_merge       online state     attn_out, lse    normalises; lse over all keys
//
// Backward, the dK/dV ring: the blocks travel again (the plan's bwd.kv_sendrecv ops carry
// them) and each block's dK, dV travel one hop behind it, summed by every rank they pass.
// share[i] is this rank's dK, dV of the block of step i; message i (of bwd exchange i) is
// [KV of the block for step i+1, when i < cp-1 | dKV of the block of step i-1, when i >= 1]:
//
//   op                   before the send                          after
//   bwd.attn_step0       -                                        delta; dq, share[0] (+=)
//   bwd.kv_sendrecv0     sends kv[0]                              recv[0] = KV for step 1
//   bwd.attn_step<i>     -                                        dq, share[i] (+=), KV of
//   recv[i-1] bwd.kv_sendrecv<i>   send[i] = [KV of recv[i-1] |             recv[i]
//                        dKV of recv[i-1] + share[i-1]]
//   bwd.kv_sendrecv<cp>  send[cp] = dKV of recv[cp-1] + share[cp-1]   recv[cp] = this rank's
//                                                                 full dK, dV; finish: scale
//                                                                 dq, dk, inverse RoPE, merge
//                                                                 into d_qkv
//
// The sum is made by the exchange, before it sends: it waits for step i-1 (its share) and
// exchange i-1 (the received partial), exactly the plan's edges, while step i runs beside
// it. dq is complete after the last step, dk and dv when they come home; the home
// exchange's closing step (on its stream, after the receive) writes d_qkv, which
// bwd.qkv_dgrad and bwd.qkv_wgrad (after both) read. cp = 2: exchange 0 carries KV,
// exchange 1 the dKV of step 0, exchange 2 brings the dKV home.
//
// Every sum runs in a fixed order (received partial + own share; steps in ring order), so
// a co-executed run is the same bits as the sequential one; against cp = 1 the folds
// differ, within docs/kernels.md's tolerance.
//
// A backend runs CP when it has the ring kernels (the RingAttentionBackend concept below):
// the CPU backend (runtime/cpu/ring_attention_cpu.h) and the CUDA backend
// (runtime/cuda/ring_attention_cuda.h, the same row walks on the GPU). B::RingState is the
// forward's online-softmax state, made when the layer is bound (B::make_ring_state), since
// the CUDA backend allocates nothing while an iteration runs.

#include <fmt/format.h>

#include <charconv>
#include <concepts>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/cpu/ring_attention_cpu.h"
#include "runtime/memory/buffer_spans.h"
#include "runtime/model/stage_model_internal.h"

namespace dhelix::rt::model_detail {

template <class B>
concept RingAttentionBackend = requires(const typename B::Exec& e, typename B::RingState& f,
                                        const RingStateAllocator& allocate,
                                        const kernels::AttentionShape& shape, typename B::Act* x) {
  { B::make_ring_state(allocate, shape) } -> std::same_as<typename B::RingState>;
  B::ring_forward_start(e, shape, f);
  B::ring_scale(e, shape, int64_t{1}, x);
  B::copy_tensor(e, int64_t{1}, x, x);
};

/// The CP ring ops' index: "fwd.attn_step3" -> 3 for stem "fwd.attn_step"; nullopt when
/// `op` is not the stem followed by a decimal number.
inline std::optional<int64_t> cp_op_index(std::string_view op, std::string_view stem) {
  if (!op.starts_with(stem) || op.size() == stem.size()) return std::nullopt;
  int64_t index = -1;
  const char* first = op.data() + stem.size();
  const char* last = op.data() + op.size();
  const auto [end, error] = std::from_chars(first, last, index);
  if (error != std::errc{} || end != last || index < 0) return std::nullopt;
  return index;
}

/// True for the op ids only a CP layer has.
inline bool is_cp_op(std::string_view op) {
  if (op == "fwd.attn_merge") return true;
  for (std::string_view stem :
       {"fwd.kv_sendrecv", "fwd.attn_step", "bwd.kv_sendrecv", "bwd.attn_step"}) {
    if (cp_op_index(op, stem)) return true;
  }
  return false;
}

/// One layer's ring buffers for one micro-batch (see the file comment).
template <class B>
struct CpLayerState {
  using A = typename B::Act;
  std::vector<A*> kv;             ///< [cp] forward: the block step i reads; kv[0] own
  typename B::RingState forward;  ///< online-softmax state across the forward steps
  std::vector<A*> send;           ///< [cp + 1] backward messages (send[0] unused: kv[0])
  std::vector<A*> recv;           ///< [cp + 1]
  std::vector<A*> share;          ///< [cp] this rank's dK (unscaled), dV of step i's block
  A* dq = nullptr;                ///< [T, q_width] unscaled, accumulated over the steps
  float* delta = nullptr;         ///< [batch, heads, 2c]
};

/// Elements of one K/V block ([K | V] of this rank's tokens).
inline int64_t cp_block(const Dims& d) { return 2 * d.tokens * d.kv_width; }
/// Whether backward message i carries a K/V block, and a dK/dV partial.
inline bool cp_carries_kv(const Dims& d, int64_t i) { return i + 1 < d.cp; }
inline bool cp_carries_dkv(int64_t i) { return i >= 1; }
inline int64_t cp_message(const Dims& d, int64_t i) {
  return cp_block(d) * ((cp_carries_kv(d, i) ? 1 : 0) + (cp_carries_dkv(i) ? 1 : 0));
}

/// Which of a CP layer state's buffers to make, and their spans
/// (runtime/memory/buffer_spans.h): the forward ring's (kv, the online state) and the
/// backward's (messages, shares, dq, delta). The own block kv[0] is not made when
/// !own_block (selective recompute shares the forward's), no block when !blocks (all-gather
/// CP, layer_ops_kv_allgather.h, which uses the online state only).
struct CpStateParts {
  bool forward = true;
  bool blocks = true;
  bool own_block = true;
  SpanKind own_block_span = SpanKind::kLayerSaved;
  SpanKind forward_span = SpanKind::kAttentionForward;
  bool backward = true;
};

/// `allocate.template allocate<T>(span kind, name, count)` gives each buffer
/// (stage_model_state.h's LayerAllocator).
template <class B, class Allocator>
std::unique_ptr<CpLayerState<B>> make_cp_state(Allocator& allocate, const Dims& d,
                                               const CpStateParts& parts) {
  using A = typename B::Act;
  auto s = std::make_unique<CpLayerState<B>>();
  if (parts.forward) {
    s->kv.assign(static_cast<size_t>(d.cp), nullptr);
    for (int64_t i = 0; i < d.cp; ++i) {
      if (!parts.blocks || (i == 0 && !parts.own_block)) continue;
      s->kv[static_cast<size_t>(i)] =
          allocate.template allocate<A>(i == 0 ? parts.own_block_span : parts.forward_span,
                                        fmt::format("cp.kv{}", i), cp_block(d));
    }
    s->forward = B::make_ring_state(
        [&](std::string_view name, int64_t count) {
          return allocate.template allocate<float>(parts.forward_span, "cp." + std::string(name),
                                                   count);
        },
        attention_shape(d));
  }
  if (!parts.backward) return s;
  const SpanKind back = SpanKind::kAttentionBackward;
  for (int64_t i = 0; i < d.cp; ++i) {
    s->share.push_back(
        allocate.template allocate<A>(back, fmt::format("cp.share{}", i), cp_block(d)));
  }
  for (int64_t i = 0; i <= d.cp; ++i) {
    const int64_t count = cp_message(d, i);
    s->send.push_back(
        i == 0 ? nullptr : allocate.template allocate<A>(back, fmt::format("cp.send{}", i), count));
    s->recv.push_back(allocate.template allocate<A>(back, fmt::format("cp.recv{}", i), count));
  }
  s->dq = allocate.template allocate<A>(back, "cp.dq", d.tokens * d.q_width);
  s->delta =
      allocate.template allocate<float>(back, "cp.delta", d.micro_batch * d.heads * d.seq_shard);
  return s;
}

/// What a CP op's binder needs besides the layer's context.
template <class B>
struct CpOpContext {
  const LayerOpContext<B>& layer;
  CpLayerState<B>& ring;
};

inline cpu::RingStep ring_step(const Dims& d, int64_t i) {
  return {.cp = d.cp,
          .rank = d.cp_rank,
          .block_rank = (d.cp_rank - i % d.cp + d.cp) % d.cp,
          .chunk = d.seq_shard / 2};
}

template <class B>
BasicBoundOp<B> ring_exchange(const typename B::Act* send, typename B::Act* recv, int64_t count) {
  return communication<B>(collective(CollectiveKind::kRingExchange, send, recv, count));
}

template <class B>
std::optional<BasicBoundOp<B>> bind_cp_forward(const std::string& op, const CpOpContext<B>& c) {
  const Dims d = c.layer.dims;
  LayerState<B>& s = c.layer.state;
  CpLayerState<B>& r = c.ring;
  const int64_t kv_elements = d.tokens * d.kv_width;
  if (op == "fwd.gemm_qkv") {
    return computation<B>([d, &s, &r, kv_elements, rope = &c.layer.rope,
                           w = c.layer.params.w_qkv.compute](const typename B::Exec& e) {
      B::linear_forward(e, d.tokens, d.hidden, d.qkv_width, s.attn_in, w, s.qkv);
      B::split_qkv(e, d.tokens, d.q_width, d.kv_width, s.qkv, s.q, r.kv[0], r.kv[0] + kv_elements);
      const int64_t chunk = d.seq_shard / 2;
      B::rope_forward_cp(e, *rope, d.micro_batch, d.cp, d.cp_rank, chunk, d.heads, s.q);
      B::rope_forward_cp(e, *rope, d.micro_batch, d.cp, d.cp_rank, chunk, d.kv_heads, r.kv[0]);
    });
  }
  if (const auto i = cp_op_index(op, "fwd.kv_sendrecv"); i && *i + 1 < d.cp) {
    return ring_exchange<B>(r.kv[*i], r.kv[*i + 1], cp_block(d));
  }
  if (const auto i = cp_op_index(op, "fwd.attn_step"); i && *i < d.cp) {
    return computation<B>([d, &s, &r, i = *i, kv_elements](const typename B::Exec& e) {
      const kernels::AttentionShape shape = attention_shape(d);
      if (i == 0) B::ring_forward_start(e, shape, r.forward);
      B::ring_forward_step(e, shape, ring_step(d, i), s.q, r.kv[i], r.kv[i] + kv_elements,
                           r.forward);
    });
  }
  if (op == "fwd.attn_merge") {
    return computation<B>([d, &s, &r](const typename B::Exec& e) {
      B::ring_forward_finish(e, attention_shape(d), r.forward, s.attn_out, s.lse);
    });
  }
  return std::nullopt;
}

// The home exchange's closing step: dq and the returned dk scaled, rotated back, merged.
template <class B>
void finish_cp_backward(const typename B::Exec& e, const Dims& d, LayerState<B>& s,
                        CpLayerState<B>& r, const typename B::Rope& rope) {
  const kernels::AttentionShape shape = attention_shape(d);
  const int64_t kv_elements = d.tokens * d.kv_width, chunk = d.seq_shard / 2;
  typename B::Act* dk = r.recv[static_cast<size_t>(d.cp)];
  typename B::Act* dv = dk + kv_elements;
  B::ring_scale(e, shape, d.tokens * d.q_width, r.dq);
  B::ring_scale(e, shape, kv_elements, dk);
  B::rope_backward_cp(e, rope, d.micro_batch, d.cp, d.cp_rank, chunk, d.heads, r.dq);
  B::rope_backward_cp(e, rope, d.micro_batch, d.cp, d.cp_rank, chunk, d.kv_heads, dk);
  B::merge_qkv(e, d.tokens, d.q_width, d.kv_width, r.dq, dk, dv, s.d_qkv);
}

template <class B>
BasicBoundOp<B> bind_cp_backward_exchange(int64_t i, const CpOpContext<B>& c) {
  const Dims d = c.layer.dims;
  CpLayerState<B>& r = c.ring;
  if (i == 0) return ring_exchange<B>(r.kv[0], r.recv[0], cp_message(d, 0));
  const auto at = [](std::vector<typename B::Act*>& v, int64_t k) {
    return v[static_cast<size_t>(k)];
  };
  BasicBoundOp<B> bound = ring_exchange<B>(at(r.send, i), at(r.recv, i), cp_message(d, i));
  bound.before_collective = [d, &r, i, at](const typename B::Exec& e) {
    const int64_t block = cp_block(d);
    typename B::Act* out = at(r.send, i);
    typename B::Act* previous = at(r.recv, i - 1);  // [KV for step i | dKV partial]
    if (cp_carries_kv(d, i)) {
      B::copy_tensor(e, block, previous, out);
      out += block;
    }
    typename B::Act* share = at(r.share, i - 1);
    if (cp_carries_dkv(i - 1)) {
      B::add_tensors(e, block, previous + (cp_carries_kv(d, i - 1) ? block : 0), share, out);
    } else {
      B::copy_tensor(e, block, share, out);
    }
  };
  if (i == d.cp) {
    bound.after_collective = [d, &s = c.layer.state, &r,
                              rope = &c.layer.rope](const typename B::Exec& e) {
      finish_cp_backward<B>(e, d, s, r, *rope);
    };
  }
  return bound;
}

template <class B>
std::optional<BasicBoundOp<B>> bind_cp_backward(const std::string& op, const CpOpContext<B>& c) {
  const Dims d = c.layer.dims;
  if (const auto i = cp_op_index(op, "bwd.kv_sendrecv"); i && *i <= d.cp) {
    return bind_cp_backward_exchange(*i, c);
  }
  if (const auto i = cp_op_index(op, "bwd.attn_step"); i && *i < d.cp) {
    return computation<B>([d, &s = c.layer.state, &r = c.ring, i = *i](const typename B::Exec& e) {
      const kernels::AttentionShape shape = attention_shape(d);
      const int64_t kv_elements = d.tokens * d.kv_width, block = cp_block(d);
      if (i == 0) {
        B::zero_tensor(e, d.tokens * d.q_width, r.dq);
        B::ring_backward_delta(e, shape, s.attn_out, s.d_attn_out, r.delta);
      }
      // Step i's block: this rank's own, or the one exchange i-1 brought.
      const typename B::Act* kv = i == 0 ? r.kv[0] : r.recv[static_cast<size_t>(i - 1)];
      typename B::Act* share = r.share[static_cast<size_t>(i)];
      B::zero_tensor(e, block, share);
      B::ring_backward_step(e, shape, ring_step(d, i), s.q, s.d_attn_out, s.lse, r.delta, kv,
                            kv + kv_elements, r.dq, share, share + kv_elements);
    });
  }
  return std::nullopt;
}

/// Binds a CP layer op, or fwd.gemm_qkv of a CP layer; nullopt for another op or an index
/// beyond the ring. Only for backends with the ring kernels.
template <class B>
std::optional<BasicBoundOp<B>> bind_cp_op(const std::string& op, const CpOpContext<B>& c) {
  if (op.starts_with("fwd.")) return bind_cp_forward(op, c);
  return bind_cp_backward(op, c);
}

}  // namespace dhelix::rt::model_detail
