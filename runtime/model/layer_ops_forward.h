#pragma once
// A transformer layer's forward ops (ids and order: lib/dag_builder.cc):
//
//   x ─ ln_attn ─ [allgather_attn] ─ gemm_qkv ─ flash_attn ─ gemm_proj ─ [reduce_scatter_attn |
//   allreduce_attn] ─ bda_attn: h1 = x + attn ─ ln_mlp ─ [allgather_mlp] ─ gemm_fc1 ─ swiglu ─
//   gemm_fc2 ─ [reduce_scatter_mlp | allreduce_mlp] ─ bda_mlp: out = h1 + mlp
//
// flash_attn also splits the fused QKV output and applies RoPE to q and k (Megatron fuses
// RoPE into attention too); the rotated q and k are what the backward reads.

#include "runtime/model/stage_model_internal.h"

namespace dhelix::rt::model_detail {

// The comm op of `half` ("attn" or "mlp") that sums the row-parallel GEMM's partial output.
template <class B>
std::optional<BasicBoundOp<B>> bind_forward_reduction(const std::string& op, const Dims& d,
                                                      typename B::Act* partial,
                                                      typename B::Act* reduced) {
  if (d.sp && op.starts_with("fwd.reduce_scatter_")) {
    return communication<B>(scatter_rows(d, partial, reduced));
  }
  if (!d.sp && d.tp > 1 && op.starts_with("fwd.allreduce_")) {
    return communication<B>(reduce_in_place(d, partial));
  }
  throw_wrong_mode(op, d);
}

template <class B>
std::optional<BasicBoundOp<B>> bind_forward_attention(const std::string& op,
                                                      const LayerOpContext<B>& c) {
  const Dims d = c.dims;
  LayerState<B>& s = c.state;
  const LayerParameters<B>& p = c.params;
  if (op == "fwd.ln_attn") {
    return computation<B>([d, &s, gain = p.ln_attn.values](const typename B::Exec& e) {
      B::rmsnorm_forward(e, d.rows, d.hidden, s.x, gain, d.norm_eps, s.ln1_out, s.ln1_rstd);
    });
  }
  if (op == "fwd.allgather_attn") {
    if (!d.sp) throw_wrong_mode(op, d);
    return communication<B>(gather_rows(d, s.ln1_out, s.attn_in));
  }
  if (op == "fwd.gemm_qkv") {
    return computation<B>([d, &s, w = p.w_qkv.compute](const typename B::Exec& e) {
      B::linear_forward(e, d.tokens, d.hidden, d.qkv_width, s.attn_in, w, s.qkv);
    });
  }
  if (op == "fwd.flash_attn") {
    return computation<B>([d, &s, rope = &c.rope](const typename B::Exec& e) {
      B::split_qkv(e, d.tokens, d.q_width, d.kv_width, s.qkv, s.q, s.k, s.v);
      B::rope_forward(e, *rope, d.micro_batch, d.seq_shard, d.heads, 0, s.q);
      B::rope_forward(e, *rope, d.micro_batch, d.seq_shard, d.kv_heads, 0, s.k);
      B::attention_forward(e, attention_shape(d), s.q, s.k, s.v, s.attn_out, s.lse);
    });
  }
  if (op == "fwd.gemm_proj") {
    return computation<B>([d, &s, w = p.w_proj.compute](const typename B::Exec& e) {
      B::linear_forward(e, d.tokens, d.q_width, d.hidden, s.attn_out, w, s.proj_out);
    });
  }
  if (op == "fwd.reduce_scatter_attn" || op == "fwd.allreduce_attn") {
    return bind_forward_reduction<B>(op, d, s.proj_out, s.attn_branch);
  }
  if (op == "fwd.bda_attn") {
    return computation<B>([d, &s](const typename B::Exec& e) {
      B::add_tensors(e, d.residual_elements(), s.x, s.attn_branch, s.h1);
    });
  }
  return std::nullopt;
}

template <class B>
std::optional<BasicBoundOp<B>> bind_forward_mlp(const std::string& op, const LayerOpContext<B>& c) {
  const Dims d = c.dims;
  LayerState<B>& s = c.state;
  const LayerParameters<B>& p = c.params;
  if (op == "fwd.ln_mlp") {
    return computation<B>([d, &s, gain = p.ln_mlp.values](const typename B::Exec& e) {
      B::rmsnorm_forward(e, d.rows, d.hidden, s.h1, gain, d.norm_eps, s.ln2_out, s.ln2_rstd);
    });
  }
  if (op == "fwd.allgather_mlp") {
    if (!d.sp) throw_wrong_mode(op, d);
    return communication<B>(gather_rows(d, s.ln2_out, s.mlp_in));
  }
  if (op == "fwd.gemm_fc1") {
    return computation<B>([d, &s, w = p.w_fc1.compute](const typename B::Exec& e) {
      B::linear_forward(e, d.tokens, d.hidden, 2 * d.ffn, s.mlp_in, w, s.gate_up);
    });
  }
  if (op == "fwd.swiglu") {
    return computation<B>([d, &s](const typename B::Exec& e) {
      B::swiglu_forward(e, d.tokens, d.ffn, s.gate_up, s.act);
    });
  }
  if (op == "fwd.gemm_fc2") {
    return computation<B>([d, &s, w = p.w_fc2.compute](const typename B::Exec& e) {
      B::linear_forward(e, d.tokens, d.ffn, d.hidden, s.act, w, s.fc2_out);
    });
  }
  if (op == "fwd.reduce_scatter_mlp" || op == "fwd.allreduce_mlp") {
    return bind_forward_reduction<B>(op, d, s.fc2_out, s.mlp_branch);
  }
  if (op == "fwd.bda_mlp") {
    return computation<B>([d, &s](const typename B::Exec& e) {
      B::add_tensors(e, d.residual_elements(), s.h1, s.mlp_branch, s.out);
    });
  }
  return std::nullopt;
}

template <class B>
std::optional<BasicBoundOp<B>> bind_layer_forward(const std::string& op,
                                                  const LayerOpContext<B>& context) {
  if (std::optional<BasicBoundOp<B>> bound = bind_forward_attention(op, context)) return bound;
  return bind_forward_mlp(op, context);
}

}  // namespace dhelix::rt::model_detail
