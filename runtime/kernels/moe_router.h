#pragma once
// The router of a Mixtral-style MoE layer, per token row of logits z[E] (E experts), as
// Megatron-Core's TopKRouter computes it with moe_router_pre_softmax off ("top-k, then
// softmax", Mixtral's order):
//   chosen = the k largest z_e (ties: the lower expert index first)
//   g_j    = exp(z_{c_j} - m) / sum_l exp(z_{c_l} - m),   m = z_{c_0} (the largest)
// and for the auxiliary load-balancing loss the full softmax p_e = softmax(z)_e.
//
// Backward of one row, from dg_j (the combine's <dy, expert output j>):
//   dz_{c_j} = g_j * (dg_j - sum_l g_l dg_l)                (softmax over the chosen)
// plus the aux loss's share through the full softmax, from dp_e:
//   dz_e    += p_e * (dp_e - sum_f p_f dp_f)
// A dropped assignment (moe_capacity.h) has g_j = 0 in the combine and contributes dg_j = 0;
// its softmax weight still enters sum_l g_l dg_l with its own g_l, as in Megatron, whose
// capacity mask zeroes the probabilities after the softmax (no renormalisation).
//
// Every sum has one fixed order (expert index ascending or chosen slot ascending), so the
// CPU and CUDA backends produce the same bits (host_device.h).

#include "runtime/kernels/host_device.h"

namespace dhelix::kernels {

/// Whether candidate (value, index) ranks before (best_value, best_index) in the top-k
/// order: the larger value, and on a tie the lower index; best_index < 0 is no candidate.
/// The serial scan below and the CUDA warp's shuffle reduction (kernels_moe_route.cu)
/// pick the same winner with it, in any combining order (for finite logits).
DHELIX_HOST_DEVICE inline bool router_ranks_before(float value, int64_t index, float best_value,
                                                   int64_t best_index) {
  if (index < 0) return false;
  if (best_index < 0) return true;
  return value > best_value || (value == best_value && index < best_index);
}

/// The softmax weights gate[k] of the chosen experts chosen[k] (chosen[0] the largest), from
/// z(e), an accessor float(int64_t) to the row's logits; summed in slot order.
template <class Logit>
DHELIX_HOST_DEVICE inline void router_topk_gates(int64_t k, Logit z, const int32_t* chosen,
                                                 float* gate) {
  const float m = z(chosen[0]);
  float sum = 0.0f;
  for (int64_t j = 0; j < k; ++j) {
    gate[j] = expf(z(chosen[j]) - m);
    sum += gate[j];
  }
  for (int64_t j = 0; j < k; ++j) gate[j] /= sum;
}

/// Chooses the k largest of z[experts] (descending; ties by lower index) into chosen[k]
/// and writes their softmax weights gate[k]. k <= experts. The serial reference: the CUDA
/// kernel picks each slot with a warp reduction of router_ranks_before.
DHELIX_HOST_DEVICE inline void router_topk_row(int64_t experts, int64_t k, const float* z,
                                               int32_t* chosen, float* gate) {
  for (int64_t j = 0; j < k; ++j) {
    int64_t best = -1;
    for (int64_t e = 0; e < experts; ++e) {
      bool taken = false;
      for (int64_t l = 0; l < j; ++l) taken = taken || chosen[l] == e;
      if (taken) continue;
      if (best < 0 || z[e] > z[best]) best = e;  // strict: the lower index wins a tie
    }
    chosen[j] = static_cast<int32_t>(best);
  }
  router_topk_gates(
      k, [z](int64_t e) { return z[e]; }, chosen, gate);
}

/// p_e of the full softmax from the row's max m and sum of exp(z - m): the value both the
/// serial row below and the warp-per-token kernel (which sums in lane-tree order) store.
DHELIX_HOST_DEVICE inline float router_softmax_value(float z, float m, float sum) {
  return expf(z - m) / sum;
}

/// Full softmax p[experts] of one row of logits (for the load-balancing loss).
DHELIX_HOST_DEVICE inline void router_softmax_row(int64_t experts, const float* z, float* p) {
  float m = z[0];
  for (int64_t e = 1; e < experts; ++e) m = max_float(m, z[e]);
  float sum = 0.0f;
  for (int64_t e = 0; e < experts; ++e) {
    p[e] = expf(z[e] - m);
    sum += p[e];
  }
  for (int64_t e = 0; e < experts; ++e) p[e] /= sum;
}

/// Backward of one row: dz[experts] (overwritten) from the chosen experts, their softmax
/// weights gate[k] (before any capacity mask), dgate[k], the full softmax p[experts] and
/// the aux loss's dp[experts] (nullptr: no aux loss).
DHELIX_HOST_DEVICE inline void router_backward_row(int64_t experts, int64_t k,
                                                   const int32_t* chosen, const float* gate,
                                                   const float* dgate, const float* p,
                                                   const float* dp, float* dz) {
  for (int64_t e = 0; e < experts; ++e) dz[e] = 0.0f;
  if (dp != nullptr) {
    float inner = 0.0f;
    for (int64_t e = 0; e < experts; ++e) inner += p[e] * dp[e];
    for (int64_t e = 0; e < experts; ++e) dz[e] = p[e] * (dp[e] - inner);
  }
  float inner = 0.0f;
  for (int64_t j = 0; j < k; ++j) inner += gate[j] * dgate[j];
  for (int64_t j = 0; j < k; ++j) dz[chosen[j]] += gate[j] * (dgate[j] - inner);
}

/// sum_j g_j dg_j of one row, slot order (the chosen softmax's inner product).
DHELIX_HOST_DEVICE inline float router_gate_inner(int64_t k, const float* gate,
                                                  const float* dgate) {
  float inner = 0.0f;
  for (int64_t j = 0; j < k; ++j) inner += gate[j] * dgate[j];
  return inner;
}

/// dz_e of one row, element by element (what one lane of the warp-per-token backward
/// writes): router_backward_row's value for expert e given the two inner products,
/// aux_inner = sum_f p_f dp_f (ignored without the aux loss) and gate_inner =
/// router_gate_inner. The chosen experts are distinct, so at most one slot adds to e.
DHELIX_HOST_DEVICE inline float router_backward_element(int64_t e, int64_t k, const int32_t* chosen,
                                                        const float* gate, const float* dgate,
                                                        float p_e, bool aux, float dp_e,
                                                        float aux_inner, float gate_inner) {
  float dz = aux ? p_e * (dp_e - aux_inner) : 0.0f;
  for (int64_t j = 0; j < k; ++j) {
    if (chosen[j] == e) dz += gate[j] * (dgate[j] - gate_inner);
  }
  return dz;
}

}  // namespace dhelix::kernels
