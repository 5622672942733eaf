#pragma once
// Causal self-attention with grouped-query heads (GQA), flash style (Dao et al. 2022,
// "FlashAttention"; FlashAttention-2 for the backward), for one query row at a time.
//
// Layout (AttentionShape): q, out, dq are [batch, seq, heads, head_dim]; k, v, dk, dv are
// [batch, seq, kv_heads, head_dim]; lse and delta are [batch, heads, seq]. Query head h
// reads kv head h / (heads / kv_heads). With scale = 1 / sqrt(head_dim), query row i sees
// keys j <= i:
//   s_j = scale * q_i . k_j,   p_j = exp(s_j - lse_i),   lse_i = log sum_{j<=i} exp(s_j)
//   out_i = sum_j p_j v_j
// Forward: the keys are visited in tiles of `tile_keys`. A running max m and running sum l
// are kept; each tile rescales the accumulator by exp(m_old - m_new) (online softmax), so
// the full score row is never stored. Only lse_i is saved for the backward. Different
// tile sizes round differently (agree to ~1e-6); the same tile size gives the same bits.
//
// Backward, with delta_i = dout_i . out_i:
//   dp_j = dout_i . v_j,   ds_j = p_j (dp_j - delta_i)
//   dq_i = scale * sum_j ds_j k_j            (one pass over query rows)
//   dk_j = scale * sum_{h in group} sum_{i>=j} ds_ij q_i,   dv_j = sum sum p_ij dout_i
// FlashAttention-2 parallelises over key tiles and adds dq with atomics, which makes the
// sum order depend on timing. Here dq and (dk, dv) are two passes, each owning its
// outputs: a dq pass over query rows and a dk/dv pass over key rows, each visiting its
// partners in ascending order. The probabilities are recomputed in both passes with the
// same expression, so both see the same bits. The backward has no rescaling, so its
// result does not depend on any tile size.

#include "runtime/kernels/host_device.h"

namespace dhelix::kernels {

/// Sizes of one attention call; layouts as in the header comment.
struct AttentionShape {
  int64_t batch = 0;     ///< sequences
  int64_t seq = 0;       ///< tokens per sequence (queries and keys)
  int64_t heads = 0;     ///< query heads
  int64_t kv_heads = 0;  ///< key/value heads; divides heads
  int64_t head_dim = 0;  ///< elements per head vector
};

/// Default number of keys per forward tile (the CUDA kernel's shared-memory tile width).
inline constexpr int64_t kAttentionTileKeys = 64;

/// Running state of one query row's online softmax.
struct OnlineSoftmaxState {
  float max_score = -INFINITY;  ///< largest scaled score seen so far
  float sum_exp = 0.0f;         ///< sum of exp(s - max_score) over keys seen so far
};

/// 1 / sqrt(head_dim), the score scale.
DHELIX_HOST_DEVICE inline float attention_scale(int64_t head_dim) {
  return 1.0f / sqrtf(static_cast<float>(head_dim));
}

/// Folds `count` >= 1 keys of one tile into a query row's state and accumulator.
/// k_tile and v_tile point at the tile's first key and value; consecutive keys are
/// kv_stride floats apart. scores is scratch of at least count floats. acc[head_dim]
/// holds the unnormalised output sum_j exp(s_j - max_score) v_j.
DHELIX_HOST_DEVICE inline void attention_forward_tile(int64_t head_dim, const float* q, float scale,
                                                      const float* k_tile, const float* v_tile,
                                                      int64_t kv_stride, int64_t count,
                                                      float* scores, OnlineSoftmaxState* state,
                                                      float* acc) {
  float tile_max = -INFINITY;
  for (int64_t j = 0; j < count; ++j) {
    scores[j] = scale * dot_sequential(head_dim, q, k_tile + j * kv_stride);
    tile_max = max_float(tile_max, scores[j]);
  }
  float new_max = max_float(state->max_score, tile_max);
  float correction = expf(state->max_score - new_max);  // 0 on the first tile
  for (int64_t d = 0; d < head_dim; ++d) acc[d] *= correction;
  float tile_sum = 0.0f;
  for (int64_t j = 0; j < count; ++j) {
    float p = expf(scores[j] - new_max);
    tile_sum += p;
    const float* v = v_tile + j * kv_stride;
    for (int64_t d = 0; d < head_dim; ++d) acc[d] += p * v[d];
  }
  state->sum_exp = state->sum_exp * correction + tile_sum;
  state->max_score = new_max;
}

/// Normalises the accumulator in place into the output row; returns the row's lse.
DHELIX_HOST_DEVICE inline float attention_forward_finish(int64_t head_dim,
                                                         const OnlineSoftmaxState& state,
                                                         float* acc) {
  float inverse_sum = 1.0f / state.sum_exp;
  for (int64_t d = 0; d < head_dim; ++d) acc[d] *= inverse_sum;
  return state.max_score + logf(state.sum_exp);
}

/// Forward of one query row over keys [0, key_count) (key_count = position + 1 for
/// causal attention) in tiles of tile_keys; writes out[head_dim], returns lse.
/// scores is scratch of tile_keys floats.
DHELIX_HOST_DEVICE inline float attention_forward_row(int64_t head_dim, const float* q,
                                                      const float* k, const float* v,
                                                      int64_t kv_stride, int64_t key_count,
                                                      int64_t tile_keys, float* scores,
                                                      float* out) {
  float scale = attention_scale(head_dim);
  OnlineSoftmaxState state;
  for (int64_t d = 0; d < head_dim; ++d) out[d] = 0.0f;
  for (int64_t start = 0; start < key_count; start += tile_keys) {
    int64_t count = key_count - start < tile_keys ? key_count - start : tile_keys;
    attention_forward_tile(head_dim, q, scale, k + start * kv_stride, v + start * kv_stride,
                           kv_stride, count, scores, &state, out);
  }
  return attention_forward_finish(head_dim, state, out);
}

/// delta_i = dout_i . out_i, the backward's per-row correction term.
DHELIX_HOST_DEVICE inline float attention_backward_delta(int64_t head_dim, const float* dout,
                                                         const float* out) {
  return dot_sequential(head_dim, dout, out);
}

/// p_ij recomputed from the saved lse; the one expression both backward passes use.
DHELIX_HOST_DEVICE inline float attention_probability(int64_t head_dim, const float* q,
                                                      const float* k, float scale, float lse) {
  return expf(scale * dot_sequential(head_dim, q, k) - lse);
}

/// Adds keys [0, count) of one tile into dq_unscaled[head_dim] (= dq / scale) for one
/// query row with saved lse and delta. Keys are kv_stride floats apart.
DHELIX_HOST_DEVICE inline void attention_backward_dq_tile(int64_t head_dim, const float* q,
                                                          const float* dout, float lse, float delta,
                                                          float scale, const float* k_tile,
                                                          const float* v_tile, int64_t kv_stride,
                                                          int64_t count, float* dq_unscaled) {
  for (int64_t j = 0; j < count; ++j) {
    const float* k = k_tile + j * kv_stride;
    float p = attention_probability(head_dim, q, k, scale, lse);
    float ds = p * (dot_sequential(head_dim, dout, v_tile + j * kv_stride) - delta);
    for (int64_t d = 0; d < head_dim; ++d) dq_unscaled[d] += ds * k[d];
  }
}

/// dq[head_dim] of one query row over keys [0, key_count), in ascending key order.
DHELIX_HOST_DEVICE inline void attention_backward_dq_row(int64_t head_dim, const float* q,
                                                         const float* dout, float lse, float delta,
                                                         const float* k, const float* v,
                                                         int64_t kv_stride, int64_t key_count,
                                                         float* dq) {
  float scale = attention_scale(head_dim);
  for (int64_t d = 0; d < head_dim; ++d) dq[d] = 0.0f;
  attention_backward_dq_tile(head_dim, q, dout, lse, delta, scale, k, v, kv_stride, key_count, dq);
  for (int64_t d = 0; d < head_dim; ++d) dq[d] *= scale;
}

/// Adds queries [0, count) of one tile, all of one query head, into dk_unscaled (= dk /
/// scale) and dv for one key row. q_tile and dout_tile are q_stride floats apart per
/// query; lse_tile and delta_tile are contiguous per query.
DHELIX_HOST_DEVICE inline void attention_backward_dkdv_tile(
    int64_t head_dim, const float* k, const float* v, float scale, const float* q_tile,
    const float* dout_tile, int64_t q_stride, const float* lse_tile, const float* delta_tile,
    int64_t count, float* dk_unscaled, float* dv) {
  for (int64_t i = 0; i < count; ++i) {
    const float* q = q_tile + i * q_stride;
    const float* dout = dout_tile + i * q_stride;
    float p = attention_probability(head_dim, q, k, scale, lse_tile[i]);
    float ds = p * (dot_sequential(head_dim, dout, v) - delta_tile[i]);
    for (int64_t d = 0; d < head_dim; ++d) {
      dv[d] += p * dout[d];
      dk_unscaled[d] += ds * q[d];
    }
  }
}

/// dk and dv [head_dim] of key row `key_position` of one sequence and kv head, summed
/// over the group's query heads (ascending) and, within a head, over query positions
/// key_position .. seq - 1 (ascending). q and dout point at position 0 of the group's
/// first query head; lse and delta at that head's row [seq]. Heads are head_dim floats
/// apart in q and dout and seq floats apart in lse and delta.
DHELIX_HOST_DEVICE inline void attention_backward_dkdv_row(
    int64_t head_dim, const float* k, const float* v, int64_t key_position, int64_t seq,
    int64_t group_heads, const float* q, const float* dout, int64_t q_stride, const float* lse,
    const float* delta, float* dk, float* dv) {
  float scale = attention_scale(head_dim);
  for (int64_t d = 0; d < head_dim; ++d) {
    dk[d] = 0.0f;
    dv[d] = 0.0f;
  }
  for (int64_t g = 0; g < group_heads; ++g) {
    int64_t first = key_position;
    attention_backward_dkdv_tile(head_dim, k, v, scale, q + g * head_dim + first * q_stride,
                                 dout + g * head_dim + first * q_stride, q_stride,
                                 lse + g * seq + first, delta + g * seq + first, seq - first, dk,
                                 dv);
  }
  for (int64_t d = 0; d < head_dim; ++d) dk[d] *= scale;
}

}  // namespace dhelix::kernels
