#pragma once
// A transformer layer's backward ops, in the DAG's order (lib/dag_builder.cc):
//
//   dout ─ bda_mlp ─ [allgather_mlp] ─ fc2_dgrad ─ swiglu ─ fc1_dgrad ─ [reduce_scatter_mlp |
//   allreduce_mlp] ─ ln_mlp (+ dout) ─ bda_attn ─ [allgather_attn] ─ proj_dgrad ─ flash_attn ─
//   qkv_dgrad ─ [reduce_scatter_attn | allreduce_attn] ─ ln_attn (+ d_h1) ─ dx
//   wgrads (fc2, fc1, proj, qkv) hang off the gradient of their GEMM's output.
//
// A bias-dropout-add without bias or dropout passes its output gradient to both inputs
// unchanged, so the bda ops compute nothing: the residual gradient is added where the two
// paths meet, in the norm backward that opens each half (as the DAG's edges say). The
// backward gathers gather the residual gradient (rows of this rank) to all T rows before
// the row-parallel GEMM's dgrad; the forward's gathered GEMM inputs are reused, not
// re-gathered. Weight and gain gradients accumulate (+=) across micro-batches.

#include "runtime/model/stage_model_internal.h"

namespace dhelix::rt::model_detail {

// The comm op summing a column-parallel dgrad's partial input gradient.
template <class B>
BasicBoundOp<B> bind_backward_reduction(const std::string& op, const Dims& d,
                                        typename B::Act* partial, typename B::Act* reduced) {
  if (d.sp && op.starts_with("bwd.reduce_scatter_")) {
    return communication<B>(scatter_rows(d, partial, reduced));
  }
  if (!d.sp && d.tp > 1 && op.starts_with("bwd.allreduce_")) {
    return communication<B>(reduce_in_place(d, partial));
  }
  throw_wrong_mode(op, d);
}

template <class B>
BasicBoundOp<B> pass_through() {
  return computation<B>([](const typename B::Exec&) {});
}

template <class B>
std::optional<BasicBoundOp<B>> bind_backward_mlp(const std::string& op,
                                                 const LayerOpContext<B>& c) {
  const Dims d = c.dims;
  LayerState<B>& s = c.state;
  LayerParameters<B>& p = c.params;
  if (op == "bwd.bda_mlp") return pass_through<B>();
  if (op == "bwd.allgather_mlp") {
    if (!d.sp) throw_wrong_mode(op, d);
    return communication<B>(gather_rows(d, s.dout, s.d_mlp_full));
  }
  if (op == "bwd.fc2_dgrad") {
    return computation<B>([d, &s, w = p.w_fc2.compute](const typename B::Exec& e) {
      B::linear_dgrad(e, d.tokens, d.ffn, d.hidden, s.d_mlp_full, w, s.d_act);
    });
  }
  if (op == "bwd.fc2_wgrad") {
    return computation<B>([d, &s, dw = p.w_fc2.gradient](const typename B::Exec& e) {
      B::linear_wgrad_accumulate(e, d.tokens, d.ffn, d.hidden, s.d_mlp_full, s.act, dw);
    });
  }
  if (op == "bwd.swiglu") {
    return computation<B>([d, &s](const typename B::Exec& e) {
      B::swiglu_backward(e, d.tokens, d.ffn, s.gate_up, s.d_act, s.d_gate_up);
    });
  }
  if (op == "bwd.fc1_dgrad") {
    return computation<B>([d, &s, w = p.w_fc1.compute](const typename B::Exec& e) {
      B::linear_dgrad(e, d.tokens, d.hidden, 2 * d.ffn, s.d_gate_up, w, s.d_mlp_in);
    });
  }
  if (op == "bwd.fc1_wgrad") {
    return computation<B>([d, &s, dw = p.w_fc1.gradient](const typename B::Exec& e) {
      B::linear_wgrad_accumulate(e, d.tokens, d.hidden, 2 * d.ffn, s.d_gate_up, s.mlp_in, dw);
    });
  }
  if (op == "bwd.reduce_scatter_mlp" || op == "bwd.allreduce_mlp") {
    return bind_backward_reduction<B>(op, d, s.d_mlp_in, s.d_ln2_out);
  }
  if (op == "bwd.ln_mlp") {
    return computation<B>([d, &s, gain = p.ln_mlp.values,
                           dgain = p.ln_mlp.gradient](const typename B::Exec& e) {
      B::rmsnorm_backward(e, d.rows, d.hidden, s.h1, gain, s.ln2_rstd, s.d_ln2_out, s.d_h1, dgain);
      B::add_tensors(e, d.residual_elements(), s.d_h1, s.dout, s.d_h1);
    });
  }
  return std::nullopt;
}

template <class B>
std::optional<BasicBoundOp<B>> bind_backward_attention(const std::string& op,
                                                       const LayerOpContext<B>& c) {
  const Dims d = c.dims;
  LayerState<B>& s = c.state;
  LayerParameters<B>& p = c.params;
  if (op == "bwd.bda_attn") return pass_through<B>();
  if (op == "bwd.allgather_attn") {
    if (!d.sp) throw_wrong_mode(op, d);
    return communication<B>(gather_rows(d, s.d_h1, s.d_attn_full));
  }
  if (op == "bwd.proj_dgrad") {
    return computation<B>([d, &s, w = p.w_proj.compute](const typename B::Exec& e) {
      B::linear_dgrad(e, d.tokens, d.q_width, d.hidden, s.d_attn_full, w, s.d_attn_out);
    });
  }
  if (op == "bwd.proj_wgrad") {
    return computation<B>([d, &s, dw = p.w_proj.gradient](const typename B::Exec& e) {
      B::linear_wgrad_accumulate(e, d.tokens, d.q_width, d.hidden, s.d_attn_full, s.attn_out, dw);
    });
  }
  if (op == "bwd.flash_attn") {
    return computation<B>([d, &s, rope = &c.rope](const typename B::Exec& e) {
      B::attention_backward(e, attention_shape(d), s.q, s.k, s.v, s.attn_out, s.lse, s.d_attn_out,
                            s.dq, s.dk, s.dv, s.attn_delta);
      B::rope_backward(e, *rope, d.micro_batch, d.seq_shard, d.heads, 0, s.dq);
      B::rope_backward(e, *rope, d.micro_batch, d.seq_shard, d.kv_heads, 0, s.dk);
      B::merge_qkv(e, d.tokens, d.q_width, d.kv_width, s.dq, s.dk, s.dv, s.d_qkv);
    });
  }
  if (op == "bwd.qkv_dgrad") {
    return computation<B>([d, &s, w = p.w_qkv.compute](const typename B::Exec& e) {
      B::linear_dgrad(e, d.tokens, d.hidden, d.qkv_width, s.d_qkv, w, s.d_attn_in);
    });
  }
  if (op == "bwd.qkv_wgrad") {
    return computation<B>([d, &s, dw = p.w_qkv.gradient](const typename B::Exec& e) {
      B::linear_wgrad_accumulate(e, d.tokens, d.hidden, d.qkv_width, s.d_qkv, s.attn_in, dw);
    });
  }
  if (op == "bwd.reduce_scatter_attn" || op == "bwd.allreduce_attn") {
    return bind_backward_reduction<B>(op, d, s.d_attn_in, s.d_ln1_out);
  }
  if (op == "bwd.ln_attn") {
    return computation<B>(
        [d, &s, gain = p.ln_attn.values, dgain = p.ln_attn.gradient](const typename B::Exec& e) {
          B::rmsnorm_backward(e, d.rows, d.hidden, s.x, gain, s.ln1_rstd, s.d_ln1_out, s.dx, dgain);
          B::add_tensors(e, d.residual_elements(), s.dx, s.d_h1, s.dx);
        });
  }
  return std::nullopt;
}

template <class B>
std::optional<BasicBoundOp<B>> bind_layer_backward(const std::string& op,
                                                   const LayerOpContext<B>& context) {
  if (std::optional<BasicBoundOp<B>> bound = bind_backward_mlp(op, context)) return bound;
  return bind_backward_attention(op, context);
}

}  // namespace dhelix::rt::model_detail
