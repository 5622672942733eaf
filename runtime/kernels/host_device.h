#pragma once
// What every kernel header shares: the host/device marker and the one reduction order.
//
// The kernel math in runtime/kernels/ is written once, as plain functions over one row,
// one element or one tile. The CPU backend (runtime/cpu/) loops over them; the CUDA
// backend calls the same functions from its threads. Nothing here allocates, throws or
// touches a global, so a function is legal in both worlds.
//
// Determinism: every sum below has one fixed order that depends only on the data's
// shape, never on a thread count or a schedule. dhelix-run --verify compares the
// strand-interleaved schedule with the sequential one bitwise, which only works when the
// same kernel on the same input always produces the same bits.

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define DHELIX_HOST_DEVICE __host__ __device__
#else
#define DHELIX_HOST_DEVICE
#endif

namespace dhelix::kernels {

/// Lanes of a row reduction: the width of a CUDA warp. A long row is summed as 32
/// strided partial sums (lane l adds elements l, l+32, l+64, ... in ascending order),
/// then combined by a halving tree (offset 16, 8, 4, 2, 1). A warp that reduces with
/// xor shuffles combines the same pairs in the same order, so a warp-per-row CUDA
/// kernel can reproduce the CPU's bits exactly.
inline constexpr int kReduceLanes = 32;

/// Sum of term(i) for i in [0, count) in the lane-tree order above. term is any
/// callable float(int64_t). count may be 0 (returns 0).
template <class Term>
DHELIX_HOST_DEVICE inline float lane_tree_sum(int64_t count, Term term) {
  float partial[kReduceLanes];
  for (int lane = 0; lane < kReduceLanes; ++lane) partial[lane] = 0.0f;
  for (int64_t i = 0; i < count; ++i) partial[i % kReduceLanes] += term(i);
  for (int offset = kReduceLanes / 2; offset > 0; offset /= 2) {
    for (int lane = 0; lane < offset; ++lane) partial[lane] += partial[lane + offset];
  }
  return partial[0];
}

/// Dot product of two length-n vectors, summed left to right. Used where n is a head
/// dimension (64 to 256), which one thread owns in the CUDA kernels too.
DHELIX_HOST_DEVICE inline float dot_sequential(int64_t n, const float* a, const float* b) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

/// Larger of two floats (std::max is not a device function on every toolkit).
DHELIX_HOST_DEVICE inline float max_float(float a, float b) { return a > b ? a : b; }

}  // namespace dhelix::kernels
