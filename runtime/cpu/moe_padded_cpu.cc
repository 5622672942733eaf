// The host twin of runtime/cuda/kernels_moe.cu: each loop below is one kernel, its body
// what one GPU thread does for its token, assignment, expert or element.

#include "runtime/cpu/moe_padded_cpu.h"

#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <vector>

#include "lib/error.h"
#include "runtime/kernels/moe_capacity.h"
#include "runtime/kernels/moe_padded_check.h"
#include "runtime/kernels/moe_router.h"
#include "runtime/kernels/moe_shared_gate.h"

namespace dhelix::cpu {
namespace {

using kernels::MoePaddedRouting;
using kernels::MoePaddedShape;

size_t to_size(int64_t n) { return static_cast<size_t>(n); }

}  // namespace

void check_moe_shape(const MoePaddedShape& shape) {
  kernels::check_padded_moe_shape(shape, "MoE with padded blocks on the host", 0);
}

void moe_route(const MoePaddedShape& s, const float* logits, MoePaddedRouting r) {
  check_moe_shape(s);
  const int64_t n = s.tokens * s.top_k;
  // moe_topk_kernel: per token.
  for (int64_t t = 0; t < s.tokens; ++t) {
    const float* z = logits + t * s.experts;
    kernels::router_topk_row(s.experts, s.top_k, z, r.chosen + t * s.top_k, r.gate + t * s.top_k);
    kernels::router_softmax_row(s.experts, z, r.probs + t * s.experts);
  }
  // moe_routed_kernel: per expert.
  for (int64_t e = 0; e < s.experts; ++e) {
    int64_t routed = 0;
    for (int64_t a = 0; a < n; ++a) routed += r.chosen[a] == e ? 1 : 0;
    r.routed[e] = routed;
  }
  // moe_keep_kernel: per assignment, after every n_e is written.
  for (int64_t a = 0; a < n; ++a) {
    r.kept[a] = kernels::keeps_assignment(n, r.chosen, r.gate, r.routed, s.capacity, a) ? 1 : 0;
  }
  // moe_rows_kernel: per expert, after every kept flag is written.
  for (int64_t e = 0; e < s.experts; ++e) {
    r.send_counts[e] =
        kernels::assign_padded_rows(n, r.chosen, r.kept, s.capacity, e, r.row) * s.hidden;
  }
  // moe_aux_loss_kernel: one thread.
  *r.aux_loss = kernels::load_balancing_loss(s.tokens, s.top_k, s.experts, s.aux_loss_coeff,
                                             r.probs, r.routed);
}

void moe_permute(const MoePaddedShape& s, MoePaddedRouting r, const float* x, float* permuted) {
  const int64_t h = s.hidden;
  std::fill_n(permuted, kernels::padded_rows(s.experts, s.capacity) * h, 0.0f);
  for (int64_t a = 0; a < s.tokens * s.top_k; ++a) {
    const int64_t row = r.row[a];
    if (row >= 0) std::copy_n(x + (a / s.top_k) * h, h, permuted + row * h);
  }
}

void moe_regroup(int64_t ep, int64_t local, int64_t capacity, int64_t hidden, const float* from,
                 float* to, bool to_expert) {
  DHELIX_CHECK(from != to);
  for (int64_t row = 0; row < ep * local * capacity; ++row) {
    std::copy_n(from + row * hidden, hidden,
                to + kernels::padded_regroup_row(row, ep, local, capacity, to_expert) * hidden);
  }
}

void moe_unpermute(const MoePaddedShape& s, MoePaddedRouting r, const float* expert_out, float* y) {
  const int64_t h = s.hidden, k = s.top_k;
  for (int64_t t = 0; t < s.tokens; ++t) {
    for (int64_t i = 0; i < h; ++i) {
      float sum = 0.0f;
      for (int64_t j = 0; j < k; ++j) {
        const int64_t row = r.row[t * k + j];
        if (row >= 0) sum += r.gate[t * k + j] * expert_out[row * h + i];
      }
      y[t * h + i] = sum;
    }
  }
}

void moe_unpermute_backward(const MoePaddedShape& s, MoePaddedRouting r, const float* dy,
                            const float* expert_out, float* d_expert_out, float* dgate) {
  const int64_t h = s.hidden, k = s.top_k, n = s.tokens * k;
  std::fill_n(d_expert_out, kernels::padded_rows(s.experts, s.capacity) * h, 0.0f);
  // moe_unpermute_grad_kernel, then moe_dgate_kernel.
  for (int64_t a = 0; a < n; ++a) {
    const int64_t row = r.row[a];
    if (row < 0) continue;
    for (int64_t i = 0; i < h; ++i) d_expert_out[row * h + i] = r.gate[a] * dy[(a / k) * h + i];
  }
  for (int64_t a = 0; a < n; ++a) {
    const int64_t row = r.row[a];
    float dot = 0.0f;
    if (row >= 0) {
      const float* g_row = dy + (a / k) * h;
      for (int64_t i = 0; i < h; ++i) dot += g_row[i] * expert_out[row * h + i];
    }
    dgate[a] = dot;
  }
}

void moe_permute_backward(const MoePaddedShape& s, MoePaddedRouting r, const float* d_permuted,
                          float* dx) {
  const int64_t h = s.hidden, k = s.top_k;
  for (int64_t t = 0; t < s.tokens; ++t) {
    for (int64_t i = 0; i < h; ++i) {
      float sum = 0.0f;
      for (int64_t j = 0; j < k; ++j) {
        const int64_t row = r.row[t * k + j];
        if (row >= 0) sum += d_permuted[row * h + i];
      }
      dx[t * h + i] = sum;
    }
  }
}

void moe_router_logits_backward(const MoePaddedShape& s, MoePaddedRouting r, const float* dgate,
                                float aux_dloss, float* dz) {
  std::vector<float> dp(to_size(s.experts));
  const bool aux = s.aux_loss_coeff > 0.0 && aux_dloss != 0.0f;
  if (aux) {
    kernels::load_balancing_gradient(s.tokens, s.top_k, s.experts, s.aux_loss_coeff, r.routed,
                                     aux_dloss, dp.data());
  }
  for (int64_t t = 0; t < s.tokens; ++t) {
    kernels::router_backward_row(s.experts, s.top_k, r.chosen + t * s.top_k, r.gate + t * s.top_k,
                                 dgate + t * s.top_k, r.probs + t * s.experts,
                                 aux ? dp.data() : nullptr, dz + t * s.experts);
  }
}

void moe_shared_gate(int64_t rows, const float* logit, float* gate) {
  for (int64_t r = 0; r < rows; ++r) gate[r] = kernels::shared_gate(logit[r]);
}

void moe_shared_gate_add(int64_t rows, int64_t hidden, const float* gate, const float* out,
                         float* y) {
  for (int64_t r = 0; r < rows; ++r) {
    kernels::shared_gate_add_row(hidden, gate[r], out + r * hidden, y + r * hidden);
  }
}

void moe_shared_gate_scale(int64_t rows, int64_t hidden, const float* gate, const float* dy,
                           float* d_out) {
  for (int64_t r = 0; r < rows; ++r) {
    kernels::shared_gate_scale_row(hidden, gate[r], dy + r * hidden, d_out + r * hidden);
  }
}

void moe_shared_gate_backward(int64_t rows, int64_t hidden, const float* gate, const float* dy,
                              const float* out, float* d_logit, float* d_out) {
  for (int64_t r = 0; r < rows; ++r) {
    d_logit[r] = kernels::shared_gate_backward_row(hidden, gate[r], dy + r * hidden,
                                                   out + r * hidden, d_out + r * hidden);
  }
}

}  // namespace dhelix::cpu
