#pragma once
// SwiGLU (Shazeer 2020), the gated MLP activation of Llama, per element:
//   out = silu(a) * b,   silu(a) = a * sigmoid(a)
// where a is the gate projection and b the up projection. Backward:
//   db = dout * silu(a)
//   da = dout * b * sigmoid(a) * (1 + a * (1 - sigmoid(a)))
// The fused gate-up GEMM writes one [rows, 2 * ffn] tensor: gate in columns [0, ffn),
// up in columns [ffn, 2 * ffn); the row functions below read that layout.

#include "runtime/kernels/host_device.h"

namespace dhelix::kernels {

/// Logistic sigmoid; exact 0 or 1 at the float limits (expf overflows to inf, 1/inf = 0).
DHELIX_HOST_DEVICE inline float sigmoid(float a) { return 1.0f / (1.0f + expf(-a)); }

/// out = silu(gate) * up for one element.
DHELIX_HOST_DEVICE inline float swiglu_forward(float gate, float up) {
  return gate * sigmoid(gate) * up;
}

/// Gradients of one element: d_gate and d_up from gate, up and dout.
DHELIX_HOST_DEVICE inline void swiglu_backward(float gate, float up, float dout, float* d_gate,
                                               float* d_up) {
  float s = sigmoid(gate);
  *d_up = dout * (gate * s);
  *d_gate = dout * up * s * (1.0f + gate * (1.0f - s));
}

/// Forward of one row: gate_up[2 * ffn] (gate then up) gives out[ffn].
DHELIX_HOST_DEVICE inline void swiglu_forward_row(int64_t ffn, const float* gate_up, float* out) {
  for (int64_t i = 0; i < ffn; ++i) out[i] = swiglu_forward(gate_up[i], gate_up[ffn + i]);
}

/// Backward of one row: d_gate_up[2 * ffn] from gate_up[2 * ffn] and dout[ffn].
DHELIX_HOST_DEVICE inline void swiglu_backward_row(int64_t ffn, const float* gate_up,
                                                   const float* dout, float* d_gate_up) {
  for (int64_t i = 0; i < ffn; ++i) {
    swiglu_backward(gate_up[i], gate_up[ffn + i], dout[i], &d_gate_up[i], &d_gate_up[ffn + i]);
  }
}

}  // namespace dhelix::kernels
