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
namespace {

kernels::AttentionShape attention_shape(const Dims& d) {
  return kernels::AttentionShape{d.batch, d.seq, d.heads, d.kv_heads, d.head_dim};
}

// The comm op summing a column-parallel dgrad's partial input gradient.
BoundOp bind_backward_reduction(const std::string& op, const Dims& d, float* partial,
                                float* reduced) {
  if (d.sp && op.starts_with("bwd.reduce_scatter_")) {
    return communication(scatter_rows(d, partial, reduced));
  }
  if (!d.sp && d.tp > 1 && op.starts_with("bwd.allreduce_")) {
    return communication(reduce_in_place(d, partial));
  }
  throw_wrong_mode(op, d);
}

BoundOp pass_through() {
  return computation([] {});
}

std::optional<BoundOp> bind_mlp_half(const std::string& op, const LayerOpContext& c) {
  const Dims d = c.dims;
  LayerState& s = c.state;
  LayerParameters& p = c.params;
  if (op == "bwd.bda_mlp") return pass_through();
  if (op == "bwd.allgather_mlp") {
    if (!d.sp) throw_wrong_mode(op, d);
    return communication(gather_rows(d, s.dout, s.d_mlp_full));
  }
  if (op == "bwd.fc2_dgrad") {
    return computation([d, &s, w = p.w_fc2.values.data()] {
      cpu::linear_dgrad(d.tokens, d.ffn, d.hidden, s.d_mlp_full, w, s.d_act);
    });
  }
  if (op == "bwd.fc2_wgrad") {
    return computation([d, &s, dw = p.w_fc2.gradient.data()] {
      cpu::linear_wgrad_accumulate(d.tokens, d.ffn, d.hidden, s.d_mlp_full, s.act, dw);
    });
  }
  if (op == "bwd.swiglu") {
    return computation(
        [d, &s] { cpu::swiglu_backward(d.tokens, d.ffn, s.gate_up, s.d_act, s.d_gate_up); });
  }
  if (op == "bwd.fc1_dgrad") {
    return computation([d, &s, w = p.w_fc1.values.data()] {
      cpu::linear_dgrad(d.tokens, d.hidden, 2 * d.ffn, s.d_gate_up, w, s.d_mlp_in);
    });
  }
  if (op == "bwd.fc1_wgrad") {
    return computation([d, &s, dw = p.w_fc1.gradient.data()] {
      cpu::linear_wgrad_accumulate(d.tokens, d.hidden, 2 * d.ffn, s.d_gate_up, s.mlp_in, dw);
    });
  }
  if (op == "bwd.reduce_scatter_mlp" || op == "bwd.allreduce_mlp") {
    return bind_backward_reduction(op, d, s.d_mlp_in, s.d_ln2_out);
  }
  if (op == "bwd.ln_mlp") {
    return computation([d, &s, gain = p.ln_mlp.values.data(), dgain = p.ln_mlp.gradient.data()] {
      cpu::rmsnorm_backward(d.rows, d.hidden, s.h1, gain, s.ln2_rstd, s.d_ln2_out, s.d_h1, dgain);
      cpu::add_tensors(d.residual_elements(), s.d_h1, s.dout, s.d_h1);
    });
  }
  return std::nullopt;
}

std::optional<BoundOp> bind_attention_half(const std::string& op, const LayerOpContext& c) {
  const Dims d = c.dims;
  LayerState& s = c.state;
  LayerParameters& p = c.params;
  if (op == "bwd.bda_attn") return pass_through();
  if (op == "bwd.allgather_attn") {
    if (!d.sp) throw_wrong_mode(op, d);
    return communication(gather_rows(d, s.d_h1, s.d_attn_full));
  }
  if (op == "bwd.proj_dgrad") {
    return computation([d, &s, w = p.w_proj.values.data()] {
      cpu::linear_dgrad(d.tokens, d.q_width, d.hidden, s.d_attn_full, w, s.d_attn_out);
    });
  }
  if (op == "bwd.proj_wgrad") {
    return computation([d, &s, dw = p.w_proj.gradient.data()] {
      cpu::linear_wgrad_accumulate(d.tokens, d.q_width, d.hidden, s.d_attn_full, s.attn_out, dw);
    });
  }
  if (op == "bwd.flash_attn") {
    return computation([d, &s, rope = &c.rope] {
      cpu::attention_backward(attention_shape(d), s.q, s.k, s.v, s.attn_out, s.lse, s.d_attn_out,
                              s.dq, s.dk, s.dv);
      cpu::rope_backward(*rope, d.batch, d.seq, d.heads, 0, s.dq);
      cpu::rope_backward(*rope, d.batch, d.seq, d.kv_heads, 0, s.dk);
      cpu::merge_qkv(d.tokens, d.q_width, d.kv_width, s.dq, s.dk, s.dv, s.d_qkv);
    });
  }
  if (op == "bwd.qkv_dgrad") {
    return computation([d, &s, w = p.w_qkv.values.data()] {
      cpu::linear_dgrad(d.tokens, d.hidden, d.qkv_width, s.d_qkv, w, s.d_attn_in);
    });
  }
  if (op == "bwd.qkv_wgrad") {
    return computation([d, &s, dw = p.w_qkv.gradient.data()] {
      cpu::linear_wgrad_accumulate(d.tokens, d.hidden, d.qkv_width, s.d_qkv, s.attn_in, dw);
    });
  }
  if (op == "bwd.reduce_scatter_attn" || op == "bwd.allreduce_attn") {
    return bind_backward_reduction(op, d, s.d_attn_in, s.d_ln1_out);
  }
  if (op == "bwd.ln_attn") {
    return computation([d, &s, gain = p.ln_attn.values.data(), dgain = p.ln_attn.gradient.data()] {
      cpu::rmsnorm_backward(d.rows, d.hidden, s.x, gain, s.ln1_rstd, s.d_ln1_out, s.dx, dgain);
      cpu::add_tensors(d.residual_elements(), s.dx, s.d_h1, s.dx);
    });
  }
  return std::nullopt;
}

}  // namespace

std::optional<BoundOp> bind_layer_backward(const std::string& op, const LayerOpContext& context) {
  if (std::optional<BoundOp> bound = bind_mlp_half(op, context)) return bound;
  return bind_attention_half(op, context);
}

}  // namespace dhelix::rt::model_detail
