// The host twin of runtime/cuda/kernels_moe.cu and kernels_moe_shared.cu: each loop below is
// one kernel, its body what one GPU thread (or warp, for the dot products, summed in
// kernels::lane_tree_sum's order) does for its assignment, row or element. The router's
// kernels have theirs in moe_route_twin.cc.

#include "runtime/cpu/moe_padded_cpu.h"

#include <fmt/format.h>

#include <algorithm>
#include <string>

#include "lib/error.h"
#include "runtime/kernels/moe_padded_check.h"
#include "runtime/kernels/moe_shared_gate.h"

namespace dhelix::cpu {
namespace {

using kernels::MoePaddedRouting;
using kernels::MoePaddedShape;

}  // namespace

void check_moe_shape(const MoePaddedShape& shape) {
  kernels::check_padded_moe_shape(shape, "MoE with padded blocks on the host", 0);
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
    const float* g_row = dy + (a / k) * h;
    const float* o_row = expert_out + row * h;
    // A warp per assignment: the lane-tree order of kernels::lane_tree_sum.
    dgate[a] = row < 0 ? 0.0f : kernels::lane_tree_sum(h, [g_row, o_row](int64_t i) {
      return g_row[i] * o_row[i];
    });
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
    const float* dy_row = dy + r * hidden;
    const float* out_row = out + r * hidden;
    kernels::shared_gate_scale_row(hidden, gate[r], dy_row, d_out + r * hidden);
    // A warp per row (moe_shared_dlogit_kernel): <dy, out> in lane-tree order.
    const float dot = kernels::lane_tree_sum(
        hidden, [dy_row, out_row](int64_t i) { return dy_row[i] * out_row[i]; });
    d_logit[r] = kernels::shared_gate_dlogit_of_dot(dot, gate[r]);
  }
}

}  // namespace dhelix::cpu
