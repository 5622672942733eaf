#include "runtime/cpu/ring_attention_cpu.h"

#include <algorithm>

#include "lib/error.h"
#include "runtime/kernels/context_parallel.h"

namespace dhelix::cpu {
namespace {

int64_t local_seq(const kernels::AttentionShape& shape, const RingStep& step) {
  DHELIX_CHECK(shape.seq == 2 * step.chunk && step.chunk > 0);
  return shape.seq;
}

}  // namespace

void RingForwardState::reset(const kernels::AttentionShape& shape) {
  rows.assign(static_cast<size_t>(shape.batch * shape.heads * shape.seq),
              kernels::OnlineSoftmaxState{});
  acc.assign(static_cast<size_t>(shape.batch * shape.seq * shape.heads * shape.head_dim), 0.0f);
}

void ring_attention_forward_step(const kernels::AttentionShape& shape, const RingStep& step,
                                 const float* q, const float* k, const float* v,
                                 RingForwardState& state) {
  const int64_t seq = local_seq(shape, step), c = step.chunk, d = shape.head_dim;
  const int64_t group = shape.heads / shape.kv_heads;
  const int64_t kv_stride = shape.kv_heads * d;
  const float scale = kernels::attention_scale(d);
  std::vector<float> scores(static_cast<size_t>(kernels::kAttentionTileKeys));
  for (int64_t b = 0; b < shape.batch; ++b) {
    for (int64_t h = 0; h < shape.heads; ++h) {
      const int64_t kv_head = h / group;
      for (int64_t i = 0; i < seq; ++i) {
        const int64_t position = kernels::cp_global_position(step.cp, step.rank, c, i);
        const int64_t row = ((b * seq + i) * shape.heads + h) * d;
        kernels::OnlineSoftmaxState& s =
            state.rows[static_cast<size_t>((b * shape.heads + h) * seq + i)];
        for (int64_t half = 0; half < 2; ++half) {
          const int64_t start = kernels::cp_chunk_start(step.cp, step.block_rank, c, half);
          const int64_t visible = kernels::visible_keys(position, start, c);
          const int64_t first_key = ((b * seq + half * c) * shape.kv_heads + kv_head) * d;
          for (int64_t t = 0; t < visible; t += kernels::kAttentionTileKeys) {
            const int64_t count = kernels::keys_in_tile(visible, t, kernels::kAttentionTileKeys);
            kernels::attention_forward_tile(d, q + row, scale, k + first_key + t * kv_stride,
                                            v + first_key + t * kv_stride, kv_stride, count,
                                            scores.data(), &s, state.acc.data() + row);
          }
        }
      }
    }
  }
}

void ring_attention_forward_finish(const kernels::AttentionShape& shape, RingForwardState& state,
                                   float* out, float* lse) {
  const int64_t seq = shape.seq, d = shape.head_dim;
  for (int64_t b = 0; b < shape.batch; ++b) {
    for (int64_t h = 0; h < shape.heads; ++h) {
      for (int64_t i = 0; i < seq; ++i) {
        const int64_t stat = (b * shape.heads + h) * seq + i;
        const int64_t row = ((b * seq + i) * shape.heads + h) * d;
        float* acc = state.acc.data() + row;
        lse[stat] =
            kernels::attention_forward_finish(d, state.rows[static_cast<size_t>(stat)], acc);
        std::copy(acc, acc + d, out + row);
      }
    }
  }
}

void ring_attention_backward_delta(const kernels::AttentionShape& shape, const float* out,
                                   const float* dout, float* delta) {
  const int64_t seq = shape.seq, d = shape.head_dim;
  for (int64_t b = 0; b < shape.batch; ++b) {
    for (int64_t h = 0; h < shape.heads; ++h) {
      for (int64_t i = 0; i < seq; ++i) {
        const int64_t row = ((b * seq + i) * shape.heads + h) * d;
        delta[(b * shape.heads + h) * seq + i] =
            kernels::attention_backward_delta(d, dout + row, out + row);
      }
    }
  }
}

void ring_attention_backward_step(const kernels::AttentionShape& shape, const RingStep& step,
                                  const float* q, const float* dout, const float* lse,
                                  const float* delta, const float* k, const float* v,
                                  float* dq_unscaled, float* dk_unscaled, float* dv) {
  const int64_t seq = local_seq(shape, step), c = step.chunk, d = shape.head_dim;
  const int64_t group = shape.heads / shape.kv_heads;
  const int64_t kv_stride = shape.kv_heads * d, q_stride = shape.heads * d;
  const float scale = kernels::attention_scale(d);
  for (int64_t b = 0; b < shape.batch; ++b) {
    // dq of the local queries from the visiting keys (ascending key position).
    for (int64_t h = 0; h < shape.heads; ++h) {
      const int64_t kv_head = h / group;
      for (int64_t i = 0; i < seq; ++i) {
        const int64_t position = kernels::cp_global_position(step.cp, step.rank, c, i);
        const int64_t row = ((b * seq + i) * shape.heads + h) * d;
        const int64_t stat = (b * shape.heads + h) * seq + i;
        for (int64_t half = 0; half < 2; ++half) {
          const int64_t start = kernels::cp_chunk_start(step.cp, step.block_rank, c, half);
          const int64_t visible = kernels::visible_keys(position, start, c);
          const int64_t first_key = ((b * seq + half * c) * shape.kv_heads + kv_head) * d;
          kernels::attention_backward_dq_tile(d, q + row, dout + row, lse[stat], delta[stat], scale,
                                              k + first_key, v + first_key, kv_stride, visible,
                                              dq_unscaled + row);
        }
      }
    }
    // dk, dv of the visiting keys from the local queries (heads, then position, ascending).
    for (int64_t kv_head = 0; kv_head < shape.kv_heads; ++kv_head) {
      for (int64_t j = 0; j < seq; ++j) {
        const int64_t key_position = kernels::cp_global_position(step.cp, step.block_rank, c, j);
        const int64_t key_row = ((b * seq + j) * shape.kv_heads + kv_head) * d;
        for (int64_t g = 0; g < group; ++g) {
          const int64_t h = kv_head * group + g;
          for (int64_t half = 0; half < 2; ++half) {
            const int64_t start = kernels::cp_chunk_start(step.cp, step.rank, c, half);
            const int64_t first = kernels::first_seeing_query(key_position, start, c);
            if (first == c) continue;  // no query of this chunk sees the key
            const int64_t local = half * c + first;
            const int64_t q_row = ((b * seq + local) * shape.heads + h) * d;
            const int64_t stat = (b * shape.heads + h) * seq + local;
            kernels::attention_backward_dkdv_tile(d, k + key_row, v + key_row, scale, q + q_row,
                                                  dout + q_row, q_stride, lse + stat, delta + stat,
                                                  c - first, dk_unscaled + key_row, dv + key_row);
          }
        }
      }
    }
  }
}

void ring_attention_scale(const kernels::AttentionShape& shape, int64_t count, float* values) {
  const float scale = kernels::attention_scale(shape.head_dim);
  for (int64_t i = 0; i < count; ++i) values[i] *= scale;
}

namespace {

// Applies `rotate` (rope_forward or rope_backward) to each chunk of each sequence at the
// chunk's first global position.
template <class Rotate>
void rope_cp(const RopeTable& table, int64_t batch, int64_t cp, int64_t rank, int64_t chunk,
             int64_t heads, float* x, Rotate rotate) {
  DHELIX_CHECK(table.positions >= 2 * cp * chunk);
  const int64_t row = heads * table.head_dim;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t half = 0; half < 2; ++half) {
      rotate(table, 1, chunk, heads, kernels::cp_chunk_start(cp, rank, chunk, half),
             x + (b * 2 * chunk + half * chunk) * row);
    }
  }
}

}  // namespace

void rope_forward_cp(const RopeTable& table, int64_t batch, int64_t cp, int64_t rank, int64_t chunk,
                     int64_t heads, float* x) {
  rope_cp(table, batch, cp, rank, chunk, heads, x, rope_forward);
}

void rope_backward_cp(const RopeTable& table, int64_t batch, int64_t cp, int64_t rank,
                      int64_t chunk, int64_t heads, float* dy) {
  rope_cp(table, batch, cp, rank, chunk, heads, dy, rope_backward);
}

}  // namespace dhelix::cpu
