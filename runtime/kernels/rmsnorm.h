#pragma once
// RMSNorm over one row of `dim` values (Zhang & Sennrich 2019; as in Llama):
//   r   = 1 / sqrt(mean_i(x_i^2) + eps)
//   y_i = g_i * x_i * r
// Backward, with u_i = g_i * dy_i:
//   dx_i = r * u_i - x_i * r^3 / dim * sum_j(u_j * x_j)
//   dg_i = sum over rows of dy_i * x_i * r
// The forward saves r per row (rstd) so that the backward need not recompute it.

#include "runtime/kernels/host_device.h"

namespace dhelix::kernels {

/// Forward of one row: y[dim] from x[dim] and gain[dim]; returns r (saved as rstd).
/// y may alias x.
DHELIX_HOST_DEVICE inline float rmsnorm_forward_row(int64_t dim, const float* x, const float* gain,
                                                    float eps, float* y) {
  float sum_squares = lane_tree_sum(dim, [x](int64_t i) { return x[i] * x[i]; });
  float rstd = 1.0f / sqrtf(sum_squares / static_cast<float>(dim) + eps);
  for (int64_t i = 0; i < dim; ++i) y[i] = gain[i] * (x[i] * rstd);
  return rstd;
}

/// Input gradient of one row: dx[dim] from x, gain, the row's saved rstd and dy.
/// dx may alias dy.
DHELIX_HOST_DEVICE inline void rmsnorm_backward_row(int64_t dim, const float* x, const float* gain,
                                                    float rstd, const float* dy, float* dx) {
  float projection =
      lane_tree_sum(dim, [x, gain, dy](int64_t i) { return gain[i] * dy[i] * x[i]; });
  float coefficient = rstd * rstd * rstd * projection / static_cast<float>(dim);
  for (int64_t i = 0; i < dim; ++i) dx[i] = rstd * (gain[i] * dy[i]) - x[i] * coefficient;
}

/// Adds one row's contribution to the gain gradient: dgain[i] += dy[i] * x[i] * rstd.
/// Calling it for rows 0, 1, 2, ... in order gives every dgain[i] the same sequence of
/// additions as rmsnorm_dgain_column, so the CPU's row loop and a CUDA column-per-thread
/// kernel agree bit for bit and neither needs atomics.
DHELIX_HOST_DEVICE inline void rmsnorm_dgain_accumulate_row(int64_t dim, const float* x, float rstd,
                                                            const float* dy, float* dgain) {
  for (int64_t i = 0; i < dim; ++i) dgain[i] += dy[i] * (x[i] * rstd);
}

/// The gain gradient of one column `col`, accumulated over rows in ascending order onto
/// `initial` (the existing gradient, for accumulation across micro-batches). x and dy are
/// [rows, dim] row-major; rstd is [rows].
DHELIX_HOST_DEVICE inline float rmsnorm_dgain_column(int64_t rows, int64_t dim, int64_t col,
                                                     const float* x, const float* rstd,
                                                     const float* dy, float initial) {
  float sum = initial;
  for (int64_t r = 0; r < rows; ++r) sum += dy[r * dim + col] * (x[r * dim + col] * rstd[r]);
  return sum;
}

}  // namespace dhelix::kernels
