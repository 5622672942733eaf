#pragma once
// Rotary position embedding (Su et al. 2021, "RoFormer"), in the half-split layout of
// HuggingFace Llama: a head vector x[head_dim] is read as pairs (x_i, x_{i+h}) with
// h = head_dim / 2, and pair i at position p turns by the angle
//   a_i(p) = p * base^(-2i / head_dim)
//   x'_i     = x_i cos a - x_{i+h} sin a
//   x'_{i+h} = x_i sin a + x_{i+h} cos a
// The rotation is orthogonal, so the backward is the inverse rotation (angle -a):
//   dx_i     =  dy_i cos a + dy_{i+h} sin a
//   dx_{i+h} = -dy_i sin a + dy_{i+h} cos a
// cos and sin are computed once per (position, pair) in double and rounded to float, so
// the CPU and the GPU use the same table whatever their float libm does.

#include "runtime/kernels/host_device.h"

namespace dhelix::kernels {

/// cos and sin of pair `pair`'s angle at `position`; computed in double, rounded once.
DHELIX_HOST_DEVICE inline void rope_cos_sin(int64_t position, int64_t pair, int64_t head_dim,
                                            double base, float* cos_out, float* sin_out) {
  double inverse_frequency =
      pow(base, -2.0 * static_cast<double>(pair) / static_cast<double>(head_dim));
  double angle = static_cast<double>(position) * inverse_frequency;
  *cos_out = static_cast<float>(cos(angle));
  *sin_out = static_cast<float>(sin(angle));
}

/// Rotates one head vector x[head_dim] in place; cos_row and sin_row are the table row
/// of its position, each [head_dim / 2].
DHELIX_HOST_DEVICE inline void rope_forward_head(int64_t head_dim, const float* cos_row,
                                                 const float* sin_row, float* x) {
  int64_t half = head_dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    float first = x[i];
    float second = x[i + half];
    x[i] = first * cos_row[i] - second * sin_row[i];
    x[i + half] = first * sin_row[i] + second * cos_row[i];
  }
}

/// Gradient of rope_forward_head, in place: dy[head_dim] becomes dx (inverse rotation).
DHELIX_HOST_DEVICE inline void rope_backward_head(int64_t head_dim, const float* cos_row,
                                                  const float* sin_row, float* dy) {
  int64_t half = head_dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    float first = dy[i];
    float second = dy[i + half];
    dy[i] = first * cos_row[i] + second * sin_row[i];
    dy[i + half] = second * cos_row[i] - first * sin_row[i];
  }
}

}  // namespace dhelix::kernels
