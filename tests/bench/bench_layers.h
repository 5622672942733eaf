#pragma once
// Hand-built strands of realistic layers for the pairing benchmark. Times are estimates in
// us for an A800-class GPU (312 TFLOP/s bf16 dense, NVLink ~200 GB/s per direction in a
// node, 4x200 Gb/s InfiniBand across nodes), see shared/reference/hardware-figures.md:
// they only need to be the right order of magnitude for the search's work to be realistic.

#include "planner/strand_graph.h"

namespace dhelix::bench {

inline constexpr StreamClass kC = StreamClass::kCompute;
inline constexpr StreamClass kL = StreamClass::kLocalComm;
inline constexpr StreamClass kX = StreamClass::kCrossComm;

/// Llama-70B-shaped layer forward on one rank, TP8 + SP inside a node, CP2 across nodes
/// (8k tokens per rank): the paper's 14 ops with attention split into the two CP ring
/// steps and the ring's KV send/recv (16 ops).
inline StrandGraph llama70b_tp8_cp2_forward() {
  StrandGraph g;
  const int64_t ln_attn = g.add_op("fwd.ln_attn", kC, 120, {});
  const int64_t ag_attn = g.add_op("fwd.ag_attn", kL, 700, {ln_attn});
  const int64_t qkv = g.add_op("fwd.gemm_qkv", kC, 800, {ag_attn});
  const int64_t send_kv = g.add_op("fwd.cp_send_kv", kX, 500, {qkv});
  const int64_t step1 = g.add_op("fwd.attn_step1", kC, 2000, {qkv});
  const int64_t step2 = g.add_op("fwd.attn_step2", kC, 1800, {send_kv, step1});
  const int64_t proj = g.add_op("fwd.gemm_proj", kC, 650, {step2});
  const int64_t rs_attn = g.add_op("fwd.rs_attn", kL, 700, {proj});
  const int64_t bda_attn = g.add_op("fwd.bda_attn", kC, 100, {rs_attn, ln_attn});
  const int64_t ln_mlp = g.add_op("fwd.ln_mlp", kC, 120, {bda_attn});
  const int64_t ag_mlp = g.add_op("fwd.ag_mlp", kL, 700, {ln_mlp});
  const int64_t fc1 = g.add_op("fwd.gemm_fc1", kC, 1900, {ag_mlp});
  const int64_t swiglu = g.add_op("fwd.swiglu", kC, 250, {fc1});
  const int64_t fc2 = g.add_op("fwd.gemm_fc2", kC, 1000, {swiglu});
  const int64_t rs_mlp = g.add_op("fwd.rs_mlp", kL, 700, {fc2});
  g.add_op("fwd.bda_mlp", kC, 100, {rs_mlp, ln_mlp});
  return g;
}

/// Its backward: the paper's 18 ops (4 weight-gradient sinks) with attention in three
/// CP steps and the reverse ring's two exchanges (22 ops).
inline StrandGraph llama70b_tp8_cp2_backward() {
  StrandGraph g;
  const int64_t bda_mlp = g.add_op("bwd.bda_mlp", kC, 100, {});
  const int64_t ag_fc2 = g.add_op("bwd.ag_grad_fc2", kL, 700, {bda_mlp});
  const int64_t fc2_d = g.add_op("bwd.fc2_dgrad", kC, 1000, {ag_fc2});
  g.add_op("bwd.fc2_wgrad", kC, 1000, {ag_fc2});
  const int64_t swiglu = g.add_op("bwd.swiglu", kC, 350, {fc2_d});
  const int64_t fc1_d = g.add_op("bwd.fc1_dgrad", kC, 1900, {swiglu});
  g.add_op("bwd.fc1_wgrad", kC, 1900, {swiglu});
  const int64_t rs_fc1 = g.add_op("bwd.rs_fc1", kL, 700, {fc1_d});
  const int64_t ln_mlp = g.add_op("bwd.ln_mlp", kC, 200, {rs_fc1});
  const int64_t bda_attn = g.add_op("bwd.bda_attn", kC, 100, {ln_mlp});
  const int64_t ag_proj = g.add_op("bwd.ag_grad_proj", kL, 700, {bda_attn});
  const int64_t proj_d = g.add_op("bwd.proj_dgrad", kC, 650, {ag_proj});
  g.add_op("bwd.proj_wgrad", kC, 650, {ag_proj});
  const int64_t step1 = g.add_op("bwd.attn_step1", kC, 2500, {proj_d});
  const int64_t send_kv = g.add_op("bwd.cp_send_kv", kX, 500, {proj_d});
  const int64_t step2 = g.add_op("bwd.attn_step2", kC, 2500, {step1, send_kv});
  const int64_t send_dkv = g.add_op("bwd.cp_send_dkv", kX, 500, {step2});
  const int64_t step3 = g.add_op("bwd.attn_step3", kC, 150, {send_dkv});
  const int64_t qkv_d = g.add_op("bwd.qkv_dgrad", kC, 800, {step3});
  g.add_op("bwd.qkv_wgrad", kC, 800, {step3});
  const int64_t rs_qkv = g.add_op("bwd.rs_qkv", kL, 700, {qkv_d});
  g.add_op("bwd.ln_attn", kC, 200, {rs_qkv});
  return g;
}

/// An MoE layer forward with EP8 across nodes (no TP): router, permute, dispatch
/// all-to-all, grouped GEMMs, combine all-to-all, unpermute (15 ops).
inline StrandGraph moe_ep8_forward() {
  StrandGraph g;
  const int64_t ln_attn = g.add_op("fwd.ln_attn", kC, 100, {});
  const int64_t qkv = g.add_op("fwd.gemm_qkv", kC, 900, {ln_attn});
  const int64_t attn = g.add_op("fwd.attention", kC, 2500, {qkv});
  const int64_t proj = g.add_op("fwd.gemm_proj", kC, 700, {attn});
  const int64_t bda_attn = g.add_op("fwd.bda_attn", kC, 100, {proj, ln_attn});
  const int64_t ln_mlp = g.add_op("fwd.ln_mlp", kC, 100, {bda_attn});
  const int64_t router = g.add_op("fwd.router", kC, 150, {ln_mlp});
  const int64_t permute = g.add_op("fwd.permute", kC, 200, {router});
  const int64_t dispatch = g.add_op("fwd.dispatch_a2a", kX, 1500, {permute});
  const int64_t fc1 = g.add_op("fwd.grouped_fc1", kC, 1800, {dispatch});
  const int64_t act = g.add_op("fwd.act", kC, 200, {fc1});
  const int64_t fc2 = g.add_op("fwd.grouped_fc2", kC, 900, {act});
  const int64_t combine = g.add_op("fwd.combine_a2a", kX, 1500, {fc2});
  const int64_t unpermute = g.add_op("fwd.unpermute", kC, 200, {combine, router});
  g.add_op("fwd.bda_mlp", kC, 100, {unpermute, bda_attn});
  return g;
}

/// Its backward (20 ops, 5 movable weight-gradient sinks including the router's).
inline StrandGraph moe_ep8_backward() {
  StrandGraph g;
  const int64_t bda_mlp = g.add_op("bwd.bda_mlp", kC, 100, {});
  const int64_t unpermute = g.add_op("bwd.unpermute", kC, 200, {bda_mlp});
  const int64_t combine = g.add_op("bwd.combine_a2a", kX, 1500, {unpermute});
  const int64_t fc2_d = g.add_op("bwd.grouped_fc2_dgrad", kC, 900, {combine});
  g.add_op("bwd.grouped_fc2_wgrad", kC, 900, {combine});
  const int64_t act = g.add_op("bwd.act", kC, 250, {fc2_d});
  const int64_t fc1_d = g.add_op("bwd.grouped_fc1_dgrad", kC, 1800, {act});
  g.add_op("bwd.grouped_fc1_wgrad", kC, 1800, {act});
  const int64_t dispatch = g.add_op("bwd.dispatch_a2a", kX, 1500, {fc1_d});
  const int64_t permute = g.add_op("bwd.permute", kC, 200, {dispatch});
  const int64_t router_d = g.add_op("bwd.router_dgrad", kC, 150, {unpermute});
  g.add_op("bwd.router_wgrad", kC, 100, {unpermute});
  const int64_t ln_mlp = g.add_op("bwd.ln_mlp", kC, 200, {permute, router_d});
  const int64_t bda_attn = g.add_op("bwd.bda_attn", kC, 100, {ln_mlp});
  const int64_t proj_d = g.add_op("bwd.proj_dgrad", kC, 700, {bda_attn});
  g.add_op("bwd.proj_wgrad", kC, 700, {bda_attn});
  const int64_t attn = g.add_op("bwd.attention", kC, 5000, {proj_d});
  const int64_t qkv_d = g.add_op("bwd.qkv_dgrad", kC, 900, {attn});
  g.add_op("bwd.qkv_wgrad", kC, 900, {attn});
  g.add_op("bwd.ln_attn", kC, 200, {qkv_d});
  return g;
}

/// The MLP half of the Llama layer (forward ops from ln_mlp, backward ops up to ln_mlp):
/// small enough for the naive reference to finish.
inline StrandGraph llama70b_mlp_forward() {
  StrandGraph g;
  const int64_t ln_mlp = g.add_op("fwd.ln_mlp", kC, 120, {});
  const int64_t ag_mlp = g.add_op("fwd.ag_mlp", kL, 700, {ln_mlp});
  const int64_t fc1 = g.add_op("fwd.gemm_fc1", kC, 1900, {ag_mlp});
  const int64_t swiglu = g.add_op("fwd.swiglu", kC, 250, {fc1});
  const int64_t fc2 = g.add_op("fwd.gemm_fc2", kC, 1000, {swiglu});
  const int64_t rs_mlp = g.add_op("fwd.rs_mlp", kL, 700, {fc2});
  g.add_op("fwd.bda_mlp", kC, 100, {rs_mlp, ln_mlp});
  return g;
}

inline StrandGraph llama70b_mlp_backward() {
  StrandGraph g;
  const int64_t bda_mlp = g.add_op("bwd.bda_mlp", kC, 100, {});
  const int64_t ag_fc2 = g.add_op("bwd.ag_grad_fc2", kL, 700, {bda_mlp});
  const int64_t fc2_d = g.add_op("bwd.fc2_dgrad", kC, 1000, {ag_fc2});
  g.add_op("bwd.fc2_wgrad", kC, 1000, {ag_fc2});
  const int64_t swiglu = g.add_op("bwd.swiglu", kC, 350, {fc2_d});
  const int64_t fc1_d = g.add_op("bwd.fc1_dgrad", kC, 1900, {swiglu});
  g.add_op("bwd.fc1_wgrad", kC, 1900, {swiglu});
  const int64_t rs_fc1 = g.add_op("bwd.rs_fc1", kL, 700, {fc1_d});
  g.add_op("bwd.ln_mlp", kC, 200, {rs_fc1});
  return g;
}

}  // namespace dhelix::bench
