#include "runtime/cpu/moe_cpu.h"

#include "lib/error.h"
#include "runtime/cpu/kernels_cpu.h"
#include "runtime/kernels/moe_capacity.h"
#include "runtime/kernels/moe_router.h"

namespace dhelix::cpu {

int64_t MoeRouting::slots() const {
  int64_t total = 0;
  for (int64_t n : expert_rows) total += n;
  return total;
}

void moe_route(const MoeLayerShape& s, const float* x, const float* w_router, MoeRouting& r) {
  const int64_t t_count = s.tokens, e_count = s.experts, k = s.top_k;
  DHELIX_CHECK(k >= 1 && k <= e_count);
  r.logits.resize(static_cast<size_t>(t_count * e_count));
  linear_forward(t_count, s.hidden, e_count, x, w_router, r.logits.data());
  moe_route_logits(s, r);
}

void moe_route_logits(const MoeLayerShape& s, MoeRouting& r) {
  const int64_t t_count = s.tokens, e_count = s.experts, k = s.top_k;
  DHELIX_CHECK(k >= 1 && k <= e_count);
  DHELIX_CHECK(r.logits.size() == static_cast<size_t>(t_count * e_count));
  const auto assignments = static_cast<size_t>(t_count * k);
  r.probs.resize(r.logits.size());
  r.chosen.resize(assignments);
  r.gate.resize(assignments);
  r.kept.resize(assignments);
  r.slot_of.assign(assignments, -1);
  r.routed.resize(static_cast<size_t>(e_count));
  r.expert_rows.assign(static_cast<size_t>(e_count), 0);
  for (int64_t t = 0; t < t_count; ++t) {
    const float* z = r.logits.data() + t * e_count;
    kernels::router_topk_row(e_count, k, z, r.chosen.data() + t * k, r.gate.data() + t * k);
    kernels::router_softmax_row(e_count, z, r.probs.data() + t * e_count);
  }
  r.capacity = kernels::expert_capacity(t_count, k, e_count, s.capacity_factor);
  r.dropped = kernels::drop_over_capacity(t_count, k, e_count, r.capacity, r.chosen.data(),
                                          r.gate.data(), r.kept.data());
  kernels::routed_counts(t_count, k, e_count, r.chosen.data(), r.routed.data());
  r.aux_loss = kernels::load_balancing_loss(t_count, k, e_count, s.aux_loss_coeff, r.probs.data(),
                                            r.routed.data());
  // Slots grouped by expert, then by token (assignment) order.
  for (size_t a = 0; a < assignments; ++a) {
    if (r.kept[a] != 0) ++r.expert_rows[static_cast<size_t>(r.chosen[a])];
  }
  std::vector<int64_t> next(static_cast<size_t>(e_count), 0);
  for (int64_t e = 1; e < e_count; ++e) {
    next[static_cast<size_t>(e)] =
        next[static_cast<size_t>(e - 1)] + r.expert_rows[static_cast<size_t>(e - 1)];
  }
  for (size_t a = 0; a < assignments; ++a) {
    if (r.kept[a] != 0) r.slot_of[a] = next[static_cast<size_t>(r.chosen[a])]++;
  }
}

void moe_permute(const MoeLayerShape& s, const MoeRouting& r, const float* x, float* permuted) {
  const int64_t h = s.hidden;
  for (int64_t a = 0; a < s.tokens * s.top_k; ++a) {
    const int64_t slot = r.slot_of[static_cast<size_t>(a)];
    if (slot < 0) continue;
    const float* row = x + (a / s.top_k) * h;
    std::copy(row, row + h, permuted + slot * h);
  }
}

void moe_experts_forward(const MoeLayerShape& s, const std::vector<int64_t>& rows, const float* in,
                         const float* w_fc1, const float* w_fc2, float* fc1_out, float* act,
                         float* out) {
  const int64_t h = s.hidden, f = s.ffn;
  int64_t first = 0;
  for (size_t e = 0; e < rows.size(); ++e) {
    const int64_t n = rows[e];
    const auto ei = static_cast<int64_t>(e);
    if (n > 0) {
      linear_forward(n, h, 2 * f, in + first * h, w_fc1 + ei * 2 * f * h, fc1_out + first * 2 * f);
      swiglu_forward(n, f, fc1_out + first * 2 * f, act + first * f);
      linear_forward(n, f, h, act + first * f, w_fc2 + ei * h * f, out + first * h);
    }
    first += n;
  }
}

void moe_unpermute(const MoeLayerShape& s, const MoeRouting& r, const float* expert_out, float* y) {
  const int64_t h = s.hidden, k = s.top_k;
  for (int64_t t = 0; t < s.tokens; ++t) {
    float* row = y + t * h;
    std::fill(row, row + h, 0.0f);
    for (int64_t j = 0; j < k; ++j) {
      const int64_t slot = r.slot_of[static_cast<size_t>(t * k + j)];
      if (slot < 0) continue;
      const float g = r.gate[static_cast<size_t>(t * k + j)];
      for (int64_t i = 0; i < h; ++i) row[i] += g * expert_out[slot * h + i];
    }
  }
}

void moe_unpermute_backward(const MoeLayerShape& s, const MoeRouting& r, const float* dy,
                            const float* expert_out, float* d_expert_out, float* dgate) {
  const int64_t h = s.hidden, k = s.top_k;
  for (int64_t a = 0; a < s.tokens * k; ++a) {
    const int64_t slot = r.slot_of[static_cast<size_t>(a)];
    if (slot < 0) {
      dgate[a] = 0.0f;
      continue;
    }
    const float* g_row = dy + (a / k) * h;
    const float g = r.gate[static_cast<size_t>(a)];
    float dot = 0.0f;
    for (int64_t i = 0; i < h; ++i) {
      d_expert_out[slot * h + i] = g * g_row[i];
      dot += g_row[i] * expert_out[slot * h + i];
    }
    dgate[a] = dot;
  }
}

void moe_experts_backward(const MoeLayerShape& s, const std::vector<int64_t>& rows, const float* in,
                          const float* w_fc1, const float* w_fc2, const float* fc1_out,
                          const float* act, const float* d_out, float* d_in, float* dw_fc1,
                          float* dw_fc2) {
  const int64_t h = s.hidden, f = s.ffn;
  int64_t total = 0;
  for (int64_t n : rows) total += n;
  std::vector<float> d_act(static_cast<size_t>(total * f));
  std::vector<float> d_fc1(static_cast<size_t>(total * 2 * f));
  int64_t first = 0;
  for (size_t e = 0; e < rows.size(); ++e) {
    const int64_t n = rows[e];
    const auto ei = static_cast<int64_t>(e);
    if (n > 0) {
      float* da = d_act.data() + first * f;
      float* d1 = d_fc1.data() + first * 2 * f;
      linear_dgrad(n, f, h, d_out + first * h, w_fc2 + ei * h * f, da);
      linear_wgrad_accumulate(n, f, h, d_out + first * h, act + first * f, dw_fc2 + ei * h * f);
      swiglu_backward(n, f, fc1_out + first * 2 * f, da, d1);
      linear_dgrad(n, h, 2 * f, d1, w_fc1 + ei * 2 * f * h, d_in + first * h);
      linear_wgrad_accumulate(n, h, 2 * f, d1, in + first * h, dw_fc1 + ei * 2 * f * h);
    }
    first += n;
  }
}

void moe_permute_backward(const MoeLayerShape& s, const MoeRouting& r, const float* d_permuted,
                          float* dx) {
  const int64_t h = s.hidden, k = s.top_k;
  for (int64_t t = 0; t < s.tokens; ++t) {
    float* row = dx + t * h;
    std::fill(row, row + h, 0.0f);
    for (int64_t j = 0; j < k; ++j) {
      const int64_t slot = r.slot_of[static_cast<size_t>(t * k + j)];
      if (slot < 0) continue;
      for (int64_t i = 0; i < h; ++i) row[i] += d_permuted[slot * h + i];
    }
  }
}

void moe_router_backward(const MoeLayerShape& s, const MoeRouting& r, const float* x,
                         const float* w_router, const float* dgate, float aux_dloss, float* dx,
                         float* dw_router) {
  const int64_t t_count = s.tokens, e_count = s.experts;
  std::vector<float> dz(static_cast<size_t>(t_count * e_count));
  moe_router_logits_backward(s, r, dgate, aux_dloss, dz.data());
  std::vector<float> dx_router(static_cast<size_t>(t_count * s.hidden));
  linear_dgrad(t_count, s.hidden, e_count, dz.data(), w_router, dx_router.data());
  add_tensors(t_count * s.hidden, dx, dx_router.data(), dx);
  linear_wgrad_accumulate(t_count, s.hidden, e_count, dz.data(), x, dw_router);
}

void moe_router_logits_backward(const MoeLayerShape& s, const MoeRouting& r, const float* dgate,
                                float aux_dloss, float* dz) {
  const int64_t t_count = s.tokens, e_count = s.experts, k = s.top_k;
  std::vector<float> dp(static_cast<size_t>(e_count));
  const bool aux = s.aux_loss_coeff > 0.0 && aux_dloss != 0.0f;
  if (aux) {
    kernels::load_balancing_gradient(t_count, k, e_count, s.aux_loss_coeff, r.routed.data(),
                                     aux_dloss, dp.data());
  }
  for (int64_t t = 0; t < t_count; ++t) {
    kernels::router_backward_row(e_count, k, r.chosen.data() + t * k, r.gate.data() + t * k,
                                 dgate + t * k, r.probs.data() + t * e_count,
                                 aux ? dp.data() : nullptr, dz + t * e_count);
  }
}

}  // namespace dhelix::cpu
