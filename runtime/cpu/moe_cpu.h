#pragma once
// The CPU backend's Mixtral-style MoE MLP, split at the points where the plan's ops are
// (lib/dag_builder_moe.cc): router, permute, [dispatch all-to-all], grouped fc1, SwiGLU,
// grouped fc2, [combine all-to-all], unpermute, and the same chain backwards. The
// all-to-alls sit between permute and the experts: permute writes the rank's kept token
// copies grouped by expert (expert ascending, then token ascending), which is also the
// order an all-to-all over the EP group sends them in (experts of EP rank 0 first).
//
// Per-row math: runtime/kernels/moe_router.h (top-k, softmax, router backward) and
// runtime/kernels/moe_capacity.h (capacity, dropping, load-balancing loss).
//
//   forward   z = x W_r^T;  chosen, g = topk_softmax(z);  p = softmax(z);  drop over C
//             slot s of expert e holds x_t for the kept assignment a = (t, j)
//             o_s = W2_e (silu(W1g_e x_t) * W1u_e x_t)
//             y_t = sum_j [kept] g_j o_s(t, j)            (j ascending)
//   backward  do_s = g_j dy_t,  dg_j = <dy_t, o_s> (0 when dropped)
//             dx_t = sum_j dx_s(t, j) + dz_t W_r,  dW_r += dz^T x
//
// Shapes are this rank's: tokens T (rows entering the MoE layer), hidden h, E experts in
// all, the experts [first_expert, first_expert + local_experts) held here, FFN width F.
// Weights: router [E, h]; fc1 [local, 2F, h] (gate rows, then up rows); fc2 [local, h, F].

#include <cstdint>
#include <vector>

namespace dhelix::cpu {

/// A MoE layer's sizes on one rank.
struct MoeLayerShape {
  int64_t tokens = 0;          ///< T: rows entering the layer
  int64_t hidden = 0;          ///< h
  int64_t experts = 0;         ///< E: routed experts of the whole layer
  int64_t top_k = 0;           ///< k
  int64_t ffn = 0;             ///< F: one expert's FFN width
  double capacity_factor = 0;  ///< cf; 0 = no capacity limit
  double aux_loss_coeff = 0;   ///< alpha of the load-balancing loss
};

/// What the forward keeps for the backward (one micro-batch).
struct MoeRouting {
  std::vector<float> logits;         ///< z [T, E]
  std::vector<float> probs;          ///< full softmax p [T, E]
  std::vector<int32_t> chosen;       ///< [T, k], descending logit
  std::vector<float> gate;           ///< softmax over the chosen [T, k] (before dropping)
  std::vector<uint8_t> kept;         ///< [T, k]: 1 unless dropped over capacity
  std::vector<int64_t> routed;       ///< n_e before dropping [E]
  std::vector<int64_t> expert_rows;  ///< kept assignments per expert [E]
  std::vector<int64_t> slot_of;      ///< [T, k]: the permuted row of an assignment, -1 dropped
  int64_t capacity = 0;              ///< C
  int64_t dropped = 0;               ///< assignments dropped over capacity
  float aux_loss = 0.0f;             ///< L_aux of these tokens

  /// Kept assignments: rows of the permuted buffer.
  int64_t slots() const;
};

/// Router forward: z = x W_r^T, top-k, softmax, capacity, the permutation. x [T, h].
void moe_route(const MoeLayerShape& s, const float* x, const float* w_router, MoeRouting& r);
/// The same from logits already in r.logits [T, E] (what moe_route runs after its GEMM; the
/// GPU tests route the CUDA backend's bf16 logits with it).
void moe_route_logits(const MoeLayerShape& s, MoeRouting& r);

/// permuted[slots, h]: row slot_of[a] = x[a / k].
void moe_permute(const MoeLayerShape& s, const MoeRouting& r, const float* x, float* permuted);

/// The experts' SwiGLU MLPs over rows grouped by expert: rows[e] rows for local expert e,
/// in order. fc1_out [rows, 2F] and act [rows, F] are kept for the backward; out [rows, h].
void moe_experts_forward(const MoeLayerShape& s, const std::vector<int64_t>& rows, const float* in,
                         const float* w_fc1, const float* w_fc2, float* fc1_out, float* act,
                         float* out);

/// y[T, h] = sum_j [kept] g_j expert_out[slot_of(t, j)].
void moe_unpermute(const MoeLayerShape& s, const MoeRouting& r, const float* expert_out, float* y);

/// Unpermute backward: d_expert_out[slots, h] and dgate[T, k] from dy[T, h].
void moe_unpermute_backward(const MoeLayerShape& s, const MoeRouting& r, const float* dy,
                            const float* expert_out, float* d_expert_out, float* dgate);

/// Experts backward: d_in[rows, h] (overwritten); dw_fc1, dw_fc2 accumulate (+=).
void moe_experts_backward(const MoeLayerShape& s, const std::vector<int64_t>& rows, const float* in,
                          const float* w_fc1, const float* w_fc2, const float* fc1_out,
                          const float* act, const float* d_out, float* d_in, float* dw_fc1,
                          float* dw_fc2);

/// Permute backward: dx[T, h] = sum_j d_permuted[slot_of(t, j)] (j ascending; dropped: 0).
void moe_permute_backward(const MoeLayerShape& s, const MoeRouting& r, const float* d_permuted,
                          float* dx);

/// The router's logit gradient dz[T, E] (overwritten) from dgate and the load-balancing
/// loss weighted by aux_dloss: the first half of moe_router_backward, which the runtime runs
/// as the plan's bwd.router (dz W_r) and bwd.router_wgrad (dz^T x) ops.
void moe_router_logits_backward(const MoeLayerShape& s, const MoeRouting& r, const float* dgate,
                                float aux_dloss, float* dz);

/// Router backward: dx[T, h] += dz W_r; dw_router += dz^T x. dz comes from dgate and the
/// load-balancing loss weighted by aux_dloss (the weight the trainer gives it).
void moe_router_backward(const MoeLayerShape& s, const MoeRouting& r, const float* x,
                         const float* w_router, const float* dgate, float aux_dloss, float* dx,
                         float* dw_router);

}  // namespace dhelix::cpu
