#pragma once
// The shared expert's gate (Qwen2-MoE; runtime/model/moe_shared_expert_cpu.cc), per token:
//
//   forward   g = sigmoid(logit),  logit = x w_g;   y += g * out   (out = fc2(swiglu(fc1 x)))
//   backward  d_logit = <dy, out> g (1 - g),  d_out = g dy
//
// The CPU sums the dot product <dy, out> left to right over the h elements of the row; the
// GPU gives a row a warp, which sums in kernels::lane_tree_sum's order (32 strided
// partials, then a halving tree: the same terms, another rounding). d_logit is evaluated
// as (<dy, out> g) (1 - g) in both. The CPU (moe_shared_expert_cpu.cc) and the CUDA
// kernels (runtime/cuda/kernels_moe_shared.cu) call these functions, so the two differ
// only by the activations' bf16 rounding and the GPU's fused multiply-adds.
//
// Worked example, h = 2: logit = 0 gives g = 0.5; out = (2, -4), y = (1, 1) gives
// y = (1 + 0.5 * 2, 1 + 0.5 * -4) = (2, -1). With dy = (1, 0.5): <dy, out> = 2 - 2 = 0,
// so d_logit = 0, and d_out = (0.5, 0.25).
//
// The row functions take accessors (float(int64_t) to read, void(int64_t, float) to
// write) so that a CUDA thread can run them on bf16 rows; the *_row functions over float
// arrays are the CPU's.

#include "runtime/kernels/host_device.h"
#include "runtime/kernels/swiglu.h"

namespace dhelix::kernels {

/// The gate value g = sigmoid(logit) of one token.
DHELIX_HOST_DEVICE inline float shared_gate(float logit) { return sigmoid(logit); }

/// One element of the gated sum: y + g * out.
DHELIX_HOST_DEVICE inline float shared_gate_add(float y, float g, float out) { return y + g * out; }

/// One element of the output gradient: d_out = g * dy.
DHELIX_HOST_DEVICE inline float shared_gate_scale(float g, float dy) { return g * dy; }

/// d_logit of one token from its gate value and the row's <dy, out>, summed over i in
/// [0, h) ascending; dy and out are accessors float(int64_t).
template <class Dy, class Out>
DHELIX_HOST_DEVICE inline float shared_gate_dlogit(int64_t h, float g, Dy dy, Out out) {
  float dg = 0.0f;
  for (int64_t i = 0; i < h; ++i) dg += dy(i) * out(i);
  return dg * g * (1.0f - g);
}

/// d_logit from the row's <dy, out> however it was summed: the CUDA kernel's warp per row
/// sums in kernels::lane_tree_sum's order (and so does the kernels' host twin).
DHELIX_HOST_DEVICE inline float shared_gate_dlogit_of_dot(float dot, float g) {
  return dot * g * (1.0f - g);
}

/// y[h] += g * out[h] for one row.
DHELIX_HOST_DEVICE inline void shared_gate_add_row(int64_t h, float g, const float* out, float* y) {
  for (int64_t i = 0; i < h; ++i) y[i] = shared_gate_add(y[i], g, out[i]);
}

/// d_out[h] = g * dy[h] for one row.
DHELIX_HOST_DEVICE inline void shared_gate_scale_row(int64_t h, float g, const float* dy,
                                                     float* d_out) {
  for (int64_t i = 0; i < h; ++i) d_out[i] = shared_gate_scale(g, dy[i]);
}

/// The gate's backward on one row: writes d_out[h] = g dy and returns d_logit.
DHELIX_HOST_DEVICE inline float shared_gate_backward_row(int64_t h, float g, const float* dy,
                                                         const float* out, float* d_out) {
  shared_gate_scale_row(h, g, dy, d_out);
  return shared_gate_dlogit(
      h, g, [dy](int64_t i) { return dy[i]; }, [out](int64_t i) { return out[i]; });
}

}  // namespace dhelix::kernels
