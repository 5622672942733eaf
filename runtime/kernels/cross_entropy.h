#pragma once
// Softmax cross-entropy of one row of logits z[vocab] against a target index t:
//   m    = max_j z_j
//   lse  = m + log(sum_j exp(z_j - m))          (log-sum-exp, shifted for range)
//   loss = lse - z_t
// Backward, with g = dloss (e.g. 1 / tokens for a mean):
//   dz_j = g * (exp(z_j - lse) - [j == t])
// A negative target marks an ignored position (padding): loss 0, gradient 0.
//
// Vocabulary-parallel use (Megatron's VocabParallelCrossEntropy): each tensor-parallel
// rank holds columns [vocab_begin, vocab_begin + vocab_local). It computes its row max,
// the group all-reduces the max, each rank computes its sum of exp(z - max), the group
// all-reduces the sum, and the rank owning t supplies z_t. The pieces below are those
// steps; cross_entropy_forward_row composes them for one unsharded row.

#include "runtime/kernels/host_device.h"

namespace dhelix::kernels {

/// Largest of z[0, count); -inf for an empty row.
DHELIX_HOST_DEVICE inline float row_max(int64_t count, const float* z) {
  float m = -INFINITY;
  for (int64_t j = 0; j < count; ++j) m = max_float(m, z[j]);
  return m;
}

/// sum_j exp(z_j - shift) in the lane-tree order.
DHELIX_HOST_DEVICE inline float row_sum_exp(int64_t count, const float* z, float shift) {
  return lane_tree_sum(count, [z, shift](int64_t j) { return expf(z[j] - shift); });
}

/// Forward of one unsharded row: returns the loss and writes the row's log-sum-exp
/// (saved for the backward). A negative target gives loss 0 (lse is still written).
DHELIX_HOST_DEVICE inline float cross_entropy_forward_row(int64_t vocab, const float* z,
                                                          int64_t target, float* lse_out) {
  float m = row_max(vocab, z);
  float lse = m + logf(row_sum_exp(vocab, z, m));
  *lse_out = lse;
  return target < 0 ? 0.0f : lse - z[target];
}

/// Backward of one (possibly sharded) row: dz[vocab_local] for the logits' columns
/// [vocab_begin, vocab_begin + vocab_local), from the row's global lse, the global target
/// index and dloss. Ignored rows (target < 0) get zeros.
DHELIX_HOST_DEVICE inline void cross_entropy_backward_row(int64_t vocab_local, int64_t vocab_begin,
                                                          const float* z, int64_t target, float lse,
                                                          float dloss, float* dz) {
  if (target < 0) {
    for (int64_t j = 0; j < vocab_local; ++j) dz[j] = 0.0f;
    return;
  }
  for (int64_t j = 0; j < vocab_local; ++j) {
    float one_hot = (vocab_begin + j == target) ? 1.0f : 0.0f;
    dz[j] = dloss * (expf(z[j] - lse) - one_hot);
  }
}

}  // namespace dhelix::kernels
